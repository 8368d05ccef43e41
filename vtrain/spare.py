"""Spare output buffers for the rounding kernels: a device op's unrounded output, once rounded into a new
tensor, is kept and becomes the buffer the next output of its size is rounded into.

Why: a fresh CPU tensor of more than 32 MB (glibc's largest mmap threshold) is mapped anew on every
allocation, and first-touch page faults then cost ~0.5 ms a MB, more than rounding it (~0.25 ms a MB).
The trainer rounded each large device output out of place (it kept the unrounded values for the log and
the exact resolution), so without reuse it paid those faults once more per output than plain training:
12 ms a step on the 2048-wide MLP's weight gradient alone (its filter pass: 28 against 16 ms). It now
rounds most outputs in place, keeping the unrounded values at their candidates only
(vtrain.rounding.RoundedExecution._in_place); the rest (outputs beside others whose bounds may read
them, and outputs other tensors see) still come here, and so do a replay's. Buffers are kept per (dtype,
size), at most KEEP of them, and only for tensors nothing else references.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

KEEP = 4
MIN_BYTES = 1 << 20  # smaller tensors come from the allocator's free lists: nothing to save
_POOL: OrderedDict[tuple[torch.dtype, int], torch.Tensor] = OrderedDict()
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def take(like: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor of like's shape and dtype, for a contiguous CPU `like`: a kept buffer if one
    fits. (The small outputs of small models skip the pool at the cost of one comparison.)"""
    if like.numel() * like.element_size() < MIN_BYTES:
        return torch.empty_like(like)
    spare = _POOL.pop((like.dtype, like.numel()), None)
    return spare.view(like.shape) if spare is not None else torch.empty_like(like)


def sole(t: torch.Tensor) -> bool:
    """Whether t is a contiguous CPU tensor that alone sees its whole storage: no other tensor (a view of it,
    or the base it views) shares it, so a write through t or a reuse of its memory shows nowhere else."""
    if _use_count is None or not (t.is_cpu and t.is_contiguous()):
        return False
    storage = t.untyped_storage()
    # references to the storage: t's own and `storage` here; any more is someone else's
    return (_use_count(storage._cdata) == 2 and not t.storage_offset()
            and storage.nbytes() == t.numel() * t.element_size())


def give(t: torch.Tensor) -> None:
    """Keep t's memory for a later `take`. The caller must own t (an op's fresh output, not one of its
    inputs) and be done with it; t is kept only where it is `sole`, so nothing else can see the reuse."""
    if t.numel() * t.element_size() < MIN_BYTES or not sole(t):
        return
    key = (t.dtype, t.numel())
    _POOL.pop(key, None)
    _POOL[key] = t.detach()
    while len(_POOL) > KEEP:
        _POOL.popitem(last=False)
