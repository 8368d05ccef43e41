"""Data sets and the seeded randomness of a run (data order, initialisation, dropout masks).

Every random draw comes from a CPU torch.Generator keyed by (seed, step, site), so any device,
any thread count and a referee replaying a single step all draw the same numbers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from vtrain.errors import VtrainError
from vtrain.leaves import keccak256


class DatasetError(VtrainError):
    """A data set is unknown or could not be loaded."""


def keyed_generator(seed: int, step: int, site: str) -> torch.Generator:
    """A CPU generator whose stream depends only on (seed, step, site)."""
    digest = keccak256(b"vtrain.rng.v1" + struct.pack(">QQ", seed, step) + site.encode())
    g = torch.Generator(device="cpu")
    g.manual_seed(int.from_bytes(digest[:8], "big") & ((1 << 63) - 1))
    return g


@dataclass(frozen=True)
class Dataset:
    name: str
    x: torch.Tensor        # (n, features) in the work dtype, on the grid
    y: torch.Tensor        # (n,) int64 class labels
    image_shape: tuple[int, int, int]   # (channels, height, width) for convolutional models
    num_classes: int

    @property
    def n(self) -> int:
        return int(self.x.shape[0])


def load_dataset(name: str, dtype: torch.dtype) -> Dataset:
    if name != "digits":
        raise DatasetError(f"unknown dataset {name!r}; available: digits")
    from sklearn.datasets import load_digits  # imported here: sklearn is slow to import

    d = load_digits()
    # pixels are integers 0..16, so k/16 is exact in every grid with >= 5 mantissa bits
    x = torch.from_numpy(d.data).to(torch.float64).div_(16.0).to(dtype)
    y = torch.from_numpy(d.target).to(torch.int64)
    return Dataset("digits", x, y, (1, 8, 8), 10)


def batch_indices(seed: int, step: int, batch_size: int, n: int) -> torch.Tensor:
    """Example indices of step `step` (1-based): epochs are seeded permutations, the tail dropped."""
    per_epoch = n // batch_size
    epoch, k = divmod(step - 1, per_epoch)
    perm = torch.randperm(n, generator=keyed_generator(seed, epoch, "data"))
    return perm[k * batch_size:(k + 1) * batch_size]
