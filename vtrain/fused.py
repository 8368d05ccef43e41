"""Fused CPU kernels for the rounding hot path: one pass over an op's output instead of several torch passes.

Every op output of a rounded step is rounded to the grid, and every device-dependent output is also
filtered for values near a rounding boundary (vtrain.rounding). In torch that is a float32 round trip and
a range check (three passes and two buffers) for each output, plus about ten more elementwise passes for
the filter; on a small step each pass also pays torch's per-call cost. These numba kernels do the same in
one pass, on CPU tensors only (other devices keep the torch path in vtrain.grid and vtrain.rounding).

They compute the same values with the same IEEE operations as the torch path, so nothing downstream can
tell them apart: tests/numerics/test_num_fused.py checks the rounding bit for bit against
`vtrain.grid.round_unchecked`, and the candidate sets against `RoundedExecution._candidates`. Rounding:
at bits = 32 on float64 the hardware cast to float32 (RNE from the float64 value, subnormals included);
otherwise x / q (a product by 2^-k, for the spacing q = 2^k at x) rounded half-to-even and scaled back by q, all
exact (float32 values in float64, and back). A value that
is NaN, infinite or beyond the grid makes a kernel report its position; the caller then takes the torch
path, which raises the error that names it (or, in the exact resolution, settles such elements exactly).

The error-bound kernels at the end do the elementwise part of a few bounds of vtrain.bounds in one pass,
for the same reason (tests/numerics/test_num_bounds.py compares them with the torch expressions bit for bit).

Every kernel here and in vtrain.fused_optim compiles with numba's numpy error model: a float division by
zero gives IEEE's inf or NaN, as torch's does (the callers flag it), instead of raising ZeroDivisionError,
whose test on every divisor stops LLVM from vectorising a loop (the fused Adam update ran 4x slower).

numba compiles each kernel on first use per dtype (about a second) and caches the machine code beside
this file, so later processes load it in milliseconds.
"""

from __future__ import annotations


import math
from typing import Any, Callable

import numpy as np
import torch
from numba import njit, types
from numba.extending import overload
from torch.utils._mode_utils import no_dispatch

from vtrain import omp
from vtrain.grid import round_to_grid
from vtrain.numba_cache import name_files_by_key

name_files_by_key()  # (before any kernel here compiles: see vtrain.numba_cache)

MIN_NORMAL = 2.0**-126
ENABLED = True  # tests turn it off to compare against the torch path

# Binary exponents E of grid values, clamped below at -126, where the grid turns uniform
_EMIN, _EMAX = -126, 127


def usable(t: torch.Tensor) -> bool:
    """Whether the kernels can take `t` (a contiguous float64/float32 CPU tensor)."""
    return ENABLED and t.is_cpu and (t.dtype is torch.float64 or t.dtype is torch.float32) and t.is_contiguous()


def usable64(t: torch.Tensor) -> bool:
    """Whether the kernels of float64 work at bits = 32 (vtrain.fused_gelu, vtrain.fused_norms) can take `t`."""
    return t.dtype is torch.float64 and usable(t)


# The model families' fused elementwise chains, as vtrain.omp_kernels' one callback tells them apart
CHAIN_GELU, CHAIN_NORM = 0, 1


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def off_grid(v: float, limit: float) -> int:
    """1 where a rounded value is off the grid (NaN, infinite or beyond `limit`), else 0: summed in a loop that
    vectorises."""
    return not abs(v) <= limit


def run_chain(rx: Any, kind: int, kernel: Callable[..., int], code: int, ops: int, like: torch.Tensor,
              inputs: list[torch.Tensor], outputs: int, width: int = 1, period: int = 1,
              count: int = 1) -> list[torch.Tensor] | None:
    """`outputs` fresh tensors of `like`'s shape from pass `code` of a fused chain (`kind`; `kernel`: its passes,
    called kernel(code, four inputs, two outputs, first row, end row, width, period, count, limit)) over rows
    of `width` values (a norm's: row r's statistics number r % period, each over `count` values), counted in the
    RoundedExecution rx as the `ops` elementwise ops the pass stands for; None outside rounded execution (rx None),
    off float64 work at bits = 32, where a tensor is not one the kernels take, or where a value left the grid
    (nothing counted: the caller dispatches those ops). In parts on torch's threads where the pass is large
    (vtrain.omp)."""
    if rx is None or rx.bits != 32 or not all(usable64(t) for t in (like, *inputs)):
        return None
    with no_dispatch():  # (the new tensors and the numpy views are no ops of the step)
        outs = [torch.empty_like(like) for _ in range(outputs)]
        ins, arrays = [flat(t) for t in inputs], [flat(t) for t in outs]
    ins += ins[:1] * (4 - len(ins))  # (the inputs and outputs a pass does not read: any array)
    arrays += arrays[:1] * (2 - len(arrays))
    rows = like.numel() // width
    parts = omp.parts(like.numel())
    if parts > 1:
        nbad = omp.kernels().chain(kind, parts, code, *ins, *arrays, rows, width, period, count, rx._limit)
    else:
        nbad = kernel(code, *ins, *arrays, 0, rows, width, period, count, rx._limit)
    if nbad:
        return None
    rx.count_rounded(ops * like.numel(), ops)
    return outs


def recomputed(bits: int | None, op: Callable, a: torch.Tensor, b: float | torch.Tensor) -> torch.Tensor:
    """op(a, b), a value the step computed before, computed again outside it (no dispatch mode sees the op, nothing
    is counted) and rounded to the grid of `bits` as the step rounded it (None, outside rounded execution: not
    rounded). For the fused passes' dispatched fallbacks, which read values the passes keep no copy of."""
    with no_dispatch():
        v = op(a, b)
        return v if bits is None else round_to_grid(v, bits)


def flat(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a contiguous CPU tensor's elements (shared memory)."""
    return (t.detach() if t.requires_grad else t).numpy().reshape(-1)


def span(size: tuple[int, ...], stride: tuple[int, ...]) -> int:
    """How many values a non-empty tensor of this layout reaches in memory, from its first to its last (torch's
    strides are non-negative; an expanded dim's stride 0 adds nothing)."""
    return 1 + sum((d - 1) * s for d, s in zip(size, stride))


def memory(t: torch.Tensor, count: int) -> np.ndarray:
    """`count` values of t's storage from t's first value on, as a flat numpy view (no copy): a strided or
    broadcast tensor's memory for the kernels that step through it themselves."""
    return torch.as_strided(t.detach(), (count,), (1,), t.storage_offset()).numpy()


def contiguous_lines(m: np.ndarray) -> tuple[np.ndarray, bool]:
    """A 2-d array C-contiguous without a copy where it can be: (m, False), or (m.T, True) where the transpose
    is the contiguous one, else (a contiguous copy, False)."""
    if m.flags.c_contiguous:
        return m, False
    if m.T.flags.c_contiguous:
        return m.T, True
    return np.ascontiguousarray(m), False


def _layout(a: np.ndarray) -> tuple[np.ndarray, int, int, int]:
    """(integer view, explicit mantissa bits, exponent field mask, exponent bias) of a float array."""
    if a.dtype == np.float64:
        return a.view(np.int64), 52, 0x7FF, 1023
    return a.view(np.int32), 23, 0xFF, 127


def round_into(v: np.ndarray, out: np.ndarray, m: int, limit: float) -> int:
    """out = v rounded onto the grid with m mantissa bits (out another array: `round_in_place` for v itself).
    Returns the first position whose value is NaN, infinite or rounds beyond `limit` (the largest grid
    value), or -1."""
    parts = omp.parts(v.size) if v.dtype == np.float64 else 1
    if parts > 1:
        return omp.kernels().round_float64(parts, v, out, m, limit)
    vi, mant, emask, bias = _layout(v)
    return _round_into(v, vi, mant, emask, bias, out, m, m == 23 and v.dtype == np.float64, limit)


def round_in_place(v: np.ndarray, m: int, limit: float) -> int:
    """`round_into(v, v, m, limit)`, in a kernel of its own (see `_round_in_place`), except that a value whose
    rounding is off the grid stays as it was, so that the error can name it."""
    parts = omp.parts(v.size) if v.dtype == np.float64 else 1
    if parts > 1:
        return omp.kernels().round_float64(parts, v, None, m, limit)
    return _round_in_place(v, m, m == 23 and v.dtype == np.float64, limit)


def round_near(v: np.ndarray, e: np.ndarray, factor: float, m: int, limit: float, out: np.ndarray,
               cand: np.ndarray, held: np.ndarray, plus: float = -0.0) -> tuple[int, int]:
    """out = v rounded (as round_into) + plus; cand[:count] = the positions where |v - r| + factor * e >= half
    the grid spacing below r (e has v's size, or one element for all), and held[:count] = v's values there.
    Returns (count, first bad position or -1). plus = -0.0 changes nothing; +0.0 turns -0.0 into +0.0 (the
    exact resolution's one zero).

    out may be v itself: the trainer rounds a fresh output in place (`RoundedExecution._fused_near`), since
    nothing reads v afterwards but at the candidates, whose values `held` keeps. A value that rounds off
    the grid stays in out as it was (a NaN quieted, as `round_in_place` leaves it), so that the error can name
    it; the candidates then mean nothing (the callers drop them).

    The test is `RoundedExecution._candidates`: a superset of the values within factor * e of a rounding
    boundary, since the nearest boundary is at least half the spacing below r away from r."""
    if m == 23 and v.dtype == np.float64:
        parts = omp.parts(v.size)
        if parts > 1:
            return omp.kernels().round_near32(parts, v, e, out, cand, held, factor, limit, plus)
        return _round_near32(v, e, factor, limit, out, cand, held, plus)
    return _round_near(v, e, factor, m, limit, out, cand, held, plus)


def round_near_relative(v: np.ndarray, k: float, a: float, c: float, f: float, factor: float, limit: float,
                        out: np.ndarray, cand: np.ndarray, held: np.ndarray, plus: float = -0.0) -> tuple[int, int]:
    """`round_near` for float64 work at bits = 32 with the band e = ((k |v|) + a) c + f computed as it goes (a
    transcendental function's, vtrain.bounds.RELATIVE: on GPT-2's 1M-value tanh, E in torch wrote a tensor as
    large as the output in four passes)."""
    parts = omp.parts(v.size)
    if parts > 1:
        return omp.kernels().round_near32(parts, v, None, out, cand, held, factor, limit, plus, (k, a, c, f))
    return _round_near32_relative(v, k, a, c, f, factor, limit, out, cand, held, plus)


def relative_at(held: np.ndarray, k: float, a: float, c: float, f: float) -> np.ndarray:
    """The band e of `round_near_relative` at values `held` (its candidates'): the same operations in the
    same order."""
    return ((k * np.abs(held)) + a) * c + f


_NO_SUPPORT = np.zeros((0, 0, 0), dtype=np.uint64)


def round_near_outer(v: np.ndarray, rows: np.ndarray, cols: np.ndarray, add: np.ndarray, factor: float,
                     limit: float, out: np.ndarray, cand: np.ndarray, held: np.ndarray, plus: float = -0.0,
                     support: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[int, int]:
    """`round_near` for float64 work at bits = 32 with the band e = rows[n, i] * cols[n, j] + add[n, j] over
    v of shape (B, M, N), flat (float64 rows (B, M), cols and add (B, N)), computed as it goes. With
    `support` (bitsets of the nonzeros of a's rows and b's columns, vtrain.prefilter), a candidate whose
    value is an exact zero with no nonzero product (a_ik b_kj with both factors nonzero) is dropped: its E is
    k floor units (k 2^-1022, vtrain.bounds._floor_unit), within no band of a boundary."""
    sa, sb = support if support is not None else (_NO_SUPPORT, _NO_SUPPORT)
    parts = omp.parts(v.size)
    if parts > 1 and all(x.flags.c_contiguous for x in (rows, cols, add, sa, sb)):
        return omp.kernels().round_near32_outer(parts, v, rows, cols, add, factor, limit, out, cand, held, plus, sa, sb)
    return _round_near32_outer(v, rows, cols, add, factor, limit, out, cand, held, plus, sa, sb)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _exponent(bits: int, mant: int, emask: int, bias: int) -> int:
    """The binary exponent of a float from its integer bits, clamped below at -126 (0 and subnormals too)."""
    return max(((bits >> mant) & emask) - bias, _EMIN)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _power_of_two(k: int) -> float:
    """2^k for -1022 <= k <= 1023, from its bits: no table lookup, which LLVM would have to gather."""
    return np.int64((k + 1023) << 52).view(np.float64)


def _to_multiple(x: float, k: int) -> float:
    """x rounded to the nearest multiple of 2^k, ties to even (-149 <= k <= 127), in x's type (`_to_multiple_typed`
    compiles each type's own): exact, since 2^k is a power of two."""
    q = 2.0**k
    return np.rint(x / q) * q


@overload(_to_multiple, inline="always")
def _to_multiple_typed(x, k):  # noqa: ANN001, ANN202, ARG001 (numba's overload protocol, as fused_binary._item_at)
    # A product for the quotient, and powers from their bits: with a table's lookups (gathers) LLVM kept grid
    # rounding's loops scalar, 2.0 against 0.6 ns a value for float32 work's outputs at bits = 19, and float32
    # work's Adam update ran 6x slower. Float32 x in float64 (2^-k can exceed float32's range), and the result,
    # a float32 (or inf where x rounds to 2^128), back in float32, so that float32 arithmetic stays float32
    # after it (float32 work's optimizer kernels).
    if x == types.float32:
        return lambda x, k: np.float32(np.rint(np.float64(x) * _power_of_two(-k)) * _power_of_two(k))
    return lambda x, k: np.rint(x * _power_of_two(-k)) * _power_of_two(k)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _grid_round(x: float, exp: int, m: int, cast32: bool) -> float:
    """x rounded to nearest-even on the grid, given x's clamped binary exponent (unused when cast32); beyond
    the largest binade, x itself (the caller flags it). With float32 x (float32 work), a float32 (computed in
    float64, exactly: `_to_multiple`), where the caller passes cast32 as a constant False (numba then drops the
    float64 branch before typing; tests/numerics/test_num_fused_optim.py fails on float64 arithmetic after the
    rounding in the optimizer's kernels)."""
    if cast32:
        return np.float64(np.float32(x))
    r = _to_multiple(x, min(exp, _EMAX + 1) - m)
    return x if exp > _EMAX else r  # |x| >= 2^128 (or inf, NaN): off the grid (a select: see `_to_multiple`)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def round_scalar(x: float, m: int, cast32: bool) -> float:
    """One value rounded onto the grid (for kernels whose values live in registers, not arrays), in x's type
    as `_grid_round`."""
    if cast32:
        return np.float64(np.float32(x))
    if x == 0 or not math.isfinite(x):
        return x  # signed zero stays; inf and NaN are the caller's to flag
    return round_value(x, m, False)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def round_value(x: float, m: int, cast32: bool) -> float:
    """A value rounded onto the grid, in a form LLVM vectorises in a loop (no branch on x: zero, inf and NaN
    come out of `_grid_round` as they went in), unlike `round_scalar`. The exponent comes from float64 bits
    (a float32 widens exactly; subnormals of either clamp to -126): math.frexp cost ~3 ns a call, eight calls
    an element in float32 work's Adam."""
    return _grid_round(x, 0 if cast32 else _exponent(np.float64(x).view(np.int64), 52, 0x7FF, 1023), m, cast32)


@njit(cache=True, nogil=True, error_model="numpy")
def _round_into(v: np.ndarray, vi: np.ndarray, mant: int, emask: int, bias: int, out: np.ndarray, m: int,
                cast32: bool, limit: float) -> int:
    # Off-grid values counted, not their first position kept: a conditional index in the loop stops LLVM
    # from vectorising it (3.2x slower at bits = 32). The rare bad output is then found in `out`.
    nbad = 0
    for i in range(v.size):
        r = _grid_round(v[i], 0 if cast32 else _exponent(vi[i], mant, emask, bias), m, cast32)
        nbad += not abs(r) <= limit
        out[i] = r
    return _first_bad(out, limit) if nbad else -1


@njit(cache=True, nogil=True, error_model="numpy")
def _round_in_place(v: np.ndarray, m: int, cast32: bool, limit: float) -> int:
    # `_round_into` with out = v. Written to v through a second array (or read through an integer view of
    # v), LLVM cannot rule out a loop-carried overlap and runs the loop scalar: 2.5x slower on 4M values.
    # One array and the exponent from the value's own bits (float64's layout: a float32 value widens
    # exactly, with the same exponent) let it vectorise.
    # A value that rounds off the grid is left as it was (a select, which vectorises too): only one beyond
    # `limit` or NaN does, since rounding is monotone and `limit` a grid value, so `_first_bad` finds it.
    # Selected as x + 0.0, not x: storing x back where it was read is no store at all to LLVM, which then
    # writes the good values by masked stores, microcoded on AMD's cores (session 40: 0.19 against 0.08 ms
    # for 256K values in cache, 0.82 against 0.45 for 1M, 3.9 against 2.9 for 4M from memory). The sum
    # changes no value it selects (beyond the grid or infinite: as it was; NaN: a NaN, quieted).
    nbad = 0
    for i in range(v.size):
        x = v[i]
        r = round_value(x, m, cast32)
        good = abs(r) <= limit
        nbad += not good
        v[i] = r if good else x + 0.0
    return _first_bad(v, limit) if nbad else -1


@njit(cache=True, nogil=True, error_model="numpy")
def _first_bad(out: np.ndarray, limit: float) -> int:
    """The first position of a rounded output that is NaN, infinite or beyond `limit` (one exists)."""
    for i in range(out.size):
        if not abs(out[i]) <= limit:
            return i
    return -1


NEAR_BLOCK = 512
_SHRINK32 = 1.0 - 2.0**-24
_EXPONENT_BITS = 0x7FF0000000000000


@njit(cache=True, nogil=True, error_model="numpy")
def _round_near32(v: np.ndarray, e: np.ndarray, factor: float, limit: float, out: np.ndarray,
                  cand: np.ndarray, held: np.ndarray, plus: float) -> tuple[int, int]:
    # `round_near` for float64 work at bits = 32, the trainer's common case, where every output of a large step
    # passes. 1.7-2.5 against 4.2-5.5 ns a value on 4M values with and without a per-element band, against a
    # scalar loop appending candidates as it went.
    return _near_pass(v, e, factor, _near32, 23, limit, out, cand, held, plus)


@njit(cache=True, nogil=True, error_model="numpy")
def _round_near(v: np.ndarray, e: np.ndarray, factor: float, m: int, limit: float, out: np.ndarray,
                cand: np.ndarray, held: np.ndarray, plus: float) -> tuple[int, int]:
    # `round_near` on any other grid, or float32 work: 0.8-1.1 against 4.3-6.6 ns a value by that scalar loop
    # (64K values at bits = 19, float64 and float32 work: benchmarks/bench_grid_kernels.py).
    return _near_pass(v, e, factor, _near_grid, m, limit, out, cand, held, plus)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _near_pass(v: np.ndarray, e: np.ndarray, factor: float, test: Callable[..., tuple[float, bool, bool]], m: int,
               limit: float, out: np.ndarray, cand: np.ndarray, held: np.ndarray, plus: float) -> tuple[int, int]:
    """`round_near` with the band e given (one value for all, or one for each) and the rounding test `test` for m
    mantissa bits (as `_near_block`): the same operations on the same values as one loop over v, arranged so that
    LLVM vectorises the pass, by blocks of NEAR_BLOCK values."""
    count = nbad = 0
    flags, keep = _block_buffers(NEAR_BLOCK)
    same = _same(v, out)
    fill = np.full(NEAR_BLOCK, e[0])  # one band for all: read like a per-element one, with no branch
    for start in range(0, v.size, NEAR_BLOCK):
        stop = min(start + NEAR_BLOCK, v.size)
        vb, terms = v[start:stop], (fill if e.size == 1 else e[start:stop],)
        # (the arrays `_near_block` asks for; each branch finishes its block, since keep is float64 and vb float32
        # in float32 work)
        if same:
            nflag, bad = _near_block(vb, test, m, _band_given, terms, factor, limit, vb, keep, flags, plus)
            count = _finish_block(keep, vb.size, flags, nflag, start, cand, held, count)
        else:
            ob = out[start:stop]
            nflag, bad = _near_block(vb, test, m, _band_given, terms, factor, limit, ob, ob, flags, plus)
            count = _finish_block(vb, vb.size, flags, nflag, start, cand, held, count)
        nbad += bad
    return count, _first_bad(out, limit) if nbad else -1


@njit(cache=True, nogil=True, error_model="numpy")
def _round_near32_relative(v: np.ndarray, k: float, a: float, c: float, f: float, factor: float, limit: float,
                           out: np.ndarray, cand: np.ndarray, held: np.ndarray, plus: float) -> tuple[int, int]:
    # (the band computed value by value inside the block's loop: written to a block buffer first and read back,
    # it cost 1.52-1.68 against 0.95-1.16 ms on 1M values fresh from a tanh, rounding alone 0.83-0.89)
    count = nbad = 0
    flags, keep = _block_buffers(NEAR_BLOCK)
    same = _same(v, out)
    for start in range(0, v.size, NEAR_BLOCK):
        stop = min(start + NEAR_BLOCK, v.size)
        vb, terms = v[start:stop], (k, a, c, f)
        if same:
            nflag, bad = _near_block(vb, _near32, 23, _band_relative, terms, factor, limit, vb, keep, flags, plus)
        else:
            ob = out[start:stop]
            nflag, bad = _near_block(vb, _near32, 23, _band_relative, terms, factor, limit, ob, ob, flags, plus)
        nbad += bad
        count = _finish_block(keep if same else vb, vb.size, flags, nflag, start, cand, held, count)
    return count, _first_bad(out, limit) if nbad else -1


@njit(cache=True, nogil=True, error_model="numpy")
def _round_near32_outer(v: np.ndarray, rows: np.ndarray, cols: np.ndarray, add: np.ndarray, factor: float,
                        limit: float, out: np.ndarray, cand: np.ndarray, held: np.ndarray, plus: float,
                        sa: np.ndarray, sb: np.ndarray) -> tuple[int, int]:
    # `_round_near32` for v of shape (B, M, N) (flat) and the band e[n, i, j] = rows[n, i] * cols[n, j] +
    # add[n, j] (float64, two roundings), computed in the pass itself: a matmul's pre-filter
    # (vtrain.prefilter) with no U in memory. (Written to a block buffer first and read back, U cost a
    # second pass: 1.57 against 0.83 ms on 1M values.)
    if _same(v, out):
        count, nbad = _outer_pass(v, rows, cols, add, factor, limit, None, cand, held, plus, sa, sb)
    else:
        count, nbad = _outer_pass(v, rows, cols, add, factor, limit, out, cand, held, plus, sa, sb)
    return count, _first_bad(out, limit) if nbad else -1


@njit(cache=True, nogil=True, error_model="numpy")
def _outer_pass(v: np.ndarray, rows: np.ndarray, cols: np.ndarray, add: np.ndarray, factor: float, limit: float,
                out: np.ndarray | None, cand: np.ndarray, held: np.ndarray, plus: float, sa: np.ndarray,
                sb: np.ndarray) -> tuple[int, int]:
    """`_round_near32_outer`'s pass, in place for out None: (the candidate count, the off-grid count). In place or
    not is the argument's type, so numba compiles each pass on its own, with no choice in the loop over blocks.
    With the choice made there, from a flag (and the off-grid values put back after each block's loop, see
    `_near_block`), a block cost ~60 ns besides its values, and a matmul's rows of 128 or 256 values are a
    block each: GPT-2-tiny's 1024 x 256 output, in place, in cache, 0.30 against 0.54 ns a value, its 16 x 128 x
    128 attention scores 0.32 against 0.79 (session 48)."""
    m, n_cols = rows.shape[1], cols.shape[1]
    count = nbad = 0
    flags, keep = _block_buffers(NEAR_BLOCK)
    for n in range(rows.shape[0]):
        cn, an = cols[n], add[n]
        for i in range(m):
            ri = rows[n, i]
            row = (n * m + i) * n_cols
            for start in range(0, n_cols, NEAR_BLOCK):
                stop = min(start + NEAR_BLOCK, n_cols)
                vb, terms = v[row + start:row + stop], (ri, cn[start:stop], an[start:stop])
                if out is None:
                    nflag, bad = _near_block(vb, _near32, 23, _band_outer, terms, factor, limit, vb, keep, flags,
                                             plus)
                    src = keep
                else:
                    ob = out[row + start:row + stop]
                    nflag, bad = _near_block(vb, _near32, 23, _band_outer, terms, factor, limit, ob, ob, flags,
                                             plus)
                    src = vb
                nbad += bad
                new = _finish_block(src, vb.size, flags, nflag, row + start, cand, held, count)
                if sa.size:
                    # (in a relu network's weight gradient ~4 % of all outputs, unit pairs never active
                    # together, which U cannot tell from others: checked on the new candidates only,
                    # not in the block's pass, where the branch cost 4 ms on 4M values)
                    kept = count
                    for t in range(count, new):
                        c, x = cand[t], held[t]
                        cand[kept], held[kept] = c, x
                        kept += x != 0.0 or _share_a_bit(sa[n, i], sb[n, c - row])
                    new = kept
                count = new
    return count, nbad


# The bands of `_near_block`, at value j (x) of a block: given per value (terms: (the block's bands,)), the matmul
# pre-filter's outer product (terms: (rows[n, i] of the block's row, the block's columns of cols[n] and add[n])), a
# function's relative band (terms: (k, a, c, f) of vtrain.bounds.RELATIVE)
@njit(cache=True, nogil=True, inline="always")
def _band_given(j: int, x: float, terms: tuple) -> float:
    return terms[0][j]


@njit(cache=True, nogil=True, inline="always")
def _band_outer(j: int, x: float, terms: tuple) -> float:
    ri, cb, ab = terms
    return ri * cb[j] + ab[j]


@njit(cache=True, nogil=True, inline="always")
def _band_relative(j: int, x: float, terms: tuple) -> float:
    k, a, c, f = terms
    return ((k * abs(x)) + a) * c + f


# U's margin over E's sum (`round_near_mm`): far above the ~K 2^-52 by which the rounded sums and norms can differ
# from the exact ones below 2^40 terms. A line with a nonzero value below _SQUARE_MIN gets an infinite norm: its
# squares would lose their precision (or vanish) in the subnormal range. So wherever U is finite every nonzero
# square and product is at least 2^-1000, a normal number, and no margin for subnormal rounding is needed.
_U_MARGIN = 1.0 + 2.0**-8
_SQUARE_MIN = 2.0**-500


@njit(cache=True, nogil=True, error_model="numpy")
def round_near_mm(v: np.ndarray, a: np.ndarray, b: np.ndarray, bias: np.ndarray, alpha: float, beta: float,
                  scale: float, floor: float, factor: float, limit: float, out: np.ndarray, cand: np.ndarray,
                  held: np.ndarray, e_cand: np.ndarray, plus: float = -0.0) -> tuple[int, int]:
    """`round_near` for float64 work at bits = 32 on v = a @ b (+ beta bias) of shape (B, M, N), flat (a and b
    batches (B, M, K) and (B, K, N): a matmul's as one), with the band e = (alpha sum_k |a_ik| |b_kj| + beta
    |bias_ij|) * scale + floor (bias (M, N), a broadcast view, with B = 1, or (0, 0) for none); also
    e_cand[:count] = e at the candidates. The sums run in float64 in the kernel's own order (k ascending from
    0.0): vtrain.bounds' slack covers any order.

    E's sum is taken only where the value may be a candidate: each row is first tested against U, the same
    formula with the sum replaced by the product of the two lines' Euclidean norms (Cauchy-Schwarz) times
    `_U_MARGIN` (a NaN product taken as infinite). That product is >= E's sum wherever the sum is not NaN, and
    with alpha and scale > 0 and beta, floor >= 0 (as vtrain.inline gives them) the formula and the candidate
    test only grow with it, so every value E makes a candidate U makes one too; those are then tested against
    E itself. So the candidates, E at them and the rounding are E everywhere's, bit for bit, for M K + K N + M N
    operations (and K for each value U flags: a handful, plus the sums with no nonzero term, which U cannot
    tell) instead of M N K: a 32 x 64 @ 64 x 64 mm's bound and rounding took 18 us, now 5."""
    batches, m, k_dim = a.shape
    n = b.shape[2]
    row_norms, col_norms = np.empty(m), np.empty(n)
    rows = max(1, min(m, NEAR_BLOCK // max(n, 1)))  # (rows a block: a short row's own pass cost ~70 ns)
    eb = np.empty(rows * n)
    flags, keep = _block_buffers(rows * n)
    same = _same(v, out)
    count = nbad = 0
    for h in range(batches):
        ah, bh = a[h], b[h]
        _line_norms(ah, row_norms)
        _line_norms(bh.T, col_norms)
        for i0 in range(0, m, rows):
            i1 = min(i0 + rows, m)
            for i in range(i0, i1):
                ri, eb_i = row_norms[i] * _U_MARGIN, eb[(i - i0) * n:(i - i0 + 1) * n]
                for j in range(n):
                    u = ri * col_norms[j]
                    eb_i[j] = u if u >= 0.0 else np.inf
                _scale_sums(eb_i, bias, i, alpha, beta, scale, floor)
            start, size = (h * m + i0) * n, (i1 - i0) * n
            vb, kb, fb, terms = v[start:start + size], keep[:size], flags[:size], (eb[:size],)
            if same:
                nflag, bad = _near_block(vb, _near32, 23, _band_given, terms, factor, limit, vb, kb, fb, plus)
            else:
                ob = out[start:start + size]
                nflag, bad = _near_block(vb, _near32, 23, _band_given, terms, factor, limit, ob, ob, fb, plus)
                kb = vb
            nbad += bad
            for t in range(size if nflag else 0):
                if fb[t]:
                    i, j = i0 + t // n, t % n
                    s = 0.0
                    for k in range(k_dim):
                        s += abs(ah[i, k]) * abs(bh[k, j])
                    eb[t:t + 1] = s  # (E from its sum by the row's own operations: `_scale_sums`)
                    _scale_sums(eb[t:t + 1], bias[i:i + 1, j:j + 1] if bias.size else bias, 0, alpha, beta, scale,
                                floor)
                    near = _near32(kb[t], eb[t], factor, 23, limit)[1]
                    fb[t] = near
                    nflag -= not near
            new = _finish_block(kb, size, fb, nflag, start, cand, held, count)
            for t in range(count, new):
                e_cand[t] = eb[cand[t] - start]
            count = new
    return count, _first_bad(out, limit) if nbad else -1


@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def _line_norms(x: np.ndarray, out: np.ndarray) -> None:
    """out[i] = the Euclidean norm of row i of x, summed in any order (reassociated, so that the loops
    vectorise: an upper bound's margin covers any order), or inf where a nonzero value lies below _SQUARE_MIN;
    x read along its memory in either layout."""
    small = np.zeros(out.size, np.int64)
    sq = np.zeros(out.size)
    if x.strides[1] <= x.strides[0]:
        for i in range(x.shape[0]):
            s, t = 0.0, 0
            for k in range(x.shape[1]):
                y = x[i, k]
                s += y * y
                t += (y != 0.0) & (abs(y) < _SQUARE_MIN)
            sq[i], small[i] = s, t
    else:
        for k in range(x.shape[1]):
            for i in range(x.shape[0]):
                y = x[i, k]
                sq[i] += y * y
                small[i] += (y != 0.0) & (abs(y) < _SQUARE_MIN)
    for i in range(out.size):
        out[i] = np.inf if small[i] else math.sqrt(sq[i])


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _scale_sums(eb: np.ndarray, bias: np.ndarray, i: int, alpha: float, beta: float, scale: float,
                floor: float) -> None:
    """eb = (alpha eb + beta |bias[i]|) * scale + floor (bias of size 0: none), in place: E from its sums."""
    if bias.size:
        bi = bias[i]
        for j in range(eb.size):
            eb[j] = (eb[j] * alpha + beta * abs(bi[j])) * scale + floor
    else:
        for j in range(eb.size):
            eb[j] = eb[j] * alpha * scale + floor


@njit(cache=True, nogil=True, inline="always")
def _share_a_bit(x: np.ndarray, y: np.ndarray) -> bool:
    for w in range(x.size):
        if x[w] & y[w]:
            return True
    return False


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _near32(x: float, e: float, factor: float, m: int, limit: float) -> tuple[float, bool, bool]:
    """(x rounded (bits = 32, m = 23: the argument is `_near_block`'s protocol), the candidate test against the
    band e * factor, whether r is off the grid). Branch-free, so that the loops that call it vectorise, off-grid
    values counted by the caller (their first position is found afterwards, as in `_round_into`)."""
    r = np.float64(np.float32(x))
    # Half the spacing below r (as `_near_grid` on any grid), 2^(E - 24) for the binade 2^E below r: |r|
    # (1 - 2^-24), exact since r has 24 bits, lies in r's binade, or in the one below where r is a power of two,
    # and its exponent bits alone are that binade's 2^E. At least 2^-150, the uniform range's (r = 0 included). One
    # integer operation where the exponent's arithmetic took six: 1.2 against 1.4 ns a value in cache. At an
    # r off the grid (inf, NaN) the test means nothing: such a value is flagged, and settled otherwise (an
    # error, or the exact resolution's recomputation).
    binade = np.int64(np.float64(abs(r) * _SHRINK32).view(np.int64) & _EXPONENT_BITS).view(np.float64)
    half = max(binade * 2.0**-24, 2.0**-150)
    near = abs(x - r) + e * factor >= half
    return r, near, not abs(r) <= limit


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _near_grid(x: float, e: float, factor: float, m: int, limit: float) -> tuple[float, bool, bool]:
    """`_near32` on the grid of m mantissa bits (any bits, float64 or float32 work), the test in float64
    arithmetic: half the spacing below r (vtrain.grid.spacing_below) is 2^(E - m - 1) for the binade 2^E of
    |r| (1 - 2^-(m+1)) (exact: r has at most m + 1 bits), at least 2^-126's. (x widened first: float32 x's
    rounding, in float64 and back (`_to_multiple`), then read in float64 again, cost the pass ~40 %.)"""
    x = np.float64(x)
    r = round_value(x, m, False)
    binade = np.int64(np.float64(abs(r) * (1.0 - _power_of_two(-m - 1))).view(np.int64) & _EXPONENT_BITS).view(
        np.float64)
    half = max(binade, MIN_NORMAL) * _power_of_two(-m - 1)
    near = abs(x - r) + e * factor >= half
    return r, near, not abs(r) <= limit


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _near_block(vb: np.ndarray, test: Callable[..., tuple[float, bool, bool]], m: int,
                band: Callable[[int, float, tuple], float], terms: tuple, factor: float, limit: float,
                dest: np.ndarray, keep: np.ndarray, flags: np.ndarray, plus: float) -> tuple[int, int]:
    """dest = vb rounded + plus (a value off the grid as it was, + 0.0: a NaN quieted), keep = vb, flags = the
    test's (`_near32` at bits = 32 on float64 work, else `_near_grid` for m mantissa bits) against the band
    band(j, vb[j], terms) * factor; (the number of candidates, the number of off-grid values). (`test` and
    `band`: compiled functions, which numba specialises and inlines.) The off-grid
    values are selected in the loop: put back after it, by a loop inlined into every block, they cost the
    matmul pass ~25 ns a block though none was there (session 48).

    In place, the caller passes vb itself as dest, and a block buffer as keep, which then holds the values
    for the candidates; otherwise the output's block as both dest and keep (vb keeps its values). Either
    way LLVM is given the same array twice, not two that may overlap, and vectorises the loop (with a
    possible overlap it kept the loop scalar where the band is a function's: 3.7 against 1.5 ms on 1M
    values; so it did with the choice made in here, from a flag). The flags are 64-bit, as the test's
    vector lanes are. Against rounding into a block buffer copied back afterwards, with byte flags (a pack
    of each lane): 1.28-1.31 against 1.50-1.53 ms in place on a 1M-value matmul output fresh from the
    product (the outer product's band), 1.14-1.19 against 1.40-1.46 with a function's band (session 43)."""
    nflag = nbad = 0
    for j in range(vb.size):
        x = vb[j]
        r, near, bad = test(x, band(j, x, terms), factor, m, limit)
        keep[j] = x
        dest[j] = x + 0.0 if bad else r + plus
        flags[j] = near
        nflag += near
        nbad += bad
    return nflag, nbad


@njit(cache=True, nogil=True, inline="always")
def _block_buffers(size: int) -> tuple[np.ndarray, np.ndarray]:
    """(flags, keep): a block's candidate flags and its unrounded values, for the `_near_block` family."""
    return np.empty(size, np.int64), np.empty(size)


@njit(cache=True, nogil=True, inline="always")
def _same(v: np.ndarray, out: np.ndarray) -> bool:
    """Whether out is v's memory (a kernel rounding in place), as the callers pass it: the same flat array."""
    return v.size > 0 and v.ctypes.data == out.ctypes.data


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _finish_block(keep: np.ndarray, size: int, flags: np.ndarray, nflag: int, offset: int, cand: np.ndarray,
                  held: np.ndarray, count: int) -> int:
    """Append offset + j and keep[j] (the block's unrounded values) for the flagged j to cand[:count] and
    held[:count]; the new count. (Only blocks with a candidate scan their flags: candidates are ~0.1 % of
    the values, so ~40 % of 512-value blocks have one, and a branch on each flag, almost always not taken,
    beats appending every value branch-free: the pass took 1.14 against 1.49 ms a 1M-value matmul output at
    0.1 % candidates, 0.99 against 0.99 at 0.002 %; session 47.)"""
    if nflag:
        for j in range(size):
            if flags[j]:
                cand[count] = offset + j
                held[count] = keep[j]
                count += 1
    return count


def geometry(vv: np.ndarray, rr: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(v - r, the grid spacing below r, the one above r) for grid values r with m mantissa bits (float64 or
    float32 arrays, v in r's dtype): RoundedExecution._geometry, by vtrain.grid.spacings_np's operations in
    r's dtype, in one compiled call for an op's few candidates instead of ~15 numpy calls. None when the
    kernels are off or the arrays are not of one such dtype."""
    if not ENABLED or rr.dtype not in (np.float64, np.float32) or vv.dtype != rr.dtype:
        return None  # (the numpy path: it raises for other dtypes)
    diff, down, up = np.empty_like(rr), np.empty_like(rr), np.empty_like(rr)
    # (the constants in r's dtype, so that r * shrink rounds as numpy's does; the spacings are powers of two,
    # exact in either dtype)
    _geometry(vv, rr, rr.dtype.type(1.0 - 2.0 ** -(m + 1)), 2.0**-m, diff, down, up)
    return diff, down, up


@njit(cache=True, nogil=True, error_model="numpy")
def _geometry(vv: np.ndarray, rr: np.ndarray, shrink: float, q: float, diff: np.ndarray, down: np.ndarray,
              up: np.ndarray) -> None:
    for i in range(rr.size):
        diff[i] = vv[i] - rr[i]
        down[i], up[i] = _spacings(rr[i], shrink, q)


@njit(cache=True, nogil=True, inline="always")
def _spacings(r: float, shrink: float, q: float) -> tuple[float, float]:
    """(the grid spacing below r, the one above r), as spacings_np: the spacing at x is
    max(2^exponent(x), MIN_NORMAL) 2^-m (q = 2^-m); toward zero, the one at |r| (1 - 2^-(m+1)) (`shrink`,
    in r's dtype), which drops into the binade below exactly at powers of two."""
    away, toward = _binade(r) * q, _binade(r * shrink) * q
    return (away, toward) if r < 0 else (toward, away)


def classify(vv: np.ndarray, rr: np.ndarray, ww: np.ndarray, m: int, value_fraction: float,
             inclusive: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The test of an op's candidates, in one compiled call: for values vv and their roundings rr (numpy
    arrays of one float dtype), with the band ww there, (whether the boundary below r is the nearer one,
    whether the nearer one lies strictly within ww (`inclusive`: or at ww), whether ww reaches
    `value_fraction` of the smaller grid spacing). RoundedExecution._find_entries' numpy operations on
    `geometry`'s results, in r's dtype with the constants in r's dtype as numpy takes Python floats; None
    where the kernels cannot take the arrays."""
    if not ENABLED or rr.dtype not in (np.float64, np.float32) or vv.dtype != rr.dtype:
        return None
    one = rr.dtype.type
    near_lo, logged, wide = (np.empty(rr.size, np.bool_) for _ in range(3))
    _classify(vv, rr, ww, one(1.0 - 2.0 ** -(m + 1)), 2.0**-m, one(0.5), one(value_fraction), inclusive, near_lo,
              logged, wide)
    return near_lo, logged, wide


@njit(cache=True, nogil=True, error_model="numpy")
def _classify(vv: np.ndarray, rr: np.ndarray, ww: np.ndarray, shrink: float, q: float, half: float,
              fraction: float, inclusive: bool, near_lo: np.ndarray, logged: np.ndarray, wide: np.ndarray) -> None:
    # the spacings stored in r's dtype first, as `geometry` returns them, so that the products below round
    # in it (an eighth of float32's smallest spacings underflows in float32, not in float64)
    spacing = np.empty(2, rr.dtype)
    for t in range(rr.size):
        near_lo[t], logged[t], wide[t] = _classify_one(vv[t], rr[t], ww[t], shrink, q, half, fraction, inclusive,
                                                       spacing)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _classify_one(v: float, r: float, w: float, shrink: float, q: float, half: float, fraction: float,
                  inclusive: bool, spacing: np.ndarray) -> tuple[bool, bool, bool]:
    """`_classify`'s test of one value v, its rounding r and the band w there (spacing: a scratch pair in r's dtype)."""
    spacing[0], spacing[1] = _spacings(r, shrink, q)
    down, up = spacing[0], spacing[1]
    diff = v - r
    d_lo = diff + down * half  # distance to the boundary below r
    d_hi = up * half - diff  # and to the one above
    dist = np.minimum(d_lo, d_hi)
    return d_lo <= d_hi, dist <= w if inclusive else dist < w, w >= np.minimum(down, up) * fraction


def logged(vv: np.ndarray, r: np.ndarray, idx: np.ndarray, e: np.ndarray | tuple[np.ndarray, np.ndarray, np.ndarray],
           factor: float, m: int, value_fraction: float) -> tuple[np.ndarray, ...] | None:
    """The candidates that `classify` puts within their band, in one compiled call from an output's candidates:
    for the unrounded values vv at flat positions idx of the rounded output r (flat), with the band factor * e
    there (e: a bound at idx in r's dtype, or the pre-filter's factors (rows, cols, add), whose U at position p of
    a (B, M, N) output is rows[b, i] cols[b, j] + add[b, j], taken in r's dtype, as prefilter.Prefilter.at has
    it), (the positions, vv, r, the band, e there, whether the boundary below r is the nearer one, whether the band
    reaches `value_fraction` of the smaller spacing), in idx's order. None where the kernels cannot take the arrays
    (RoundedExecution._find_entries then asks numpy the same questions)."""
    outer = isinstance(e, tuple)
    if not ENABLED or r.dtype not in (np.float64, np.float32) or vv.dtype != r.dtype \
            or (not outer and e.dtype != r.dtype):
        return None
    one = r.dtype.type
    rows, cols, add = e if outer else (_NO_FACTORS, _NO_FACTORS, _NO_FACTORS)
    n = idx.size
    # (three arrays, not seven, and the constants as scalars: in a training step each allocation and argument costs)
    pos, values, flags = np.empty(n, np.int64), np.empty((4, n), r.dtype), np.empty((2, n), np.bool_)
    count = _logged(vv, r, idx, _NO_BAND[r.dtype] if outer else e, rows, cols, add, one(factor),
                    one(1.0 - 2.0 ** -(m + 1)), 2.0**-m, one(value_fraction), pos, values, flags)
    held, rr, ww, ee = values[:, :count]
    return pos[:count], held, rr, ww, ee, flags[0, :count], flags[1, :count]


_NO_FACTORS = np.empty((0, 0))
_NO_BAND = {np.dtype(np.float64): np.empty(0, np.float64), np.dtype(np.float32): np.empty(0, np.float32)}


@njit(cache=True, nogil=True, error_model="numpy")
def _logged(vv: np.ndarray, r: np.ndarray, idx: np.ndarray, e: np.ndarray, rows: np.ndarray, cols: np.ndarray,
            add: np.ndarray, factor: float, shrink: float, q: float, fraction: float, pos: np.ndarray,
            values: np.ndarray, flags: np.ndarray) -> int:
    """`logged`'s pass (e empty: U from rows, cols, add), the selected candidates written to the front of pos,
    values (held, r, the band, e) and flags (near_lo, wide): their count."""
    spacing = np.empty(2, r.dtype)
    band = np.empty(1, r.dtype)  # (E or U stored in r's dtype, as numpy's astype and gathers hold it)
    spacing[0] = 0.5
    half = spacing[0]  # (in r's dtype, as `classify` passes it)
    n = cols.shape[1]
    plane = rows.shape[1] * n
    count = 0
    for t in range(idx.size):
        p = idx[t]
        if e.size:
            band[0] = e[t]
        else:
            j = p % n
            band[0] = rows[p // plane, p % plane // n] * cols[p // plane, j] + add[p // plane, j]
        w = band[0] * factor
        lo, within, broad = _classify_one(vv[t], r[p], w, shrink, q, half, fraction, False, spacing)
        if within:
            pos[count] = p
            values[0, count], values[1, count], values[2, count], values[3, count] = vv[t], r[p], w, band[0]
            flags[0, count], flags[1, count] = lo, broad
            count += 1
    return count


@njit(cache=True, nogil=True, inline="always")
def _binade(x: float) -> float:
    """max(2^floor(log2 |x|), MIN_NORMAL), inf for inf and NaN: what spacings_np reads from x's exponent bits
    (a subnormal of x's dtype has none, and the maximum lifts it to MIN_NORMAL either way)."""
    # (x's exponent bits alone, in float64, where a float32 subnormal is normal: frexp and ldexp, library calls,
    # took ~70 % of the classification of float32 work's many candidates)
    return max(np.int64(np.float64(x).view(np.int64) & _EXPONENT_BITS).view(np.float64), MIN_NORMAL)


def abs32(t: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(|t| rounded to float32, its largest element, inf if t holds NaN) for a float64 tensor: one pass where
    the kernels take t or its transpose (a matmul's operands often are transposed views), torch's otherwise."""
    src = t if t.is_contiguous() else t.t() if t.dim() == 2 and t.t().is_contiguous() else None
    if src is None or not usable(src) or not t.numel():
        a = t.to(torch.float32).abs_()
        largest = float(a.max()) if a.numel() else 0.0
        return a, largest if largest == largest else math.inf
    out = torch.empty(src.shape, dtype=torch.float32)
    largest = _abs32(flat(src), flat(out))
    return (out if src is t else out.t()), largest


def abs_sum(x: torch.Tensor, dims: list[int]) -> np.ndarray | None:
    """The sum of |x| over `dims` (float64, the kept dims' elements in order) in one pass, with no |x| in
    memory (torch's x.abs() writes a tensor as large as x: on a 512 x 2048 bias gradient, fresh pages cost
    more than the sum), for a contiguous CPU tensor that keeps one block of consecutive dims (none, leading,
    trailing or inner ones: batch norm's channels); None otherwise. Accumulated in float64 in its own order:
    vtrain.bounds' slack covers any order."""
    layout = _reduction_layout(x, dims)
    if layout is None:
        return None
    columns, lines, out = layout
    if columns:
        _abs_column_sums(lines, out)
    else:
        _abs_block_sums(lines, out)
    return out


BLOCK_SUM_ELEMENTS = 1 << 18  # (the CPU device's line sums from this size on: see vtrain.devices._sum_with_abs)
# The lanes of the CPU device's line sums (`_lane_sums_with_abs`): at 64, a lane is touched again every 64 values
# (no wait on its last addition) and the lanes of both sums sit in L1. On batch norm's 1M-value input, read from
# memory: 64 lanes 0.82 ms, 32 0.86, 128 0.86, torch's own sum 0.69-0.71, the eight partial sums before them 1.20.
# The CPU device's sums are defined by this count: another gives other bits (a new device order).
SUM_LANES = 64


def sums_with_abs(lines: np.ndarray, columns: bool, divisor: float) -> tuple[np.ndarray, np.ndarray]:
    """(the sum of x over the reduced dims / divisor, the sum of |x| there) in one pass, float64 in the kept dims'
    order, x as `reduction_view` gives it (`columns`: its first form). The CPU device's sums and means under
    rounded execution (vtrain.devices): a trainer's sum and its error bound's sum of |x| (vtrain.bounds) each
    read x from memory once more, and on batch and layer norm's inputs (1-8 MB) that second pass cost as much as
    the sum. The sum's order is fixed by this code, on any machine and thread count (E bounds any order):
    - columns (the reduced dims leading): each kept element's values added row after row from 0.0;
    - lines (the reduced dims trailing or inner, x as (outer, kept, inner)): value k of line x[a, c] goes to lane
      k % L of kept element c (L = min(inner, SUM_LANES)), each lane adds its values from 0.0 in order of a, then
      k, and the L lanes are combined by `_halving_tree`.
    Each lane's additions are in this order whatever the vector width the compiler picks, since the vectors run
    across lanes, never along one. A mean's sum is then divided by its count (`divisor`; 1.0 for a sum), one IEEE
    division per value as numpy's or torch's would be."""
    kept = lines.shape[-1 if columns else 1]
    total, out = np.empty(kept), np.empty(kept)
    if columns:
        _column_sums_with_abs(lines, total, out, divisor)
        return total, out
    # Lines run in parts of kept elements on torch's threads (vtrain.omp), each element's sums on one, in the
    # order above. (Parts of columns, each reading a stripe of every row, took longer than the whole pass in
    # GPT-2-tiny's steps: 341 against 188 us on 1024 x 256, 671 against 510 on 1024 x 768.)
    parts = min(omp.parts(lines.size), kept) if lines.dtype == np.float64 and lines.flags.c_contiguous else 1
    if parts > 1:
        omp.kernels().lane_sums_with_abs(parts, lines, total, out, divisor)
    else:
        _lane_sums_with_abs(lines, total, out, divisor, 0, kept)
    return total, out


# The sums of |x| that `sums_with_abs` computed with the CPU device's last sum or mean, for that op's error bound
# (vtrain.bounds): (the output tensor, its sums), handed out once, to that very tensor only.
_ABS_SUMS: list = [None, None]


def remember_abs_sums(out: torch.Tensor, sums: np.ndarray) -> None:
    _ABS_SUMS[:] = [out, sums]


def take_abs_sums(out: torch.Tensor) -> np.ndarray | None:
    """The sums of |x| behind the reduction whose output is `out` (this object), if the device kept them."""
    if _ABS_SUMS[0] is not out:
        return None
    sums = _ABS_SUMS[1]
    _ABS_SUMS[:] = [None, None]
    return sums


def _reduction_layout(x: torch.Tensor, dims: list[int]) -> tuple[bool, np.ndarray, np.ndarray] | None:
    """(whether the reduced dims lead, x as a (reduced, kept) matrix if so, else as (outer, kept, inner), an
    output array of the kept size) for `abs_sum`'s tensors; None for the others."""
    if not (usable(x) and x.dim() and x.numel()):
        return None
    view = reduction_view(tuple(x.shape), sorted({d % x.dim() for d in dims}))
    if view is None:
        return None
    lines = flat(x).reshape(view[1])
    return view[0], lines, np.empty(lines.shape[-1 if view[0] else 1])


def reduction_view(shape: tuple, red: list[int]) -> tuple[bool, tuple] | None:
    """For a contiguous tensor of this shape reduced over the dims `red` (ascending): (whether they lead, the
    shape to view it in: (reduced, kept) if so, else (outer, kept, inner)), or None where the kept dims are not
    one block of consecutive dims (none, leading, trailing or inner ones: batch norm's channels)."""
    kept = [d for d in range(len(shape)) if d not in red]
    first = kept[0] if kept else 0
    if kept and red == list(range(first)):  # leading: one sum per column of the (reduced, kept) matrix
        return True, (-1, math.prod(shape[first:]))
    if kept == list(range(first, first + len(kept))):
        # one block kept (trailing dims, inner ones as batch norm's channels of (N, C, H, W), or none): an
        # (outer, kept, inner) array, the sums of its inner lines added to their kept element's
        return False, (math.prod(shape[:first]), math.prod(shape[first:first + len(kept)]), -1)
    return None


@njit(cache=True, nogil=True, error_model="numpy", fastmath={"reassoc"})
def _abs_block_sums(x: np.ndarray, out: np.ndarray) -> None:
    # reassociated, so that LLVM vectorises each inner line's sum (one chain of dependent additions waits on
    # each addition): every sum here bounds a sum of |x|, which holds in any order
    out[:] = 0.0
    for a in range(x.shape[0]):
        for c in range(x.shape[1]):
            line, s = x[a, c], 0.0
            for k in range(line.size):
                s += abs(np.float64(line[k]))
            out[c] += s


@njit(cache=True, nogil=True, error_model="numpy")
def _abs_column_sums(x: np.ndarray, out: np.ndarray) -> None:
    out[:] = 0.0
    for i in range(x.shape[0]):
        row = x[i]
        for j in range(row.size):
            out[j] += abs(np.float64(row[j]))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _halving_tree(acc: np.ndarray) -> float:
    """acc's values summed pairwise, acc overwritten: while n > 1 values remain, value k + n // 2 is added to
    value k for k < n // 2, and an odd n's last value moves to n // 2 (one fixed tree for each n). Inlined:
    its callers must not be compiled with fast-math, which would let LLVM reassociate the tree."""
    n = acc.size
    while n > 1:
        h = n // 2
        for k in range(h):
            acc[k] = acc[k] + acc[k + h]
        if n % 2:
            acc[h] = acc[2 * h]
        n -= h
    return acc[0]


# Where x holds _LANE_IMAGES outer lines (images) or more, `_lane_sums_with_abs` holds the lanes of a block of kept
# elements at once, the two sums' lanes filling 32 KB (an L1 data cache)
_LANE_BYTES, _LANE_IMAGES = 1 << 15, 16


@njit(cache=True, nogil=True, error_model="numpy")
def _lane_sums_with_abs(x: np.ndarray, total: np.ndarray, out: np.ndarray, divisor: float, lo: int, hi: int) -> None:
    # `sums_with_abs`'s lines, of kept elements lo:hi. No fast-math here: the order defines the CPU device's sums.
    # With many images the lanes of a block of elements are held together and x is read image by image (a, then
    # the block's elements), one stream through memory, where element by element each read its lines at a stride
    # of a whole image: the same additions in each lane, in the same order. On Zen 3 (AVX2), batch norm's (32, 32,
    # 32, 32) input from memory 508-661 -> 463-537 us, (32, 64, 16, 16) 261-368 -> 238-294 (docs/benchmarks.md,
    # session 49). With fewer images, element by element: a layer norm's one outer line (1, 1024, 256) took ~10 %
    # longer in blocks of one element.
    lanes = min(x.shape[2], SUM_LANES)
    if x.shape[0] < _LANE_IMAGES:
        lane, lane_abs = np.empty(lanes), np.empty(lanes)
        for c in range(lo, hi):
            lane[:] = 0.0
            lane_abs[:] = 0.0
            for a in range(x.shape[0]):
                _add_lanes(x[a, c], lane, lane_abs)
            total[c] = _halving_tree(lane) / divisor
            out[c] = _halving_tree(lane_abs)
        return
    block = min(max(1, _LANE_BYTES // (16 * lanes)), hi - lo)
    acc, acc_abs = np.empty((block, lanes)), np.empty((block, lanes))
    for c0 in range(lo, hi, block):
        c1 = min(hi, c0 + block)
        acc[:] = 0.0
        acc_abs[:] = 0.0
        for a in range(x.shape[0]):
            for c in range(c0, c1):
                _add_lanes(x[a, c], acc[c - c0], acc_abs[c - c0])
        for c in range(c0, c1):
            total[c] = _halving_tree(acc[c - c0]) / divisor
            out[c] = _halving_tree(acc_abs[c - c0])


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _add_lanes(line: np.ndarray, lane: np.ndarray, lane_abs: np.ndarray) -> None:
    # value k of the line to lane k % lanes: the inner loop runs across the independent lanes, so LLVM vectorises it
    # with nothing reassociated (eight partial sums held in scalars had stayed scalar: 1.20 against 0.82 ms on 1M
    # values from memory)
    lanes, k0 = lane.size, 0
    while k0 + lanes <= line.size:  # (whole rows of lanes apart from the rest: a loop LLVM vectorises)
        for j in range(lanes):
            v = line[k0 + j]
            lane[j] += v
            lane_abs[j] += abs(v)
        k0 += lanes
    for j in range(line.size - k0):
        v = line[k0 + j]
        lane[j] += v
        lane_abs[j] += abs(v)


@njit(cache=True, nogil=True, error_model="numpy")
def _column_sums_with_abs(x: np.ndarray, total: np.ndarray, out: np.ndarray, divisor: float) -> None:
    total[:] = 0.0
    out[:] = 0.0
    for i in range(x.shape[0]):
        row = x[i]
        for j in range(row.size):
            total[j] += row[j]
            out[j] += abs(row[j])
    for j in range(total.size):
        total[j] /= divisor


def affine64(s: torch.Tensor, a: float, b: float) -> torch.Tensor:
    """s * a + b in float64 (two IEEE roundings per element, as torch's mul then add), s float32 or float64;
    in place for float64 s."""
    out = s if s.dtype == torch.float64 else torch.empty(s.shape, dtype=torch.float64)
    if not (usable(s) and s.numel() >= 4096):  # below, two torch calls cost less than one numba call
        return out.copy_(s).mul_(a).add_(b) if out is not s else out.mul_(a).add_(b)
    _affine(flat(s), flat(out), a, b)
    return out


@njit(cache=True, nogil=True, error_model="numpy")
def _abs32(v: np.ndarray, out: np.ndarray) -> float:
    # The largest as an integer maximum of the bits: non-negative floats order as their bit patterns, and a
    # NaN's lie above infinity's. LLVM vectorises that reduction, not a float maximum (2.3x faster).
    top = 0
    for i in range(v.size):
        y = np.float32(abs(np.float32(v[i])))
        out[i] = y
        top = max(top, y.view(np.int32))
    return math.inf if top > 0x7F800000 else np.float64(np.int32(top).view(np.float32))


@njit(cache=True, nogil=True, error_model="numpy")
def _affine(s: np.ndarray, out: np.ndarray, a: float, b: float) -> None:
    for i in range(s.size):
        out[i] = np.float64(s[i]) * a + b


# -- error-bound kernels (vtrain.bounds): the elementwise part of a bound in one pass -----------------
# The same float64 operations, in the same order, as the torch expressions in vtrain.bounds (no fast-math:
# numba neither reassociates nor contracts into FMA). Reductions whose order could matter stay torch's; a
# maximum or minimum is exact in any order. A NaN anywhere makes them return False (NaN payloads, and
# torch's NaN-propagating max, are not worth matching): the caller then takes its torch expression. NaN is
# noted per row, not returned at the first one: a loop with an exit in it stays scalar (the softmax kernels
# ran 1.25-3.5x slower so on GPT-2-tiny's 2 x 128 x 128 attention rows).


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _finish_into(out: np.ndarray, r: int, j: int, e: float, c: float, floor: float) -> bool:
    """out[r, j] = e * c + floor (bounds._finish); whether that is NaN (the kernel then declines: the torch
    path)."""
    e = e * c + floor
    out[r, j] = e
    return e != e


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _order_key(v: float) -> int:
    """An integer that orders as the float v does (-0 just below +0; NaN outside [-inf, inf]): maxima and
    minima of integers vectorise, of floats not (LLVM keeps their order for NaN's sake)."""
    b = np.float64(v).view(np.int64)
    return b ^ ((b >> 63) & 0x7FFFFFFFFFFFFFFF)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _from_order_key(k: int) -> float:
    return np.int64(k ^ ((k >> 63) & 0x7FFFFFFFFFFFFFFF)).view(np.float64)


_INF_KEY = 0x7FF0000000000000  # _order_key(inf)
_MINUS_INF_KEY = -0x7FF0000000000001  # _order_key(-inf)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _row_max_spread(x: np.ndarray, r: int) -> tuple[float, float]:
    """(max, max - min) of row r of x, -inf entries counted as the max (masking), as bounds._shifted: the
    minimum of the entries above -inf. A NaN in the row makes the max or the spread NaN, as does a row of -inf
    only (-inf - inf), and so every e of the row. Which of -0 and +0 the max and min are when both occur
    changes no bound: s = v - max and the spread enter only through |.| and + |s|."""
    hi, lo = _MINUS_INF_KEY, _INF_KEY
    for j in range(x.shape[1]):
        v = x[r, j]
        key = _order_key(v)
        hi = max(hi, key)
        lo = min(lo, _INF_KEY if v == -math.inf else key)
    mx = _from_order_key(hi)
    return mx, mx - _from_order_key(lo)


@njit(cache=True, nogil=True, error_model="numpy")
def softmax_bound(x: np.ndarray, y: np.ndarray, log: bool, out: np.ndarray, u: float, t: float, g: float, c: float,
                  floor: float) -> bool:
    """On (rows, n) arrays (the softmax dim last), finished (out = e * c + floor): vtrain.bounds._log_softmax
    where `log` (y the log-softmax), else vtrain.bounds._softmax (y the softmax, t passed as 2 t, as its torch
    expression takes it)."""
    for r in range(x.shape[0]):
        mx, spread = _row_max_spread(x, r)
        nan = False
        for j in range(x.shape[1]):
            nan |= _finish_into(out, r, j, _softmax_e(x[r, j], y[r, j], mx, spread, log, u, t, g), c, floor)
        if nan:
            return False
    return True


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _softmax_e(v: float, yv: float, mx: float, spread: float, log: bool, u: float, t: float, g: float) -> float:
    """`softmax_bound`'s e (unfinished) at an input v with output yv, in a row of max mx and spread `spread`."""
    s = (mx if v == -math.inf else v) - mx
    if log:
        return u * (abs(s) + abs(yv) + spread) + g + t * (1 + abs(s - yv))
    return abs(yv) * (u * (abs(s) + spread) + t + g)


@njit(cache=True, nogil=True, error_model="numpy")
def softmax_backward_bound(grad: np.ndarray, p: np.ndarray, sabs: np.ndarray, total: np.ndarray, y: np.ndarray,
                           out: np.ndarray, u: float, g: float, c: float, floor: float) -> bool:
    """vtrain.bounds._softmax_backward on (rows, n) arrays given the row sums of |grad p| and grad p (torch's),
    finished: out = e * c + floor."""
    for r in range(p.shape[0]):
        inner, nan = g * sabs[r], False
        for j in range(p.shape[1]):
            nan |= _finish_into(out, r, j, _softmax_backward_e(grad[r, j], p[r, j], y[r, j], inner, total[r], u), c,
                                floor)
        if nan:
            return False
    return True


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _softmax_backward_e(gv: float, pv: float, yv: float, inner: float, total: float, u: float) -> float:
    """`softmax_backward_bound`'s e (unfinished) at grad gv, softmax pv and output yv, in a row of inner = g sabs
    and sum `total`."""
    return abs(pv) * (inner + u * abs(gv - total)) + u * abs(yv)


@njit(cache=True, nogil=True, error_model="numpy")
def log_softmax_backward_bound(p: np.ndarray, sabs: np.ndarray, total: np.ndarray, y: np.ndarray, out: np.ndarray,
                               u: float, tu: float, g: float, c: float, floor: float) -> bool:
    """vtrain.bounds._log_softmax_backward on (rows, n) arrays given p = exp(out) and the row sums of |grad|
    and grad (torch's), finished: out = e * c + floor."""
    for r in range(p.shape[0]):
        inner, nan = g * sabs[r] + tu * abs(total[r]), False
        for j in range(p.shape[1]):
            e = p[r, j] * inner + u * abs(y[r, j])
            nan |= _finish_into(out, r, j, e, c, floor)
        if nan:
            return False
    return True


# -- the softmax family's band inside the rounding pass (vtrain.bounds.ROWS) -----------------------------------------
# `softmax_bound` and `softmax_backward_bound` wrote E as large as the output, which `round_near` then read back:
# here the rounding pass computes each row's E value by value, by the same functions, as `_near_block`'s band, with
# one pass fewer over the output and no E in memory. The softmax's and the log-softmax's E, candidates and rounding
# are theirs bit for bit; the softmax backward's row sums are the pass's own, added in `sums_with_abs`' order where
# torch's were (any order is within vtrain.bounds' slack). (A NaN E, which made those kernels decline, flags nothing
# there, as it flagged nothing in `round_near` from the torch expression's E, NaN there too.)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _row_pass(v: np.ndarray, out: np.ndarray | None, n: int, stats: Callable, terms: Callable, data: tuple,
              band: Callable, factor: float, limit: float, cand: np.ndarray, held: np.ndarray, e_cand: np.ndarray,
              plus: float) -> tuple[int, int]:
    """The row kernels' pass over v's rows of n values (flat), in place for out None (as `_outer_pass`): each row's
    statistics st = stats(r, data), then by blocks of at most NEAR_BLOCK values the band band(j, x, terms(r, start,
    stop, st, data)) of `_near_block`, and e_cand at the block's candidates from the same band; (the candidate
    count, the off-grid count)."""
    count = nbad = 0
    flags, keep = _block_buffers(min(n, NEAR_BLOCK))
    for r in range(v.size // n):
        st = stats(r, data)
        for start in range(0, n, NEAR_BLOCK):
            stop = min(start + NEAR_BLOCK, n)
            at, tb = r * n + start, terms(r, start, stop, st, data)
            vb = v[at:r * n + stop]
            if out is None:
                nflag, bad = _near_block(vb, _near32, 23, band, tb, factor, limit, vb, keep, flags, plus)
                src = keep
            else:
                ob = out[at:r * n + stop]
                nflag, bad = _near_block(vb, _near32, 23, band, tb, factor, limit, ob, ob, flags, plus)
                src = vb
            nbad += bad
            new = _finish_block(src, vb.size, flags, nflag, at, cand, held, count)
            for q in range(count, new):
                e_cand[q] = band(cand[q] - at, held[q], tb)
            count = new
    return count, nbad


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _row_kernel(v: np.ndarray, out: np.ndarray, n: int, stats: Callable, terms: Callable, data: tuple, band: Callable,
                factor: float, limit: float, cand: np.ndarray, held: np.ndarray, e_cand: np.ndarray,
                plus: float) -> tuple[int, int]:
    """`_row_pass` in place where out is v, else into out: (count, the first position off the grid or -1). (Inlined,
    so that the functions passed in are resolved where it is compiled: passed to a compiled call, they kept numba
    from caching the caller.)"""
    if _same(v, out):
        count, nbad = _row_pass(v, None, n, stats, terms, data, band, factor, limit, cand, held, e_cand, plus)
    else:
        count, nbad = _row_pass(v, out, n, stats, terms, data, band, factor, limit, cand, held, e_cand, plus)
    return count, _first_bad(out, limit) if nbad else -1


def _row_parts(v: np.ndarray, *operands: np.ndarray) -> int:
    """In how many parts of whole rows a row kernel's pass over v runs (vtrain.omp). Raises where the operands are not
    (rows, n) arrays of v's size (the compiled passes index them unchecked)."""
    rows = operands[0].shape[0]
    if any(a.ndim != 2 or a.shape != operands[0].shape for a in operands) or v.size != operands[0].size or not rows:
        raise ValueError(f"a row kernel takes (rows, n) operands of v's {v.size} values, got "
                         f"{[a.shape for a in operands]}")
    return min(omp.parts(v.size), rows)


@njit(cache=True, nogil=True, inline="always")
def _softmax_stats(r: int, data: tuple) -> tuple[float, float]:
    """Row r's (max, spread) of the softmax's inputs x (`_row_max_spread`)."""
    return _row_max_spread(data[0], r)


@njit(cache=True, nogil=True, inline="always")
def _softmax_block_terms(r: int, start: int, stop: int, st: tuple, data: tuple) -> tuple:
    """`_band_softmax`'s terms for values start:stop of row r: those inputs, the row's max and spread, log, u, t, g, c,
    floor."""
    x, log, u, t, g, c, floor = data
    return x[r, start:stop], st[0], st[1], log, u, t, g, c, floor


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _band_softmax(j: int, x: float, terms: tuple) -> float:
    """`softmax_bound`'s E, finished as `_finish_into` finishes it, at value j (x: the output's) of a row's block."""
    xb, mx, spread, log, u, t, g, c, floor = terms
    return _softmax_e(xb[j], x, mx, spread, log, u, t, g) * c + floor


def round_near_softmax(x: np.ndarray, log: bool, u: float, t: float, g: float, c: float, floor: float, v: np.ndarray,
                       factor: float, limit: float, out: np.ndarray, cand: np.ndarray, held: np.ndarray,
                       e_cand: np.ndarray, plus: float = -0.0) -> tuple[int, int]:
    """`round_near` for float64 work at bits = 32 on a softmax's (`log`: a log-softmax's) output v, flat, of inputs
    x (rows, n), the softmax dim last, with the band e = `softmax_bound`'s E (it takes log, u, t, g, c and floor
    alike) computed as it goes; also e_cand[:count] = e at the candidates. On torch's threads in parts of whole
    rows (vtrain.omp), the whole pass's results."""
    parts = _row_parts(v, x)
    if parts > 1:
        kernels = omp.kernels()
        return kernels.round_near_rows(kernels.ROWS_LOG_SOFTMAX if log else kernels.ROWS_SOFTMAX, parts, x, None, v,
                                       out, cand, held, e_cand, (factor, limit, plus, u, t, g, c, floor))
    return _round_near_softmax(x, log, u, t, g, c, floor, v, factor, limit, out, cand, held, e_cand, plus)


@njit(cache=True, nogil=True, error_model="numpy")
def _round_near_softmax(x: np.ndarray, log: bool, u: float, t: float, g: float, c: float, floor: float,
                        v: np.ndarray, factor: float, limit: float, out: np.ndarray, cand: np.ndarray, held: np.ndarray,
                        e_cand: np.ndarray, plus: float) -> tuple[int, int]:
    return _row_kernel(v, out, x.shape[1], _softmax_stats, _softmax_block_terms, (x, log, u, t, g, c, floor),
                       _band_softmax, factor, limit, cand, held, e_cand, plus)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _backward_stats(r: int, data: tuple) -> tuple[float, float]:
    """(g times the sum of |grad p|, the sum of grad p) over row r, each sum as `sums_with_abs` adds a line: the
    products in lanes (`_add_lanes`), the lanes by `_halving_tree` (gp, lane and lane_abs: the pass's buffers)."""
    grad, p, u, g, c, floor, gp, lane, lane_abs = data
    gr, pr = grad[r], p[r]
    for j in range(gp.size):
        gp[j] = gr[j] * pr[j]
    lane[:] = 0.0
    lane_abs[:] = 0.0
    _add_lanes(gp, lane, lane_abs)
    return g * _halving_tree(lane_abs), _halving_tree(lane)


@njit(cache=True, nogil=True, inline="always")
def _backward_block_terms(r: int, start: int, stop: int, st: tuple, data: tuple) -> tuple:
    """`_band_softmax_backward`'s terms for values start:stop of row r: grad and p there, the row's g sum|grad p| and
    sum grad p, u, c, floor."""
    grad, p, u, g, c, floor, gp, lane, lane_abs = data
    return grad[r, start:stop], p[r, start:stop], st[0], st[1], u, c, floor


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _band_softmax_backward(j: int, x: float, terms: tuple) -> float:
    """`softmax_backward_bound`'s E, finished, at value j (x: the output's) of a row's block."""
    gb, pb, inner, total, u, c, floor = terms
    return _softmax_backward_e(gb[j], pb[j], x, inner, total, u) * c + floor


def round_near_softmax_backward(grad: np.ndarray, p: np.ndarray, u: float, g: float, c: float, floor: float,
                                v: np.ndarray, factor: float, limit: float, out: np.ndarray, cand: np.ndarray,
                                held: np.ndarray, e_cand: np.ndarray, plus: float = -0.0) -> tuple[int, int]:
    """`round_near` for float64 work at bits = 32 on a softmax backward's output v, flat, of grad and the softmax p
    (rows, n), with the band e = `softmax_backward_bound`'s E computed as it goes, from the row sums of |grad p|
    and grad p as `sums_with_abs` adds them (in the pass: torch's sums there took four passes over the
    operands and two temporaries); also e_cand[:count] = e at the candidates. In parts as `round_near_softmax`."""
    parts = _row_parts(v, grad, p)
    if parts > 1:
        kernels = omp.kernels()
        return kernels.round_near_rows(kernels.ROWS_BACKWARD, parts, grad, p, v, out, cand, held, e_cand,
                                       (factor, limit, plus, u, 0.0, g, c, floor))
    return _round_near_softmax_backward(grad, p, u, g, c, floor, v, factor, limit, out, cand, held, e_cand, plus)


@njit(cache=True, nogil=True, error_model="numpy")
def _round_near_softmax_backward(grad: np.ndarray, p: np.ndarray, u: float, g: float, c: float, floor: float,
                                 v: np.ndarray, factor: float, limit: float, out: np.ndarray, cand: np.ndarray,
                                 held: np.ndarray, e_cand: np.ndarray, plus: float) -> tuple[int, int]:
    n = p.shape[1]
    data = (grad, p, u, g, c, floor, np.empty(n), np.empty(min(n, SUM_LANES)), np.empty(min(n, SUM_LANES)))
    return _row_kernel(v, out, n, _backward_stats, _backward_block_terms, data, _band_softmax_backward, factor, limit,
                       cand, held, e_cand, plus)
