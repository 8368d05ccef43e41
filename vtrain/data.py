"""Data sets and the seeded randomness of a run (data order, initialisation, dropout masks).

Every random draw comes from a CPU torch.Generator keyed by (seed, step, site), so any device,
any thread count and a referee replaying a single step all draw the same numbers.

An example is a row of `x` (images and digits: flattened pixels on the grid, label in `y`) or,
for a text corpus, the window of `context` tokens starting at a position, whose targets are the
same window shifted by one token.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from vtrain.errors import VtrainError
from vtrain.grid import round_to_grid
from vtrain.leaves import keccak256


class DatasetError(VtrainError):
    """A data set is unknown, could not be loaded, or is too small for the spec."""


def keyed_generator(seed: int, step: int, site: str) -> torch.Generator:
    """A CPU generator whose stream depends only on (seed, step, site)."""
    digest = keccak256(b"vtrain.rng.v1" + struct.pack(">QQ", seed, step) + site.encode())
    g = torch.Generator(device="cpu")
    g.manual_seed(int.from_bytes(digest[:8], "big") & ((1 << 63) - 1))
    return g


@dataclass(frozen=True)
class Dataset:
    name: str
    x: torch.Tensor        # (n, features) in the work dtype on the grid; text: (tokens,) int64
    y: torch.Tensor        # (n,) int64 class labels; text: unused (empty)
    image_shape: tuple[int, int, int]   # (channels, height, width) for convolutional models
    num_classes: int       # classes; text: vocabulary size
    context: int = 0       # text: tokens per example window (0 for the other sets)

    @property
    def n(self) -> int:
        """Number of examples (text: window start positions)."""
        if self.context:
            return int(self.x.shape[0]) - self.context
        return int(self.x.shape[0])

    def batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of the examples `idx`: (B, features), (B,) or for text (B, T), (B, T)."""
        if not self.context:
            return self.x[idx], self.y[idx]
        windows = self.x[idx.unsqueeze(1) + torch.arange(self.context + 1)]  # (B, T + 1)
        return windows[:, :-1], windows[:, 1:]


def load_dataset(name: str, dtype: torch.dtype, *, path: str = "", context: int = 0, bits: int = 32,
                 data_hash: str = "") -> Dataset:
    """Load a data set in the work dtype; pixels that are not exact on the grid are rounded to `bits`.

    For data read from local files, a non-empty `data_hash` ("0x" + keccak-256 of the files' bytes)
    must match them: the spec, and so the commitment, then pins the data and not just its path.
    """
    if name == "digits":
        from sklearn.datasets import load_digits  # imported here: sklearn is slow to import

        d = load_digits()
        # pixels are integers 0..16, so k/16 is exact in every grid with >= 5 mantissa bits
        x = torch.from_numpy(d.data).to(torch.float64).div_(16.0).to(dtype)
        y = torch.from_numpy(d.target).to(torch.int64)
        return Dataset("digits", x, y, (1, 8, 8), 10)
    from vtrain.loaders import CIFAR_IMAGE, LoaderError, load_cifar10, load_text
    try:
        if name == "cifar10":
            pixels, y, digest = load_cifar10(path)
            _check_hash(path, digest, data_hash)
            # k/255 is not a grid value: round once, on the CPU, so every device sees the same pixels
            x = round_to_grid(pixels.to(torch.float64).div_(255.0), bits).to(dtype)
            return Dataset("cifar10", x, y, CIFAR_IMAGE, 10)
        if name == "text":
            tokens, vocab, digest = load_text(path)
            _check_hash(path, digest, data_hash)
            if tokens.numel() <= context + 1:
                raise DatasetError(f"{path}: {tokens.numel()} characters, fewer than context + 2 = {context + 2}")
            return Dataset("text", tokens, torch.empty(0, dtype=torch.int64), (0, 0, 0), len(vocab), context)
    except LoaderError as exc:
        raise DatasetError(str(exc)) from None
    raise DatasetError(f"unknown dataset {name!r}; available: digits, cifar10, text")


def _check_hash(path: str, digest: bytes, expected: str) -> None:
    found = "0x" + digest.hex()
    if expected and expected.lower() != found:
        raise DatasetError(f"{path}: the data hashes to {found} but the spec's data_hash is {expected}; this is "
                           "not the data the run was specified with (fetch the right files, or fix data_hash)")


def batch_indices(seed: int, step: int, batch_size: int, n: int) -> torch.Tensor:
    """Example indices of step `step` (1-based): epochs are seeded permutations, the tail dropped."""
    per_epoch = n // batch_size
    if per_epoch == 0:
        raise DatasetError(f"batch_size {batch_size} exceeds the {n} examples of the data set")
    epoch, k = divmod(step - 1, per_epoch)
    perm = torch.randperm(n, generator=keyed_generator(seed, epoch, "data"))
    return perm[k * batch_size:(k + 1) * batch_size]
