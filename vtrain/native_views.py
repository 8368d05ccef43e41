"""View ops past the dispatch modes while a rounded execution runs.

A TorchDispatchMode sees every op, views too: torch calls into Python for each one (~8-10 us a call on the 2-core
CI machine, against ~2 us natively), and the rounded execution hands a view straight back (vtrain.ops class 1: it
computes no value, so nothing is rounded, counted or checked). GPT-2-tiny at d_model 256 makes ~190 such calls a
step. While a rounded execution runs, fallthrough kernels at torch's Python dispatch key send the views below
(`VIEWS`) on to their own kernels instead, as if no mode were active: the same tensors, up to ~0.6 % of that step's
time, 1-3 % of a small model's (docs/benchmarks.md, session 45).

The kernels are registered when the first rounded execution in the process enters and removed when the last one
leaves, or for a whole run's steps (`held`): while they stand, every mode and tensor subclass misses these ops, so
outside rounded execution and those loops none does (another dispatch mode, a subclass, torch.compile's fake
tensors). Only views whose kernels stay below the Python key are listed: `t` and `transpose` call `as_strided`,
which is listed too; `split` and `chunk` call `narrow` (outside vtrain.ops' table), and `detach` reaches the modes
whatever is registered, so they keep the modes' path. (A kernel that other code registered at that key for one of
these ops is overridden meanwhile, with torch's warning, and back when the last execution leaves.)
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch

VIEWS = ("view", "_unsafe_view", "expand", "t", "transpose.int", "as_strided")

_lock = threading.Lock()
_users = 0
_library: torch.library.Library | None = None


def acquire() -> None:
    """One more rounded execution running: the fallthrough kernels stand from the first one on (~65 us)."""
    global _users, _library
    with _lock:
        _users += 1
        if _users == 1:
            _library = torch.library.Library("aten", "IMPL")
            for op in VIEWS:
                _library.impl(op, torch.library.fallthrough_kernel, "Python")


def release() -> None:
    """One rounded execution fewer: the last one removes the kernels."""
    global _users, _library
    with _lock:
        _users -= 1
        if _users == 0 and _library is not None:
            _library._destroy()
            _library = None


@contextlib.contextmanager
def held() -> Iterator[None]:
    """The kernels stand for the whole block: a run's or an audit's steps, with what they call between steps (a
    caller's `progress` callback too: a dispatch mode or tensor subclass entered there would miss these views).
    Each step's rounded execution then only counts itself in; registering and removing the kernels every step took
    ~70 us of a ~1.1 ms step of the logistic-regression example (7 %), 3 % of the MLP's."""
    acquire()
    try:
        yield
    finally:
        release()


def active() -> bool:
    """Whether the fallthrough kernels stand now."""
    return _library is not None


class ViewsPastModes:
    """A mixin for a dispatch mode (before TorchDispatchMode in its bases) that holds the fallthrough kernels while
    it runs: `acquire` on entering, `release` on leaving, and on an entry that fails."""

    def __enter__(self) -> Any:
        acquire()
        try:
            return super().__enter__()
        except BaseException:
            release()
            raise

    def __exit__(self, *exc: Any) -> Any:
        try:
            return super().__exit__(*exc)
        finally:
            release()
