"""Grains: whole ops whose every output is computed exactly on any device (DESIGN.md §1.3, §1.3b).

vtrain.resolve certifies single output elements, those that land within the band of a rounding boundary:
every term of the element's sum is an integer multiple of a power of two q (its grain, a product of lowest
set bits), and S = sum |terms| < 2^p q for the work dtype's precision p. Then every partial sum, in any
order and grouping, FMA or not, is an integer multiple of q below 2^p q in magnitude: representable, so
no device rounds anywhere and all of them hold the exact value.

On quantised data this holds for nearly every element of some ops at once: a first layer's sums over
k/16 pixels, a bias gradient (a sum of FP32-grid values over a batch, in float64), and their exact ties
(about 1 % of those outputs) were candidates that the trainer gathered E at and certified one by one,
~100 us an op on a small model and ~1 ms a step on the 1024-wide MLP's first layer. Here the test runs
on the whole op first, from per-line statistics, with no band: where it passes, the op's rounded output
is the rounding of its exact value on every device, so it has no candidates, no log entries and, under
the exact resolution, nothing ambiguous.

Statistics per line (a row of a matmul's left operand, a column of its right one, an image or an output
channel of a convolution, a reduced slice of a sum): L1 = sum |x|, M = max |x|, q = the smallest lsb
(nonzero values only). A dot product of line i of a with line j of b has S <= min(L1a_i Mb_j, Ma_i L1b_j)
and grain qa_i qb_j; so every element is exact when, for each row i,
    min(L1a_i MB, Ma_i LB) / qa_i + CQ / qa_i < 2^(p-1),   MB, LB, CQ = max over j of Mb_j, L1b_j, |c_j| / qb_j
(an addend c_j brings its own grain qc_j too: S + |c_j| < 2^(p-1) qc_j, tested with the maxima over j of
Mb_j, L1b_j and |c_j| / qc_j). The factor 2 below 2^p covers the rounding of these float64 statistics (a
relative K 2^-53) and keeps the test inside the element certificate's (whose S comes from E with a
relative slack below 2^-15): an element proven here is one vtrain.resolve would certify, so logs are what
they were without this module. Grains must stay far above the dtype's underflow (QMIN), where E's
absolute floor would matter.

Cost: an op with FP32-grid values on both sides of a dot product longer than ~64 terms fails at any pair of
nonzero lines (S/q >= K 2^46), so the test probes first: 16 lines of an operand laid along memory, the first
16 terms of every line of one laid across it (`_probe`), some 16 x 1024 values. Otherwise the
columns are read in full, then the rows a chunk at a time, stopping at the first chunk with a failure.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import torch
from numba import njit

from vtrain import fused
from vtrain.bounds import _FUSED_SUM_ELEMENTS

aten = torch.ops.aten

# the smallest grain a whole op may have, per output dtype: far above E's absolute floor (bounds._floor_unit)
QMIN = {torch.float64: 2.0**-1000, torch.float32: 2.0**-120}
PRECISION = {torch.float64: 53, torch.float32: 24}
_NONE = 1 << 30  # the lsb exponent of a line with no nonzero finite value: no grain (2^_NONE is inf)
_CHUNK = 256  # lines of a per pass: an op that fails stops within a chunk
_PROBE = 16  # lines (or terms of every line) that the probe reads (`_probe`)


@njit(cache=True, nogil=True, inline="always")
def _lsb_exp(b: int, mant: int, emask: int, bias: int) -> int:
    # The binary exponent of a value's lowest set bit, from its bit pattern, in integer arithmetic that LLVM
    # vectorises (no table lookup): the lowest set bit of the significand (implicit bit included) is
    # sig & -sig, a power of two whose float64 conversion is exact and whose exponent field is its log2.
    # Zeros, infinities and NaN count as no grain (the caller's L1 turns infinite or NaN for the last two).
    e = (b >> mant) & emask
    sig = (b & ((1 << mant) - 1)) | (np.int64(e != 0) << mant)
    low = sig & -sig
    log2 = (np.float64(low).view(np.int64) >> 52) - 1023
    return _NONE if (low == 0) | (e == emask) else log2 + max(e, 1) - bias - mant


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _stats(x: np.ndarray, bits: np.ndarray, along: bool, first: int, last: int, mant: int, emask: int,
           bias: int, l1: np.ndarray, mx: np.ndarray, q: np.ndarray, terms: int = -1) -> None:
    """Lines first..last-1 of the C-contiguous x (its rows if `along`, else its columns: a transposed operand,
    read along memory for all lines at once; bits: x's integer view), into [0, last - first) of: L1, max |x|,
    smallest lsb (inf for a line with no nonzero value). L1 is summed in any order (reassociated, so LLVM
    vectorises it): it only bounds S within the factor 2 of the module docstring. max |x| and the lsb are
    integer minima and maxima of bit patterns (non-negative floats order as their bits). `terms` >= 0 reads
    only the first `terms` of each line (columns only: `_probe`)."""
    n = last - first
    sign = (1 << (8 * bits.itemsize - 1)) - 1
    low = np.full(n, _NONE)
    top = np.zeros(n, bits.dtype)
    l1[:n] = 0.0
    if along:
        for t in range(n):
            row, brow = x[first + t], bits[first + t]
            s = 0.0
            for k in range(row.size):
                s += abs(np.float64(row[k]))
            m, lo = top[t], low[t]
            for k in range(brow.size):
                m = max(m, brow[k] & sign)
                lo = min(lo, _lsb_exp(brow[k], mant, emask, bias))
            l1[t], top[t], low[t] = s, m, lo
    else:
        for k in range(x.shape[0] if terms < 0 else min(terms, x.shape[0])):
            # (the row's stretch as a slice from 0: indexed from `first` on, an index not known to be >= 0, its
            # reads went through numba's negative-index wraparound, as gathers)
            row, brow = x[k, first:last], bits[k, first:last]
            for t in range(n):
                l1[t] += abs(np.float64(row[t]))
                top[t] = max(top[t], brow[t] & sign)
                low[t] = min(low[t], _lsb_exp(brow[t], mant, emask, bias))
    for t in range(n):
        if bits.itemsize == 8:
            mx[t] = np.int64(top[t]).view(np.float64)
        else:
            mx[t] = np.float64(np.int32(top[t]).view(np.float32))
        q[t] = np.inf if low[t] == _NONE else math.ldexp(1.0, low[t])


@njit(cache=True, nogil=True)
def _columns(lb: np.ndarray, mb: np.ndarray, qb: np.ndarray, c: np.ndarray, cb: np.ndarray, cm: int, ce: int,
             cbias: int, qmin: float) -> tuple:
    """What every row's test needs of the columns (statistics lb, mb, qb; addends c, with bits cb):
    (usable, max Mb/qb, max L1b/qb, max |c|/qb, max Mb/qc, max L1b/qc, max |c|/qc, min qb), the qc maxima over
    the nonzero addends. Not usable: an infinity or NaN, an addend's grain below qmin, or a maximum that
    overflowed (no certificate then; and it keeps 0 * inf out of the tests)."""
    mbr = lbr = cq = mc = lc = cc = 0.0
    qbmin = np.inf
    for j in range(lb.size):
        if not (lb[j] < np.inf):
            return False, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
        mbr, lbr, qbmin = max(mbr, mb[j] / qb[j]), max(lbr, lb[j] / qb[j]), min(qbmin, qb[j])
        if c.size:
            cj = abs(np.float64(c[j]))
            if not (cj < np.inf):
                return False, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
            if cj != 0:
                qc = math.ldexp(1.0, _lsb_exp(cb[j], cm, ce, cbias))
                if not qc >= qmin:
                    return False, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0
                cq, mc, lc, cc = max(cq, cj / qb[j]), max(mc, mb[j] / qc), max(lc, lb[j] / qc), max(cc, cj / qc)
    usable = mbr < np.inf and lbr < np.inf and cq < np.inf and mc < np.inf and lc < np.inf and cc < np.inf
    return usable, mbr, lbr, cq, mc, lc, cc, qbmin


@njit(cache=True, nogil=True)
def _row_exact(la: float, ma: float, qa: float, cols: tuple, limit: float, qmin: float) -> bool:
    """Whether row i's elements are exact against every column: S_ij + |c_j| < limit qa_i qb_j and, for a
    nonzero addend, < limit qc_j (module docstring), from the columns' maxima. NaN fails every test."""
    _, mbr, lbr, cq, mc, lc, cc, qbmin = cols
    if not (la < np.inf and qa * qbmin >= qmin):
        return False
    return min(la * mbr, ma * lbr) / qa + cq / qa < limit and min(la * mc, ma * lc) + cc < limit


@njit(cache=True, nogil=True)
def _probe(x: np.ndarray, bits: np.ndarray, along: bool, mant: int, emask: int, bias: int) -> tuple:
    """(L1, max |x|, smallest lsb) of a few lines read cheaply: the first _PROBE lines in full where they run
    along memory, else every line over its first _PROBE terms only (one contiguous block: a line across
    memory costs a cache miss a term). Partial lines give lower bounds of L1 and max |x| and an upper bound
    of the lsb, and the test is monotone in each, so what fails on them fails on the whole lines too."""
    lines = min(x.shape[0], _PROBE) if along else x.shape[1]
    l1, mx, q = np.empty(lines), np.empty(lines), np.empty(lines)
    _stats(x, bits, along, 0, lines, mant, emask, bias, l1, mx, q, _PROBE)
    return l1, mx, q


@njit(cache=True, nogil=True)
def _bilinear_exact(a: np.ndarray, ab: np.ndarray, a_along: bool, am: int, ae: int, abias: int,
                    b: np.ndarray, bb: np.ndarray, b_along: bool, bm: int, be: int, bbias: int,
                    c: np.ndarray, cb: np.ndarray, cm: int, ce: int, cbias: int, limit: float, qmin: float) -> bool:
    """Whether every sum_k a_ik b_jk (+ c_j) is exact in any order (module docstring): a's lines are the rows,
    b's the columns, c empty or one addend per column."""
    rows = a.shape[0] if a_along else a.shape[1]
    n = b.shape[0] if b_along else b.shape[1]
    la, ma, qa = np.empty(_CHUNK), np.empty(_CHUNK), np.empty(_CHUNK)
    lb, mb, qb = np.empty(n), np.empty(n), np.empty(n)
    # the probe first: an op that fails, fails there (module docstring)
    pl, pm, pq = _probe(a, ab, a_along, am, ae, abias)
    cl, cmx, cq = _probe(b, bb, b_along, bm, be, bbias)
    cols = _columns(cl, cmx, cq, c[:cl.size], cb[:cl.size], cm, ce, cbias, qmin)
    if not cols[0]:
        return False
    for t in range(pl.size):
        if not _row_exact(pl[t], pm[t], pq[t], cols, limit, qmin):
            return False
    _stats(b, bb, b_along, 0, n, bm, be, bbias, lb, mb, qb)
    cols = _columns(lb, mb, qb, c, cb, cm, ce, cbias, qmin)
    if not cols[0]:
        return False
    for first in range(0, rows, _CHUNK):
        last = min(rows, first + _CHUNK)
        _stats(a, ab, a_along, first, last, am, ae, abias, la, ma, qa)
        for t in range(last - first):
            if not _row_exact(la[t], ma[t], qa[t], cols, limit, qmin):
                return False
    return True


@njit(cache=True, nogil=True)
def _lines_exact(x: np.ndarray, bits: np.ndarray, along: bool, mant: int, emask: int, bias: int, limit: float,
                 qmin: float) -> bool:
    """Whether every line's sum is exact in any order: L1 < limit q and q >= qmin."""
    lines = x.shape[0] if along else x.shape[1]
    l1, mx, q = np.empty(_CHUNK), np.empty(_CHUNK), np.empty(_CHUNK)
    first, size = 0, 1  # the first line alone first
    while first < lines:
        last = min(lines, first + size)
        _stats(x, bits, along, first, last, mant, emask, bias, l1, mx, q)
        for t in range(last - first):
            if not (q[t] >= qmin and l1[t] < limit * q[t]):
                return False
        first, size = last, _CHUNK
    return True


def _operand(t: torch.Tensor) -> tuple[np.ndarray, np.ndarray, bool, int, int, int]:
    """(x, its integer view, whether its rows are the lines, mantissa bits, exponent mask, exponent bias) for
    `_stats`, whose lines are t's rows: t itself or, for a transposed t, t.T read by columns (no copy), else
    a contiguous copy."""
    x, transposed = fused.contiguous_lines((t.detach() if t.requires_grad else t).numpy())
    bits, mant, emask, bias = fused._layout(x)
    return x, bits, not transposed, mant, emask, bias


def _takes(out: torch.Tensor, *ts: torch.Tensor) -> bool:
    """Whether the kernels take these (float CPU tensors, some elements each) for this output dtype."""
    return out.dtype in PRECISION and all(
        t.is_cpu and t.dtype in (torch.float64, torch.float32) and t.numel() for t in ts)


def bilinear_exact(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, out: torch.Tensor) -> bool:
    """Whether every sum_k a[i, k] b[j, k] + c[j] (a: (M, K), b: (N, K), c: (N,) or None) is computed
    exactly in `out`'s dtype in any order. A line of a or b may hold a superset of an element's terms (a
    convolution's image and output channel), as long as no value enters one element's sum twice."""
    if not _takes(out, a, b, *(() if c is None else (c,))):
        return False
    c = torch.zeros(0, dtype=torch.float64) if c is None else c.contiguous()
    cx = (c.detach() if c.requires_grad else c).numpy()
    cbits, cm, ce, cbias = fused._layout(cx)
    return _bilinear_exact(*_operand(a), *_operand(b), cx, cbits, cm, ce, cbias,
                           2.0**(PRECISION[out.dtype] - 1), QMIN[out.dtype])


def lines_exact(x: torch.Tensor, out: torch.Tensor, divisor: int = 1) -> bool:
    """Whether the sum along each row of the 2-d x (each value at most once in an element's sum), divided by
    `divisor` (a power of two: exact unless it underflows), is computed exactly in `out`'s dtype in any order."""
    if not _takes(out, x):
        return False
    return _lines_exact(*_operand(x), 2.0**(PRECISION[out.dtype] - 1), QMIN[out.dtype] * divisor)


# -- per op: (args, kwargs, outputs) -> whether every output element is exact ---------------------------

ExactAll = Callable[[tuple, dict, Sequence["torch.Tensor | None"], int], bool]


def _mm(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None], i: int) -> bool:
    a, b = args[0], args[1]
    return a.dim() == 2 and b.dim() == 2 and bilinear_exact(a, b.t(), None, outs[0])


def _addmm(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None], i: int) -> bool:
    bias, a, b = args[:3]
    n = b.shape[-1]
    # scaled terms are not multiples of the grain; a bias per output element is not one per column
    if kwargs.get("alpha", 1) != 1 or kwargs.get("beta", 1) != 1 or bias.dim() > 2 \
            or bias.numel() not in (1, n) or (bias.dim() == 2 and bias.shape[0] != 1):
        return False
    return bilinear_exact(a, b.t(), bias.reshape(-1).expand(n), outs[0])


def _lines(t: torch.Tensor, dim: int) -> torch.Tensor:
    """t as (size of `dim`, everything else): one line per index along dim."""
    return t.movedim(dim, 0).reshape(t.shape[dim], -1)


def _convolution(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None], i: int) -> bool:
    from vtrain.resolve import _bind  # noqa: PLC0415 (resolve pulls in mpmath: only convolutions pay)
    kw = _bind(aten.convolution.default, args, kwargs)
    x, w = kw["input"], kw["weight"]
    # An output (n, co, p) sums x[n, ci, p + tap] w[co, ci, tap] over taps and the group's channels, each
    # input value of image n at most once: image n's and channel co's lines bound its S and grain. Input
    # channel 0's part of each line first, in views (see `_convolution_backward`).
    if kw["transposed"] or x.dim() < 3:
        return False
    return (bilinear_exact(_lines(x[:, :1], 0), _lines(w[:, :1], 0), kw["bias"], outs[0])
            and bilinear_exact(_lines(x, 0), _lines(w, 0), kw["bias"], outs[0]))


def _convolution_backward(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None], i: int) -> bool:
    from vtrain.resolve import _bind  # noqa: PLC0415
    kw = _bind(aten.convolution_backward.default, args, kwargs)
    g, x, w = kw["grad_output"], kw["input"], kw["weight"]
    if kw["transposed"] or x.dim() < 3:
        return False
    # Part of each line first, in views: the test is monotone in the lines' statistics (the probe's argument:
    # part of a line bounds its L1 and max |x| below and its grain above), so what fails on parts of the
    # lines fails on the whole lines, and nearly every op fails at once. The whole lines are copies where
    # they run across images (8 MB at resnet-tiny's width 32, ~0.8 ms each), and the probe reads 16 in full.
    if i == 0:  # grad_input[n, ci, p]: g[n, co, .] w[co, ci mod Cg, tap] over co and taps; part: co = 0
        return (bilinear_exact(_lines(g[:, :1], 0), _lines(w[:1], 1), None, outs[0])
                and bilinear_exact(_lines(g, 0), _lines(w, 1), None, outs[0]))
    if i == 1:  # grad_weight[co, cl, tap]: g[n, co, p] x[n, ci, p + tap] over images and positions; part: n = 0
        return (bilinear_exact(_lines(g[:1], 1), _lines(x[:1], 1), None, outs[1])
                and bilinear_exact(_lines(g, 1), _lines(x, 1), None, outs[1]))
    # grad_bias[co]: g[:, co] summed; part: n = 0
    return lines_exact(_lines(g[:1], 1), outs[2]) and lines_exact(_lines(g, 1), outs[2])


def _reduce(mean: bool) -> ExactAll:
    def exact_all(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None], i: int) -> bool:
        x = args[0]
        dim = args[1] if len(args) > 1 else kwargs.get("dim")
        nd = x.dim()
        # Sums that vtrain.bounds takes in its one compiled pass keep the band: it costs about what this test
        # does, and their few candidates less than the test (mlp-xl's 256 x 1024 bias gradients: 0.59 ms a call
        # with the band, 0.87 with the test first). Smaller ones would pay torch's per-call cost for the band.
        if not x.is_floating_point() or not nd or x.numel() >= _FUSED_SUM_ELEMENTS:
            return False
        red = sorted({d % nd for d in dim}) if dim else list(range(nd))
        keep = [d for d in range(nd) if d not in red]
        n = 1
        for d in red:
            n *= x.shape[d]
        # A mean divides by n: exact for a power of two (and the quotient's grain is tested against underflow).
        # n >= 2 keeps this inside the element certificate, whose S, read back from the mean's E, carries
        # the division's rounding u |mean| <= u S / n on top (vtrain.resolve._cert_reduce).
        if mean and (n < 2 or n & (n - 1)):
            return False
        # (2-d: a view whichever dim is reduced; otherwise the reduced dims last, which may copy)
        lines = x.permute(*keep, *red).reshape(-1, n) if nd > 2 or red != [1] else x
        return lines_exact(lines, outs[0], n if mean else 1)

    return exact_all


def _avg_pool(op: Any) -> ExactAll:
    def exact_all(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None], i: int) -> bool:
        from vtrain.resolve import _bind, exact_pool_divisor  # noqa: PLC0415
        kw = _bind(op, args, kwargs)
        div = exact_pool_divisor(kw)
        src = kw["grad_output"] if op is aten.avg_pool2d_backward.default else kw["self"]
        if not div or src.dim() < 3:
            return False
        # a window (forward) or the windows over a pixel (backward) sum values of one plane, each once
        return lines_exact(src.reshape(-1, src.shape[-2] * src.shape[-1]), outs[0], div)

    return exact_all


EXACT_ALL: dict[Any, ExactAll] = {
    aten.mm.default: _mm,
    aten.addmm.default: _addmm,
    aten.convolution.default: _convolution,
    aten.convolution_backward.default: _convolution_backward,
    aten.sum.default: _reduce(mean=False),
    aten.sum.dim_IntList: _reduce(mean=False),
    aten.mean.default: _reduce(mean=True),
    aten.mean.dim: _reduce(mean=True),
    aten.avg_pool2d.default: _avg_pool(aten.avg_pool2d.default),
    aten.avg_pool2d_backward.default: _avg_pool(aten.avg_pool2d_backward.default),
}
