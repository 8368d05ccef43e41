"""Readers for data sets kept in local files: CIFAR-10 python batches and plain-text corpora.

Both return plain tensors; vtrain.data turns them into a Dataset. Neither reader executes code
from the file: the CIFAR-10 batches are pickles, so they are read with an unpickler that only
rebuilds the numpy arrays, lists, bytes and dicts that the format holds.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
import torch

from vtrain.errors import VtrainError
from vtrain.leaves import keccak256

CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_IMAGE = (3, 32, 32)


class LoaderError(VtrainError):
    """A local data file is missing, unreadable or not in the expected format."""


class _NumpyOnlyUnpickler(pickle.Unpickler):
    # the python batches hold a dict of bytes keys, a uint8 array and lists: nothing else may load
    _ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
                ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str):  # noqa: ANN201 (pickle's signature)
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"forbidden global {module}.{name}")
        return super().find_class(module, name)


def _read_cifar_batch(path: Path, raw: bytes) -> tuple[np.ndarray, np.ndarray]:
    fix = "download the CIFAR-10 python version (cifar-10-python.tar.gz) and give its extracted directory"
    try:
        d = _NumpyOnlyUnpickler(io.BytesIO(raw), encoding="bytes").load()
        data = np.asarray(d[b"data"], dtype=np.uint8)
        labels = np.asarray(d[b"labels"], dtype=np.int64)
    except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as exc:
        raise LoaderError(f"{path}: not a CIFAR-10 python batch ({exc}); {fix}") from None
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels.shape != (data.shape[0],):
        raise LoaderError(f"{path}: data of shape {data.shape} with {labels.shape} labels; a CIFAR-10 batch "
                          f"holds (N, 3072) uint8 pixels and N labels; {fix}")
    if labels.size and (labels.min() < 0 or labels.max() > 9):
        raise LoaderError(f"{path}: labels outside 0..9; {fix}")
    return data, labels


def load_cifar10(directory: str | Path) -> tuple[torch.Tensor, torch.Tensor, bytes]:
    """The 50,000 training images of CIFAR-10 as (uint8 pixels (N, 3072) channel-major, int64 labels,
    keccak-256 of the five batch files' bytes in order)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise LoaderError(f"{directory}: not a directory; data_path must be the extracted cifar-10-batches-py")
    raws = []
    for name in CIFAR_TRAIN_FILES:
        try:
            raws.append((directory / name).read_bytes())
        except FileNotFoundError:
            raise LoaderError(f"{directory / name}: missing CIFAR-10 batch; give the extracted cifar-10-batches-py "
                              "directory of the python version (cifar-10-python.tar.gz)") from None
    parts = [_read_cifar_batch(directory / name, raw) for name, raw in zip(CIFAR_TRAIN_FILES, raws)]
    x = torch.from_numpy(np.concatenate([p[0] for p in parts]))
    y = torch.from_numpy(np.concatenate([p[1] for p in parts]))
    return x, y, keccak256(b"".join(raws))


def load_text(path: str | Path) -> tuple[torch.Tensor, list[str], bytes]:
    """A UTF-8 corpus as character tokens (int64), its vocabulary (sorted distinct characters) and
    the keccak-256 of the file's bytes."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise LoaderError(f"{path}: text corpus not found; data_path must be a local UTF-8 file") from None
    except UnicodeDecodeError as exc:
        raise LoaderError(f"{path}: not UTF-8 ({exc}); convert the corpus to UTF-8") from None
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    tokens = torch.tensor([index[c] for c in text], dtype=torch.int64)
    return tokens, vocab, keccak256(raw)
