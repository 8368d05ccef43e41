"""vtrain's own kernels on torch's OpenMP threads.

Torch runs a matmul or an addition on every thread it is given (`vtrain train --threads`, by default one a
core); the rounding passes of vtrain.fused and vtrain.fused_binary ran on one. At two threads GPT-2-tiny
d_model 256's plain float64 step went from 275 to 154 ms, the trainer's only from 384 to 323, and its rounded
elementwise products took 67 ms a step against torch's 30 (docs/benchmarks.md, session 37).

Parts of a pass run on a pool of Python threads (the kernels release the GIL) were no faster: after each of
its parallel ops, torch's OpenMP workers spin for a while waiting for the next one, so a thread of ours
shared a core with a spinning worker (81 against 67 ms a step for the products). Here the parts run on those
workers themselves: `run` hands a kernel to libgomp as the C compiler does for `#pragma omp parallel`, in the
libgomp that torch loaded, whose team is the one torch's ops use (a 1M-value product and rounding: 0.49 ms
on two threads, 0.90 on one; torch's own product 0.45).

Each kernel split here computes every output value from its own inputs (an Adam update, a rounding), or each
kept element's sum on one thread in its fixed order (the CPU device's line sums), so the parts' outputs are the
one pass's, bit for bit, for any number of parts (vtrain.omp_kernels gathers their candidates in order). No
sum is split: a run's results never depend on its thread count (tests/numerics/test_num_omp.py). Where torch
runs on another threading library, or one thread, every pass stays whole.

Passes that stream their operands from memory stay on one thread, measured not to gain: E at a matmul's
candidates and the column sums took as long or longer in two parts in GPT-2-tiny's steps (docs/benchmarks.md,
session 38). The pre-filter's norms did too while the parts went to whichever thread came first; with thread t on
part t (vtrain.omp_kernels), which reads the share of the operand it wrote itself, they run split (session 46).
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

import numpy as np
import torch

# Smaller passes stay whole. A part of 64K values takes ~40 us, about what waking the team costs; parts of
# 128K values at least keep that cost under a fifth of the gain.
MIN_VALUES = 1 << 17
ENABLED = True  # (tests compare the split kernels with the whole ones)


@functools.cache
def _libgomp() -> Any:
    """The libgomp torch loaded (ctypes), or None where torch's parallel backend is not OpenMP or its library is
    not GNU's."""
    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:  # (by soname, among the libraries already loaded: never a second OpenMP runtime)
        lib = ctypes.CDLL("libgomp.so.1", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        lib.GOMP_parallel  # noqa: B018 (GCC 4.9 on: an older libgomp lacks it)
    except (OSError, AttributeError):
        return None
    return lib


def parallel_address() -> int | None:
    """The address of GOMP_parallel in the libgomp torch loaded (`_libgomp`), which `run` calls, or None."""
    lib = _libgomp()
    return None if lib is None else ctypes.cast(lib.GOMP_parallel, ctypes.c_void_p).value


def thread_number() -> int | None:
    """The address of omp_get_thread_num in the libgomp whose GOMP_parallel `run` calls (its team's numbering), or
    None without one."""
    lib = _libgomp()
    return None if lib is None else ctypes.cast(lib.omp_get_thread_num, ctypes.c_void_p).value


def parts(size: int, least: int | None = None) -> int:
    """In how many parts a pass over `size` values runs: torch's thread count, fewer where a part would hold
    under `least` of them (MIN_VALUES if None), 1 where torch's threads are not libgomp's."""
    least = MIN_VALUES if least is None else least
    if not ENABLED or size < 2 * least:
        return 1
    n = min(torch.get_num_threads(), size // least)
    return n if n > 1 and _libgomp() is not None else 1


def kernels() -> Any:
    """vtrain.omp_kernels, imported on the first pass that splits: numba compiles or loads its C callbacks then,
    not in every process that imports vtrain."""
    from vtrain import omp_kernels  # noqa: PLC0415

    return omp_kernels


def run(kernel: int, block: np.ndarray, threads: int) -> None:
    """Run the C function at address `kernel` on `threads` threads of torch's OpenMP team, each given the
    int64 array `block` (from block[0] on, one a part, the flags of the parts taken: set to 0 here), and return
    once all are done. Without libgomp (`parts` then never splits a pass, but a test may ask for parts), this
    thread alone runs it: the function takes every part in turn. (One compiled call, vtrain.omp_kernels.launch:
    through ctypes, the block's address and the call took ~5 us of Python a pass, and a training step splits
    ~250 passes.)"""
    kernels().launch(kernel, block, threads)
