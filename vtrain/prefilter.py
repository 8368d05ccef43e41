"""A cheap upper bound of a large matmul's error bound, for the trainer's boundary filter (DESIGN.md §1.3).

The trainer (and the exact resolution) must find every output element within the band 2E of a rounding
boundary, E = gamma_K (|A| |B|) elementwise (vtrain.bounds). Computing |A| |B| everywhere is a second
matmul as large as the op itself (in float32 for float64 work, still half its time). But only a few
elements in a thousand lie anywhere near a boundary, and the auditor needs E only at its log's entries.
So for large matmuls the engine filters twice:

1. U >= E everywhere, from the operands' line norms (Cauchy-Schwarz):
       sum_k |a_ik| |b_kj|  <=  ||a_i||_2 ||b_j||_2,
   an outer product that the rounding kernel builds as it goes (`Prefilter`, fused.round_near_outer): no
   matmul and no U in memory. The elements farther than factor * U from every boundary are certainly
   farther than factor * E; the others are candidates.
2. E at the candidates only (BOUNDS_AT here: K products per position in one compiled loop), or, where
   there are too many of them (`gather_pays`), from the full bound. Either way the engine then decides
   with E itself, exactly as it would with E computed everywhere. (So the exact resolution and the auditor;
   the recording trainer logs with U itself at its candidates, since session 51: vtrain.rounding.UPPER_BAND;
   `Prefilter.at`'s values, computed from the factors in the compiled selection of its entries, fused.logged.)

Where it pays (measured with the lead's A/B scripts and benchmarks/bench_rounding.py on MLPs of width
1024 and 2048, whose three matmuls per layer are a linear layer's x @ W^T, g @ W and g^T @ x): U is loose
by about sqrt(mean x^2 mean y^2) / (mean |x| mean |y|), 1.6-2x on relu-masked Gaussian operands, so the
candidates grow by that much, still ~0.1 % of the outputs. (Session 5's U, Cauchy-Schwarz per block of 32
terms summed by a matmul, was as loose within 2 %, at 1,449 against 1,477 candidates on the 2048-wide
forward, 3,108 against 3,144 on g @ W, and cost that matmul, a U in memory and its reading: 38 against 14
ms a step.) E is then gathered in one compiled loop. Where
b's columns are contiguous (x @ W^T) each position's dot runs on its own, ~1 ns a term. Where they are
strided (g @ W, g^T @ x) a column per position would cost a cache miss per term, so all positions advance
together, one row of b at a time (`_abs_dots_by_rows`): on the 2048-wide MLP's g @ W, 26 against 65 ms for
4,000 positions; four rows a pass then made it 16 against 22 ms for 7,160. A weight gradient's U alone
would be useless: where products vanish pairwise (a relu unit's activations and another's gradients
nonzero on disjoint samples) the norms mix them, and U exceeds E by orders of magnitude at a few percent
of the elements. But those sums have no nonzero term at all, so bitsets of
each row's and column's nonzeros (`Prefilter.nonzero`) drop them before E is gathered, leaving about as
many candidates as E itself. On the input gradient g @ W the pre-filter replaced a 97 ms full bound by
U and the gathers, 36 ms (2048-wide MLP, batch 512, in the engine).
Everything depends on the operands' layout and the candidate count only, a pure function of the op's
inputs, so a run and its resumption decide alike.

Convolutions (2-d and 1-d, not transposed) take the same two steps, with U from window norms: Cauchy-Schwarz
over each output's window (forward), over the outputs whose windows cover a pixel (input gradient), over
each output row and the input row its tap reads (weight gradient) or over whole channels (bias gradient), in
compiled passes that read each operand once for all the op's outputs (`_convolution_upper`). U is looser
there (2-8x E at the median on the test cases, against 1.6-2x for matmuls), but float64 work's bands are so
narrow that the resnet-tiny example's convolutions keep 0-4 candidates a call, and E gathered at them
(BOUNDS_AT, compiled loops; also the auditor's, at its log's entries) replaces a full bound that cost as
much as the convolution itself. (An earlier bound from line statistics had measured no cheaper than the
full bound, commit 63837b3.)

U must bound the E that BOUNDS_AT computes in floating point, and the full bound's (the float32 path of
`bounds.abs_bounds`), not only the exact one: see the factors in `_matmul_upper`. BOUNDS_AT's E is at
most gamma_k (1 + 2 gamma_k + 2^-20) times its computed sum of |terms| plus k floor units. U is
computed in float64 (at most K + 8 roundings of 2^-53 below the exact product of norms; a line with a
nonzero value below 2^-500, whose square could underflow, leaves the op to the full bound) and carries,
besides those factors, a relative 2^-8 and an absolute 8 (k + 1) floor units of the work dtype (bounds._floor_unit).
tests/numerics/test_num_prefilter.py checks U against both bounds on adversarial operands.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch
from numba import njit

from vtrain import bounds, fused, inline, omp
from vtrain.bounds import PositionBound, _finish, _floor_unit, _mm_operands, gamma, unit_roundoff

aten = torch.ops.aten

# Outputs x K below this: the full bound's extra matmul is cheap enough. Float64 work's bands are ~2^-29 of a
# grid spacing per term, so U leaves few candidates from small ops on: on GPT-2-tiny (256 x 64 @ 64 x 256 and
# the like, 2^22 products) the steps took 0.95x the time of the old threshold, 2^27, with identical logs,
# and the MLP and CNN examples, mlp-wide, mlp-xl and mlp-xxl none longer. (Session 6 had measured the
# 2048-wide MLP's first weight gradient at 2^26 products taking U and then the full bound anyway, 17 against
# 5 ms; since the kernels' later passes it runs no slower than the full bound alone.) Float32 work's bands
# span a good part of a spacing once K reaches ~100, so its candidates are too many to gather below 2^27:
# the scale MLP's steps took 1.16x as long at 2^16. (Float64 work at bits = 32 takes matmuls of up to
# vtrain.inline.INLINE_PRODUCTS in the rounding kernel, from the same norms, before this is asked.)
MIN_PRODUCTS = {torch.float64: 1 << 18, torch.float32: 1 << 27}
# Gathering E at one candidate (K products, gathered row and column) costs about this many times the share
# of one output element in the full bound's matmul (measured on CPU, float64 work: benchmarks/bench_rounding.py)
GATHER_COST = 128
# and in a convolution's, whose float32 full bound runs far below a matmul's speed: on the resnet-tiny
# example's layers a backward's full bound took 560-900 us for 4.7 M products (~0.15 ns each), gathering
# ~1 ns a product plus ~40 us a call (a weight gradient's 8,192 products a candidate: 32 in 265-300 us)
CONV_GATHER_COST = 16


@dataclass(frozen=True)
class Prefilter:
    """U >= E over the whole output (B, M, N), kept as its factors: U[n, i, j] = rows[n, i] * cols[n, j] +
    add[n, j], float64, computed with those two roundings wherever it is used. And (for sums without an
    addend) which positions' sums have a nonzero term: the others are exact zeros on every device, E there
    is k floor units (bounds._floor_unit: 2^-1022 each for the float64 work the kernels filter), and no grid
    boundary is within any band of them (the nearest, half FP32's smallest subnormal, is 2^-150)."""

    rows: np.ndarray
    cols: np.ndarray
    add: np.ndarray
    shape: torch.Size
    dtype: torch.dtype
    nonzero: Callable[[torch.Tensor], torch.Tensor] | None = None
    # the bitsets `nonzero` reads: (B, M, words) of a's rows and (B, N, words) of b's columns, bit k of a
    # line set where its k-th value is nonzero (for fused.round_near_outer, which drops those sums itself)
    support: tuple[np.ndarray, np.ndarray] | None = None

    def upper(self) -> torch.Tensor:
        """U in the output's shape and dtype, for the filters that do not build it as they go. (float32
        work: rounding U to float32 takes at most 2^-24 of its 2^-8 slack.)"""
        rows, cols, add = (torch.from_numpy(x) for x in (self.rows, self.cols, self.add))
        return (rows[:, :, None] * cols[:, None, :] + add[:, None, :]).to(self.dtype).view(self.shape)

    def at(self, pos: torch.Tensor) -> torch.Tensor:
        """U at flat positions `pos` of the output, `upper`'s values there (the same two roundings, then the
        output's dtype), in numpy: a few hundred positions a call."""
        m, n = self.rows.shape[1], self.cols.shape[1]
        batch, rem = np.divmod(pos.numpy(), m * n)
        rows, cols = np.divmod(rem, n)
        u = self.rows[batch, rows] * self.cols[batch, cols] + self.add[batch, cols]
        return torch.from_numpy(u.astype(_NUMPY_DTYPES[self.dtype], copy=False))


# (args, kwargs, outputs[, LineNorms]) -> U of each output (None: that output takes the full bound), or None for all
Upper = Callable[..., "list[Prefilter | None] | None"]


_CONVOLUTIONS = frozenset(str(op) for op in (aten.convolution.default, aten.convolution_backward.default))


def gather_pays(op: str, candidates: int, outputs: int) -> bool:
    """Whether gathering E at `candidates` of the op named `op`'s `outputs` elements is cheaper than the full
    bound, at GATHER_COST (CONV_GATHER_COST for a convolution) per candidate relative to an output's share of
    the full bound. The trainer's pre-filter and the auditor's entries ask alike."""
    return candidates * (CONV_GATHER_COST if op in _CONVOLUTIONS else GATHER_COST) <= outputs


def _envelope(kk: int, k: int, largest: float, dtype: torch.dtype) -> tuple[float, float]:
    """(factor, floor): U = factor * (a product of norms that bounds an output's sum of |terms|) + floor lies
    above both E of BOUNDS_AT (factor g c (1 + 2 gamma_(k+4)), absolute kk floor units) and the full bound's
    float32 path (bounds.abs_bounds: g c (1 + gamma32_(k+2)) (1 + 2^-21) over float32 sums that may exceed
    the exact one by gamma32_(k+2) relative and by 2^-150 for each product or partial sum that float32
    rounds up below its normal range, absolute (k + 1) 2^-148 (1 + 3 max|operand|) g c; so U's floor takes
    (k + 1) 2^-147 (1 + 3 max|operand|) g c), so that U's candidates are a superset of either's. kk: the
    output's term count (its gamma); k >= the sum lengths the float32 path sees; largest >= every |operand|.
    (A review found U below the full bound with 2^-148 where products of operands near 2^-72 fell below
    float32's normal range.)"""
    factor, c, head, tail = _envelope_terms(kk, k, dtype)
    return factor, _envelope_floor(largest, c, head, tail)


@njit(cache=True, nogil=True)
def _envelope_floor(largest: float, c: float, head: float, tail: float) -> float:
    """`_envelope`'s floor from `_envelope_terms`' (c, head, tail) (compiled: `_upper_terms` takes it too)."""
    return head * (1 + 3 * largest * (1 + 2.0**-8)) * c * (1 + 2.0**-8) + tail


@functools.lru_cache(maxsize=1024)
def _envelope_terms(kk: int, k: int, dtype: torch.dtype) -> tuple[float, float, float, float]:
    """`_envelope`'s terms that do not depend on the operands, per op shape (the same floating-point operations
    in the same order: a small model's step asks for the same few shapes ~40 times)."""
    u = unit_roundoff(dtype)
    g = gamma(kk, u)
    c = g * (1 + 2 * g + 2.0**-20)
    g32 = gamma(k + 4, 2.0**-24)
    factor = c * (1 + 2 * gamma(k + 4, u)) * (1 + 2 * g32) ** 2 * (1 + 2.0**-20) * (1 + 2.0**-8)
    return factor, c, (max(kk, k) + 1) * 2.0**-147, 8 * (kk + 1) * _floor_unit(dtype)


def _matmul_upper(func: Any) -> Upper:
    def upper(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None],
              norms: LineNorms | None = None) -> list[Prefilter | None] | None:
        pre = _one(args, kwargs, outs, norms)
        return None if pre is None else [pre]

    def _one(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None],
             norms: LineNorms | None) -> Prefilter | None:
        """U >= E at every element of the output (the output's dtype and shape) and the nonzero-term filter,
        or None where the full bound is cheap (a small op), a layout makes the filter cost more than it
        saves, or U would not be finite. The operands' line norms come from `norms` where given."""
        v = outs[0]
        least = MIN_PRODUCTS.get(v.dtype)
        # small ops and other devices' tensors leave before the operands are unpacked (K: the last operand's rows)
        if least is None or v.numel() * args[-1].shape[-2] < least or not v.is_cpu:
            return None
        bias, beta, alpha, a, b, terms = _mm_operands(func, args, kwargs)
        k = a.shape[-1]
        # A linear layer's forward (x @ W^T: both operands run along K), its weight gradient (g^T @ x:
        # neither does, no addend) and its input gradient (g @ W: only a does, no addend).
        forward = a.stride(2) == 1 and b.stride(1) == 1
        weight_grad = bias is None and a.stride(2) != 1
        input_grad = bias is None and a.stride(2) == 1 and b.stride(1) != 1
        if not (forward or weight_grad or input_grad):
            return None
        kk = k + terms
        rows = np.empty((a.shape[0], a.shape[1]))  # the norms of a's rows
        cols = np.empty((b.shape[0], b.shape[2]))  # and of b's columns
        line_norms = _line_norms if norms is None else norms.of
        usable_a, zeros_a = line_norms(a, rows)
        if not usable_a:
            return None
        usable_b, zeros_b = line_norms(b.transpose(1, 2), cols)
        if not usable_b:
            return None
        bias_abs = _NO_BIAS
        if bias is not None and beta != 0 and bias.numel():
            bias_abs = np.abs(_numpy(bias)).astype(np.float64)  # (numpy: torch's calls cost ~15 us on a bias)
            # per column, the largest |bias| over the rows (a 2-d bias: (1, N), (M, 1) or (M, N))
            bias_abs = np.broadcast_to(bias_abs, v.shape).max(0) if bias_abs.ndim == 2 \
                else np.broadcast_to(bias_abs, (b.shape[2],))
        factor, c, head, tail = _envelope_terms(kk, k, v.dtype)  # (the factor goes into the short row norms)
        add = np.empty(cols.shape)
        applies, empty_lines = _upper_terms(rows, cols, float(abs(alpha)), bias_abs, float(abs(beta)), factor, c,
                                           head, tail, v.dtype == torch.float64, add)
        if not applies:
            return None
        # No nonzero-term filter for an input gradient: its W is dense, so the filter would drop nothing, and its
        # bitsets would read W down its strided columns. Nor where every row of a and column of b have more than K
        # nonzeros between them (at most zeros_a and zeros_b zeros of K) but for lines of zeros only: each other pair
        # then shares a nonzero product, so only those lines' sums lack one. Dropout's zeros, a causal mask's and GELU's
        # (none) leave GPT-2's products there (building the bitsets took 0.4 of its 0.57 ms pre-filter of a 16 x 128 x
        # 128 batched product, ~12 ms a step at d_model 256); a relu network's weight gradient, whose units' zeros can
        # cover a line, keeps the filter. Lines of zeros only (not counted by `_norms_both`) have norm zero, so U at
        # their sums (exact zeros) is the floor: no band of it (at most 4 U) reaches the nearest boundary, 2^-150,
        # unless the floor is 2^-152 or more (float32 work's always is; float64 work's for operands of ~2^30 and more),
        # and then the filter drops those sums. Dropout's fully dropped causal rows built the bitsets in 5 of
        # GPT-2-tiny's 12 attention products a step for those rows alone (~0.4 ms each).
        if bias is None and not input_grad and (zeros_a + zeros_b >= k or empty_lines):
            support, nonzero = _nonzero_terms(a, b)
            return Prefilter(rows, cols, add, v.shape, v.dtype, nonzero, support)
        return Prefilter(rows, cols, add, v.shape, v.dtype)

    return upper


# The pre-filter's arithmetic on its ~1K norms a matmul, compiled: numpy's reductions and fills there, on caches
# cold after the matmul, took the pre-filter 14.9 against 14.5 ms a step at GPT-2-tiny d_model 256 (the two
# codes stepping alternately in one process). The same operations as numpy's: a maximum that a NaN makes NaN,
# and one IEEE product a value.
@njit(cache=True, nogil=True)
def _largest(x: np.ndarray) -> float:
    top, nan = -np.inf, False
    for v in x.ravel():
        nan |= v != v
        top = v if v > top else top
    return np.nan if nan else top


@njit(cache=True, nogil=True)
def _upper_terms(rows: np.ndarray, cols: np.ndarray, alpha: float, bias: np.ndarray, beta: float, factor: float,
                 c: float, head: float, tail: float, float64: bool, add: np.ndarray) -> tuple[bool, bool]:
    """U's terms from the line norms rows (B, M) and cols (B, N), |alpha|, the columns' largest |bias| (empty: none)
    and |beta|, `_envelope_terms`' (factor, c, head, tail), in one compiled call (they had been ~12 Python and
    numpy calls a matmul, ~40 us in a training step): rows *= factor |alpha|, add[n, j] = floor + |bias_j| |beta|
    factor. (Whether U applies: finite, and in range; whether the floor is large enough that lines of zeros only
    matter: see `_one`). Python's arithmetic and maxima (the first of equals, NaN as it comes) in its order."""
    a_max, b_max = _largest(rows), _largest(cols)
    largest = b_max if b_max > a_max else a_max  # >= every |operand|
    scale = a_max * b_max * (1 + 2.0**-8) * alpha  # >= every sum of |terms|
    if bias.size:
        bias_max = _largest(bias)
        largest = bias_max if bias_max > largest else largest
        scale += beta * bias_max
    floor = _envelope_floor(largest, c, head, tail)
    # float64 holds U below 2^1000; float32 work's full bound overflows (to an infinite E, which U would not
    # cover) once its float32 sums pass 2^128; an infinite factor: a gamma of 2^24 terms or more in float32's,
    # of 2^53 in float64's
    if not (math.isfinite(factor) and largest < 2.0**400 and (float64 or scale < 2.0**126)):
        return False, False
    # (lines of zeros only, which have norm zero: see `_one`; looked for only where the floor is that large)
    empty_lines = floor >= 2.0**-152 and not (_all_nonzero(rows) and _all_nonzero(cols))
    _scale_fill(rows, factor * alpha, add, floor)
    if bias.size:
        scaled = beta * factor
        for n in range(add.shape[0]):
            for j in range(add.shape[1]):
                add[n, j] += bias[j] * scaled
    return True, empty_lines


@njit(cache=True, nogil=True, inline="always")
def _all_nonzero(x: np.ndarray) -> bool:
    """numpy's x.all() of a float array (NaN counts as nonzero)."""
    for v in x.ravel():
        if v == 0:
            return False
    return True


@njit(cache=True, nogil=True)
def _scale_fill(rows: np.ndarray, scale: float, add: np.ndarray, floor: float) -> None:
    """rows *= scale; add[:] = floor (both contiguous)."""
    flat = rows.ravel()
    for i in range(flat.size):
        flat[i] *= scale
    add.ravel()[:] = floor


# -- convolutions: E gathered at positions, in compiled loops ---------------------------------------------
# The same sums as bounds.BOUNDS_AT's torch gathering (through vtrain.resolve's term gathering), which costs
# ~300 us a call in small torch operations: each position's |terms| summed in float64 straight from the
# tensors, the window's padding and strides skipped. Any order: see `bounds._finish`.


@njit(cache=True, nogil=True, inline="always")
def _unravel4(q: int, n1: int, n2: int, n3: int) -> tuple[int, int, int, int]:
    """Row-major coordinates of flat position q in a 4-d array whose last three sizes are n1, n2, n3."""
    i3, q = q % n3, q // n3
    i2, q = q % n2, q // n2
    return q // n1, q % n1, i2, i3


@njit(cache=True, nogil=True, inline="always")
def _inside(count: int, step: int, offset: int, size: int) -> tuple[int, int]:
    """[first, last) of the indices o < count whose o * step + offset lies in [0, size): a window's taps
    or outputs that fall inside the image (step >= 1; floor divisions; first <= last, so that a slice
    [first:last] is empty where the range is, never wrapped around by a negative end)."""
    first = max(0, -(offset // step))
    return first, max(first, min(count, (size - 1 - offset) // step + 1))


@njit(cache=True, nogil=True, inline="always")
def input_taps(y: int, z: int, geometry: np.ndarray, oh: int, ow: int, tap_a: np.ndarray, tap_y: np.ndarray,
               tap_b: np.ndarray, tap_z: np.ndarray) -> tuple[int, int]:
    """The taps through which a convolution's output gradients (OH x OW) reach input pixel (y, z): tap_a[:na]
    with their output rows tap_y[:na], tap_b[:nb] with their columns tap_z[:nb]; (na, nb). Geometry: stride,
    padding, dilation (s0, s1, p0, p1, d0, d1); the taps' counts are the arrays' sizes (KH, KW)."""
    s0, s1, p0, p1, d0, d1 = geometry[0], geometry[1], geometry[2], geometry[3], geometry[4], geometry[5]
    na = nb = 0
    for a in range(tap_a.size):
        ty = y + p0 - a * d0
        if ty >= 0 and ty % s0 == 0 and ty // s0 < oh:
            tap_a[na], tap_y[na], na = a, ty // s0, na + 1
    for b in range(tap_b.size):
        tz = z + p1 - b * d1
        if tz >= 0 and tz % s1 == 0 and tz // s1 < ow:
            tap_b[nb], tap_z[nb], nb = b, tz // s1, nb + 1
    return na, nb


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _conv_abs_forward(x: np.ndarray, w: np.ndarray, bias: np.ndarray, pos: np.ndarray, geometry: np.ndarray,
                      groups: int, out: np.ndarray) -> None:
    """out[t] = sum |x| |w| (+ |bias|) of convolution output pos[t] ((N, Co, OH, OW), row-major); geometry:
    stride, padding, dilation (two each), OH, OW."""
    s0, s1, p0, p1, d0, d1, oh, ow = geometry
    c_out, c_g, kh, kw = w.shape
    co_g = c_out // groups
    for t in range(pos.size):
        n, co, oy, oz = _unravel4(pos[t], c_out, oh, ow)
        c0, acc = (co // co_g) * c_g, 0.0
        # the taps inside the image: rows y = y0 + a d0, columns z = z0 + b d1
        y0, z0 = oy * s0 - p0, oz * s1 - p1
        a0, a1 = _inside(kh, d0, y0, x.shape[2])
        b0, b1 = _inside(kw, d1, z0, x.shape[3])
        for ci in range(c_g):
            for a in range(a0, a1):
                xrow, wrow = x[n, c0 + ci, y0 + a * d0], w[co, ci, a]
                for b in range(b0, b1):
                    acc += abs(np.float64(xrow[z0 + b * d1])) * abs(np.float64(wrow[b]))
        out[t] = acc + (abs(np.float64(bias[co])) if bias.size else 0.0)


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _conv_abs_input(g: np.ndarray, w: np.ndarray, pos: np.ndarray, geometry: np.ndarray, groups: int,
                    shape: np.ndarray, out: np.ndarray) -> None:
    """out[t] = sum |grad| |w| of grad_input position pos[t] (shape: N, Cin, H, W)."""
    c_out, c_g, kh, kw = w.shape
    co_g, h, wd = c_out // groups, shape[2], shape[3]
    # The taps through which output gradients reach the pixel, and the outputs they come from, found once a
    # position: in the channel loop their divisions and tests had cost ~10 us a position (resnet-tiny width 32).
    tap_a, tap_y, tap_b, tap_z = (np.empty(kh, np.int64), np.empty(kh, np.int64), np.empty(kw, np.int64),
                                  np.empty(kw, np.int64))
    for t in range(pos.size):
        n, ci, y, z = _unravel4(pos[t], shape[1], h, wd)
        na, nb = input_taps(y, z, geometry, g.shape[2], g.shape[3], tap_a, tap_y, tap_b, tap_z)
        acc, cl = 0.0, ci % c_g
        for co in range((ci // c_g) * co_g, (ci // c_g + 1) * co_g):
            for i in range(na):
                grow, wrow = g[n, co, tap_y[i]], w[co, cl, tap_a[i]]
                for j in range(nb):
                    acc += abs(np.float64(grow[tap_z[j]])) * abs(np.float64(wrow[tap_b[j]]))
        out[t] = acc


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _conv_abs_weight(g: np.ndarray, x: np.ndarray, pos: np.ndarray, geometry: np.ndarray, groups: int,
                     shape: np.ndarray, out: np.ndarray) -> None:
    """out[t] = sum |grad| |x| of grad_weight position pos[t] (shape: Co, Cg, KH, KW)."""
    s0, s1, p0, p1, d0, d1 = geometry[:6]
    c_out, c_g, kh, kw = shape
    co_g = c_out // groups
    # per position: output channel, input channel, the output rows [y0, y1) and columns [z0, z1) whose tap reads
    # inside the image (the inner loop has no tests), the input column of output column z0, the tap's row offset
    at = np.empty((pos.size, 8), np.int64)
    for t in range(pos.size):
        co, cl, a, b = _unravel4(pos[t], c_g, kh, kw)
        y0, y1 = _inside(g.shape[2], s0, a * d0 - p0, x.shape[2])
        z0, z1 = _inside(g.shape[3], s1, b * d1 - p1, x.shape[3])
        at[t] = (co, (co // co_g) * c_g + cl, y0, y1, z0, z1, z0 * s1 - p1 + b * d1, a * d0 - p0)
        out[t] = 0.0
    # Image by image, every position's terms there: an image's planes (256 + 256 KB at resnet-tiny width 32) stay
    # in L2 for the positions that share a channel, where position by position each read its 32 images' planes
    # from memory again (161 positions of a 32 x 32 x 3 x 3 weight gradient: 2.8 against 4.0 ms)
    for n in range(g.shape[0]):
        for t in range(pos.size):
            co, ci, y0, y1, z0, z1, z, ya = at[t]
            acc = 0.0
            for oy in range(y0, y1):
                grow, xrow = g[n, co, oy, z0:z1], x[n, ci, oy * s0 + ya]
                if s1 == 1:  # (contiguous slices: vectorised loads; reassociated, LLVM vectorises the sum)
                    xs = xrow[z:z + z1 - z0]
                    for k in range(grow.size):
                        acc += abs(np.float64(grow[k])) * abs(np.float64(xs[k]))
                else:
                    for k in range(grow.size):
                        acc += abs(np.float64(grow[k])) * abs(np.float64(xrow[z + k * s1]))
            out[t] += acc


def _convolution_at(func: Any) -> PositionBound:
    on_device = bounds.BOUNDS_AT[func]  # other devices, dtypes and layouts gather in torch

    def bound_at(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None], i: int,
                 pos: torch.Tensor) -> torch.Tensor:
        """E of output i at flat positions `pos`, as bounds.BOUNDS_AT's, in the compiled loops above."""
        from vtrain.resolve import ResolveError, _bind, _conv_geometry  # noqa: PLC0415 (mpmath: only convolutions pay)
        v = outs[i]
        kw = _bind(func, args, kwargs)
        try:
            x, w, stride, padding, dilation, groups = _conv_geometry(func, kw)
        except ResolveError:  # (transposed and 3-d convolutions)
            return on_device(args, kwargs, outs, i, pos)
        g = kw.get("grad_output")
        ts = [t for t in (x, w, g, kw.get("bias")) if t is not None]
        if not v.is_cpu or any(t.dtype not in (torch.float64, torch.float32) or not t.is_cpu for t in ts):
            return on_device(args, kwargs, outs, i, pos)
        x, w = _numpy(x.contiguous()), _numpy(w.contiguous())
        p = pos.cpu().numpy().astype(np.int64, copy=False)
        s = np.empty(p.size)
        geometry = np.array([*stride, *padding, *dilation, *v.shape[-2:]] if v.dim() == 4 else
                            [*stride, *padding, *dilation, 1, v.shape[-1]], np.int64)
        if func is aten.convolution.default:
            bias = kw["bias"]
            bias = _NO_BIAS if bias is None else _numpy(bias.contiguous())
            _conv_abs(CONV_FORWARD, x, w, bias, p, geometry, groups, np.array(x.shape, np.int64), s)
        else:
            g = _numpy((g.unsqueeze(2) if g.dim() == 3 else g).contiguous())
            if i == 0:
                _conv_abs(CONV_INPUT, g, w, _NO_BIAS, p, geometry, groups, np.array(x.shape, np.int64), s)
            elif i == 1:
                _conv_abs(CONV_WEIGHT, g, x, _NO_BIAS, p, geometry, groups, np.array(w.shape, np.int64), s)
            else:  # grad_bias: channel co's |grad| summed
                s = np.abs(g[:, p]).sum(axis=(0, 2, 3), dtype=np.float64)
        return bounds.convolution_e(func, args, i, torch.from_numpy(s), v.dtype)

    return bound_at


_NO_BIAS = np.zeros(0)

CONV_FORWARD, CONV_INPUT, CONV_WEIGHT = range(3)  # (the kernels' kinds, as vtrain.omp_kernels.conv_abs takes them)
# A gathering of this many terms or more runs in parts on torch's threads: a part of 32K terms takes ~0.1-0.4 ms in
# a training step (its planes come from L2 or memory), several times what waking the team costs.
_SPLIT_TERMS = 1 << 15


def _conv_abs(kind: int, a: np.ndarray, b: np.ndarray, bias: np.ndarray, pos: np.ndarray, geometry: np.ndarray,
              groups: int, shape: np.ndarray, out: np.ndarray) -> None:
    """out = the sums of |terms| at a convolution's flat positions pos: `_conv_abs_forward` (kind CONV_FORWARD, a
    x, b w), `_conv_abs_input` (a the output gradient, b w) or `_conv_abs_weight` (a the output gradient, b x).
    Float64 operands with many terms are split into runs of positions across torch's threads (vtrain.omp): each
    position is summed by one thread in the one pass's order, so out holds the same bits either way. At two
    threads resnet-tiny width 32's 17 gatherings a step took 11.0 ms whole, 7.0 in parts (docs/benchmarks.md,
    session 49)."""
    per = b[0].size if kind == CONV_FORWARD else a[:, 0].size if kind == CONV_WEIGHT else \
        b.shape[0] // groups * b[0, 0].size  # (terms a position)
    usable = a.dtype == b.dtype == bias.dtype == np.float64
    parts = min(omp.parts(pos.size * per, _SPLIT_TERMS), pos.size) if usable else 1
    if parts > 1:
        omp.kernels().conv_abs(parts, kind, a, b, bias, np.ascontiguousarray(pos), geometry, groups, shape, out)
    elif kind == CONV_FORWARD:
        _conv_abs_forward(a, b, bias, pos, geometry, groups, out)
    elif kind == CONV_INPUT:
        _conv_abs_input(a, b, pos, geometry, groups, shape, out)
    else:
        _conv_abs_weight(a, b, pos, geometry, groups, shape, out)


def _lines(x: np.ndarray, n: int) -> tuple[np.ndarray, bool]:
    """x[n], a (lines, K) matrix, as fused.contiguous_lines gives it (a transposed gradient: its transpose).
    The kernels below take one of the two orientations each, typed contiguous, so that LLVM vectorises their
    inner loops (on strided views typed as such it did not: 1.3-4.5 ns an element, against ~0.3)."""
    return fused.contiguous_lines(x[n])


# Squares of magnitudes below this underflow float64's normal range (2^-1022), and a norm built from them
# could fall short of the terms it bounds: lines holding such values leave the op to the full bound.
_TINY_LINE = 2.0**-500


def _line_norms(t: torch.Tensor, out: np.ndarray) -> tuple[bool, int]:
    """out[n, i] = the Euclidean norm of t[n, i, :] (computed in float64, so at most K/2 + 2 roundings of
    2^-53 below the exact norm); (whether every value was finite and none below _TINY_LINE but zero, the most
    zeros in one line t[n, i, :] that has a nonzero value). The same pass as `LineNorms`', the other axis left
    unused."""
    return _norms_into(*_canonical(_numpy(t)), out)


def _norms_into(canon: np.ndarray, rows: bool, out: np.ndarray) -> tuple[bool, int]:
    """`_line_norms` from `_canonical`'s (canon, rows)."""
    along, across, flags = _both_norms(canon)
    out[:] = along if rows else across
    return _axis(flags, rows)


def _canonical(x: np.ndarray) -> tuple[np.ndarray, bool]:
    """(x, True) where x's batches are C-contiguous, (x transposed (0, 2, 1), False) where that one's are,
    else (a C-contiguous copy of x, True): each batch of the first as a row-major matrix, typed contiguous
    for the kernels (see `_lines`), and whether its rows are x's."""
    for canon, rows in ((x, True), (x.transpose(0, 2, 1), False)):
        if all(canon[n].flags.c_contiguous for n in range(canon.shape[0])):
            return canon, rows
    return np.ascontiguousarray(x), True


def _both_norms(canon: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[bool, int, int]]:
    """(the norms of each canon[n]'s rows, of its columns, (usable as `_line_norms` says, the most zeros in
    one row, in one column, of those with a nonzero value)) in one pass (`_norms_both`)."""
    along, across = np.empty(canon.shape[:2]), np.empty((canon.shape[0], canon.shape[2]))
    # On torch's threads where they are several (vtrain.omp: each thread reads the share of the operand it wrote in
    # the op before), in parts of whole row blocks or batches: the norms and flags of one pass, bit for bit
    if canon.shape[0] == 1:
        x = canon[0]
        parts = min(omp.parts(x.size), norm_blocks(x.shape[0])) if x.dtype == np.float64 else 1
        flags = omp.kernels().norms(parts, x, along[0], across[0]) if parts > 1 else \
            _norms_both(x, along[0], across[0])
    else:  # (in one compiled call: bmm's 16-128 slices had been as many; batches apart in memory, rare, are
        # copied together first, the values and so the norms the same)
        x = np.ascontiguousarray(canon)
        parts = min(omp.parts(x.size), x.shape[0]) if x.dtype == np.float64 else 1
        flags = omp.kernels().norms_batched(parts, x, along, across) if parts > 1 else \
            _norms_batched(x, along, across)
    finite, tiny, row_zeros, col_zeros = flags
    return along, across, (bool(finite) and tiny == 0, int(row_zeros), int(col_zeros))


@njit(cache=True, nogil=True)
def _norms_batched(x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> tuple[bool, int, int, int]:
    """`_norms_both` over each x[n] of a C-contiguous (B, M, K) x, its flags combined as `_both_norms` does."""
    finite, tiny, row_zeros, col_zeros = True, 0, 0, 0
    for n in range(x.shape[0]):
        a, b, zr, zc = _norms_both(x[n], rows[n], cols[n])
        finite, tiny, row_zeros, col_zeros = finite and a, tiny + b, max(row_zeros, zr), max(col_zeros, zc)
    return finite, tiny, row_zeros, col_zeros


def _axis(flags: tuple[bool, int, int], rows: bool) -> tuple[bool, int]:
    """`_line_norms`' (usable, most zeros in a line) for canon's rows or its columns."""
    return flags[0], flags[1] if rows else flags[2]


class LineNorms:
    """The line norms of one rounded execution's matmul operands (`_line_norms`), both axes from one pass,
    each kept until its other axis is asked; and its convolution operands' sums of squares (`squares`).

    Every operand of a linear layer is normed along both axes in a training step: x along its rows in the
    forward (x @ W^T) and along its columns in the weight gradient (g^T @ x), W along its rows and then its
    columns (g @ W), the output gradient g along its rows (g @ W) and its columns (g^T @ x); attention's
    queries, keys, values, scores and their gradients alike. A pass reads its operand from memory (on the
    trainer's measurements ~1.2 ns a value, where the norms' arithmetic in cache takes ~0.5), so one pass
    gives both axes (`_norms_both`) and the other use reads nothing: measured in one process with the cache
    on and off step by step, GPT-2-tiny's norms took 18 against 29 ms a step at d_model 256, 42 against 73
    at 512 (session 16; identical logs and states).

    Keyed by the operand's memory (address, layout, dtype) and torch's version counter, which views share
    and every in-place torch op bumps (vtrain.fused_optim's updates, which write through numpy, bump it
    too). An entry holds its tensor: freed memory comes back as other tensors (the allocator, vtrain.spare),
    whose version counters start afresh, and a held tensor's memory cannot. Entries go once both axes have
    been asked (a gradient's memory is not kept past its two uses), the rest with this object at the end of
    the rounded execution. Operands laid out in neither orientation are normed from a copy, uncached."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple] = {}
        self._squares: dict[tuple, tuple] = {}

    def squares(self, t: torch.Tensor) -> Squares:
        """`_conv_squares(t)`, from this cache where it can: a convolution's input and weight are read by its
        forward and again by its backward (and a block's input by two convolutions), 1.2-1.4 ms a read of
        resnet-tiny width 32's 1M-value activations. Keyed and held as the line norms, kept to the end."""
        if t.is_inference():
            return _conv_squares(t)
        key = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, t._version)
        entry = self._squares.get(key)
        if entry is None:
            entry = self._squares[key] = (_conv_squares(t), t)
        return entry[0]

    def of(self, t: torch.Tensor, out: np.ndarray) -> tuple[bool, int]:
        """`_line_norms(t, out)`, from this cache where it can."""
        found, canon = _torch_key(t), None
        if found is not None:  # (the common layouts: no numpy view until the norms are computed)
            key, rows = found
        else:
            x = _numpy(t)
            canon, rows = _canonical(x)
            if t.is_inference() or not np.may_share_memory(canon, x):
                return _norms_into(canon, rows, out)  # (inference tensors have no version counter; a copy: no key)
            key = _numpy_key(t, canon)
        entry = self._entries.get(key)
        if entry is None:
            if canon is None:
                x = _numpy(t)
                canon = x if rows else x.transpose(0, 2, 1)
            # (norms of canon's rows, of its columns, flags, the axes not yet asked, the tensor held)
            entry = self._entries[key] = (*_both_norms(canon), {True, False}, t)
        out[:] = entry[0] if rows else entry[1]
        entry[3].discard(rows)
        if not entry[3]:
            del self._entries[key]
        return _axis(entry[2], rows)


def _numpy_key(t: torch.Tensor, canon: np.ndarray) -> tuple:
    """`LineNorms`' key of operand t, whose batches `_canonical` laid out as canon: t's memory, canon's shape and
    byte strides, its dtype, t's version. (A batch of one's stride is whatever the view that added it chose.)"""
    strides = canon.strides if canon.shape[0] > 1 else (0, *canon.strides[1:])
    return t.data_ptr(), canon.shape, strides, canon.dtype.str, t._version  # (t[0, 0, 0] is canon's too)


_NUMPY_DTYPES = {torch.float64: np.float64, torch.float32: np.float32}
_DTYPE_STR = {t: np.dtype(d).str for t, d in _NUMPY_DTYPES.items()}  # (numpy's dtype.str, as in `_numpy_key`)


def _torch_key(t: torch.Tensor) -> tuple[tuple, bool] | None:
    """(`_numpy_key`, whether canon's rows are t's) from torch's metadata, for the layouts where `_canonical`'s
    choice is plain from the strides: a 3-d t of lines of two or more values each way, every batch row-major
    (canon = t) or column-major (canon = t transposed); None otherwise. The key and the norms are the numpy
    path's (tests/numerics/test_num_prefilter.py); this saves its views and flags, ~25 us a matmul operand."""
    dtype = _DTYPE_STR.get(t.dtype)
    if t.dim() != 3 or dtype is None or t.is_inference():
        return None
    b, m, k = t.shape
    sb, sm, sk = t.stride()
    if m < 2 or k < 2:
        return None
    if sk == 1 and sm == k:
        shape, line, rows = (b, m, k), k, True
    elif sm == 1 and sk == m:
        shape, line, rows = (b, k, m), m, False
    else:
        return None
    item = t.element_size()
    return (t.data_ptr(), shape, (sb * item if b > 1 else 0, line * item, item), dtype, t._version), rows


@njit(cache=True, nogil=True, inline="always")
def _abs_bits(x: float) -> int:
    """|x| as float64 bits: non-negative floats order as their bit patterns (NaN's above infinity's), and
    an integer maximum vectorises where a float one does not."""
    return np.float64(abs(np.float64(x))).view(np.int64)


@njit(cache=True, nogil=True, inline="always")
def _is_tiny(x: float) -> int:
    return (x != 0) & (abs(np.float64(x)) < _TINY_LINE)


@njit(cache=True, nogil=True, inline="always")
def _is_small(x: float) -> int:
    """Whether |x| < _TINY_LINE, zeros included: one comparison, the zeros counted apart subtracted afterwards."""
    return np.int64(abs(np.float64(x)) < _TINY_LINE)


@njit(cache=True, nogil=True, inline="always")
def _is_zero(x: float) -> int:
    return np.int64(x == 0)


_WIDE_ROWS = 512


# Rows a block of `_norms_both`'s column sums: each block's squares are summed apart, and the blocks' sums then in
# order, so that a pass split in parts of whole blocks across threads (vtrain.omp_kernels.norms) gives the one pass's
# norms bit for bit. (A multiple of four: `_four_rows` takes the same rows either way.)
NORM_BLOCK = 256


@njit(cache=True, nogil=True)
def _norms_both(x: np.ndarray, rows: np.ndarray, cols: np.ndarray) -> tuple[bool, int, int, int]:
    # Both axes' sums of squares in one vectorised pass over the row-major x: each value's square goes to its
    # row's sum (reassociated: a norm bounds its sum in any order, see the module docstring) and to its
    # column's; with the values below _TINY_LINE (zeros included) and the zeros of each row and column (integer
    # reductions), of which the most in one row and in one column are returned, of the rows and columns with a
    # nonzero value. (Session 16: one pass per line took 0.44-0.48 ns a value in cache for a row's norm, against
    # 0.7-1.1 for two.) Returns (whether every row's norm is finite, the nonzero values below _TINY_LINE, the
    # most zeros in a row, in a column). An infinity or a NaN leaves its row's norm so, and so does a value whose
    # square passes float64's range (whose U would be infinite: the op takes the full bound either way); read
    # from the norms, not tested value by value (the magnitudes' integer maximum, which that test was, took the
    # pass 0.45 against 0.29 ms on 1024 x 1024 in cache, 0.58 against 0.47 fresh from memory; session 44).
    sq = np.zeros((norm_blocks(x.shape[0]), x.shape[1]))
    zc = np.zeros(x.shape[1], np.int64)
    small, row_zeros = norms_of_blocks(x, rows, sq, zc, 0, sq.shape[0])
    return norms_finish(sq, zc, rows, cols, small, row_zeros)


@njit(cache=True, nogil=True, inline="always")
def norm_blocks(n: int) -> int:
    """How many `NORM_BLOCK`s n rows make (one at least)."""
    return max(1, -(-n // NORM_BLOCK))


@njit(cache=True, nogil=True)
def norms_of_blocks(x: np.ndarray, rows: np.ndarray, sq: np.ndarray, zc: np.ndarray, first: int,
                    last: int) -> tuple[int, int]:
    """`_norms_both`'s pass over row blocks first:last of x: the rows' norms into rows, block b's columns' squares
    into sq[b], their zeros added to zc; (the values below _TINY_LINE, zeros included; the most zeros in a row)."""
    n, width = x.shape
    small = row_zeros = 0
    for b in range(first, last):
        lo, hi = b * NORM_BLOCK, min(n, (b + 1) * NORM_BLOCK)
        # Rows of _WIDE_ROWS values or more four at a time, so that the columns' sums and zero counts are read and
        # written once per four values. On operands fresh from memory: 0.45 against 0.68 ms on 1024 x 1024
        # (GPT-2-tiny d_model 256's hidden layer), 0.50 against 0.71 on 1024 x 768, 0.14 against 0.18 on 256 x
        # 1024; in cache 0.89-0.91x the time; 9.3 against 11.4 ms a step in that model's training steps. (On 1024
        # x 256 four rows a pass took 1.1x the time.)
        full = hi - (hi - lo) % 4 if width >= _WIDE_ROWS else lo
        small4, zeros4 = _four_rows(x[lo:full], rows[lo:full], sq[b], zc)
        small1, zeros1 = _each_row(x[full:hi], rows[full:hi], sq[b], zc)
        small, row_zeros = small + small4 + small1, max(row_zeros, zeros4, zeros1)
    return small, row_zeros


@njit(cache=True, nogil=True)
def norms_finish(sq: np.ndarray, zc: np.ndarray, rows: np.ndarray, cols: np.ndarray, small: int,
                 row_zeros: int) -> tuple[bool, int, int, int]:
    """`_norms_both`'s answer from its blocks' column squares sq, the columns' zeros zc and the rows' norms (and
    `norms_of_blocks`' counts): the columns' norms into cols, the blocks' squares summed in order."""
    total = sq[0].copy()
    for b in range(1, sq.shape[0]):
        total += sq[b]
    col_zeros = zeros = 0
    for k in range(total.size):
        cols[k] = math.sqrt(total[k])
        zeros += zc[k]
        col_zeros = max(col_zeros, _line_zeros(zc[k], rows.size))
    finite = True
    for i in range(rows.size):
        finite &= rows[i] < np.inf  # (False for NaN too)
    return finite, small - zeros, row_zeros, col_zeros


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _each_row(x: np.ndarray, rows: np.ndarray, sq: np.ndarray, zc: np.ndarray) -> tuple[int, int]:
    """`_norms_both`'s pass over x's rows one at a time: rows' norms into rows, the columns' squares and zeros
    added to sq and zc; (the values below _TINY_LINE, zeros included; the most zeros in a row)."""
    small, row_zeros = 0, 0
    for i in range(x.shape[0]):
        line, s, zr = x[i], 0.0, 0
        for k in range(line.size):
            v = np.float64(line[k])
            q = v * v
            s += q
            sq[k] += q
            small += _is_small(v)
            z = _is_zero(v)
            zr += z
            zc[k] += z
        rows[i] = math.sqrt(s)
        row_zeros = max(row_zeros, _line_zeros(zr, line.size))
    return small, row_zeros


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _four_rows(x: np.ndarray, rows: np.ndarray, sq: np.ndarray, zc: np.ndarray) -> tuple[int, int]:
    """`_each_row` four rows at a time (x's row count a multiple of four). Its loop body is written out rather than
    shared with `_each_row` through an inlined helper returning each value's terms as a tuple: that form ran 10 %
    slower on 1024 x 256."""
    small, row_zeros = 0, 0
    width = x.shape[1]
    for i in range(0, x.shape[0], 4):
        l0, l1, l2, l3 = x[i], x[i + 1], x[i + 2], x[i + 3]
        s0 = s1 = s2 = s3 = 0.0
        z0 = z1 = z2 = z3 = 0
        for k in range(width):
            v0, v1, v2, v3 = np.float64(l0[k]), np.float64(l1[k]), np.float64(l2[k]), np.float64(l3[k])
            q0, q1, q2, q3 = v0 * v0, v1 * v1, v2 * v2, v3 * v3
            s0, s1, s2, s3 = s0 + q0, s1 + q1, s2 + q2, s3 + q3
            sq[k] += (q0 + q1) + (q2 + q3)
            small += (_is_small(v0) + _is_small(v1)) + (_is_small(v2) + _is_small(v3))
            e0, e1, e2, e3 = _is_zero(v0), _is_zero(v1), _is_zero(v2), _is_zero(v3)
            z0, z1, z2, z3 = z0 + e0, z1 + e1, z2 + e2, z3 + e3
            zc[k] += (e0 + e1) + (e2 + e3)
        rows[i], rows[i + 1], rows[i + 2], rows[i + 3] = math.sqrt(s0), math.sqrt(s1), math.sqrt(s2), math.sqrt(s3)
        row_zeros = max(row_zeros, _line_zeros(z0, width), _line_zeros(z1, width), _line_zeros(z2, width),
                        _line_zeros(z3, width))
    return small, row_zeros


@njit(cache=True, nogil=True, inline="always")
def _line_zeros(zeros: int, size: int) -> int:
    """A line's zero count for `_norms_both`'s maximum: 0 for a line of zeros only (left out: see `_matmul_upper`)."""
    return zeros if zeros < size else 0


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _abs_dots(a: np.ndarray, b: np.ndarray, batch: np.ndarray, rows: np.ndarray, cols: np.ndarray,
              out: np.ndarray) -> None:
    # For b's columns contiguous along k (x @ W^T): each position's dot on its own, reassociated so that
    # LLVM vectorises it (E bounds any order, see bounds._finish; four fixed partial sums took 1.8-2.7x as
    # long). Float64 products of the operands' values, exact for float32 operands.
    for t in range(rows.size):
        n, i, j = batch[t], rows[t], cols[t]
        s = 0.0
        for k in range(a.shape[2]):
            s += abs(np.float64(a[n, i, k])) * abs(np.float64(b[n, k, j]))
        out[t] = s


@njit(cache=True, nogil=True)
def _abs_dots_by_rows(a: np.ndarray, b: np.ndarray, batch: np.ndarray, rows: np.ndarray, cols: np.ndarray,
                      out: np.ndarray) -> None:
    # For a b laid out row-major (its columns strided along k: g @ W, g^T @ x): reading a column per
    # position costs a cache miss per term, so every position's sum advances together, one row of b at a
    # time, each row read once. Their rows of a are read where they lie: a row-major a gives each position
    # four consecutive values a pass (the positions' cache lines stay in L1 between passes), a transposed
    # one a gather from one of its short lines. (Session 16: copying the wanted rows of a, transposed, to a
    # buffer first took half the time, 1.09 against 0.44 ms for 290 positions of a 1024 x 1024 @ 1024 x 256.)
    # The positions go in increasing column, so that each row of b is read along its memory, or, where a is
    # transposed (g^T @ x) and its memory's rows are the wider, in increasing row of a: a weight gradient's 8 KB
    # rows of g, read at every position's own line, are where the pass waits on memory (115 positions of
    # (1024 x 1024)^T @ 1024 x 256, fresh from memory: 0.71 against 0.93 ms; session 44).
    out[:] = 0.0
    across = a.strides[1] < a.strides[2] and a.shape[1] > b.shape[2]
    for n in range(a.shape[0]):
        sel = np.flatnonzero(batch == n)
        if sel.size == 0:
            continue
        sel = sel[np.argsort(rows[sel] if across else cols[sel])]
        row, col, an = rows[sel], cols[sel], a[n]
        acc = np.zeros(sel.size)
        # Four rows of b per pass: a position's index, sum and stores are touched once per four terms (1.4x
        # faster than a row per pass), and its terms are still added in increasing k, one at a time.
        k = 0
        while k + 4 <= a.shape[2]:
            b0, b1, b2, b3 = b[n, k], b[n, k + 1], b[n, k + 2], b[n, k + 3]
            for t in range(sel.size):
                ar, c = an[row[t]], col[t]
                s = acc[t] + abs(np.float64(ar[k])) * abs(np.float64(b0[c]))
                s += abs(np.float64(ar[k + 1])) * abs(np.float64(b1[c]))
                s += abs(np.float64(ar[k + 2])) * abs(np.float64(b2[c]))
                acc[t] = s + abs(np.float64(ar[k + 3])) * abs(np.float64(b3[c]))
            k += 4
        for k in range(k, a.shape[2]):
            brow = b[n, k]
            for t in range(sel.size):
                acc[t] += abs(np.float64(an[row[t], k])) * abs(np.float64(brow[col[t]]))
        for t in range(sel.size):
            out[sel[t]] = acc[t]


def _support(x: np.ndarray, out: np.ndarray) -> None:
    """out[n, i, k // 64] has bit k % 64 set where x[n, i, k] != 0 (NaN counts as nonzero)."""
    for n in range(x.shape[0]):
        lines, transposed = _lines(x, n)
        (_support_t if transposed else _support_rows)(lines, out[n])


@njit(cache=True, nogil=True)
def _support_rows(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.shape[0]):
        for w in range(out.shape[1]):
            word = np.uint64(0)
            for k in range(w * 64, min(w * 64 + 64, x.shape[1])):
                word |= np.uint64(x[i, k] != 0) << np.uint64(k & 63)
            out[i, w] = word


@njit(cache=True, nogil=True)
def _support_t(xt: np.ndarray, out: np.ndarray) -> None:
    # xt[k, i]: all lines' words built together, one row of xt at a time
    word = np.zeros(xt.shape[1], np.uint64)
    for w in range(out.shape[1]):
        word[:] = 0
        for k in range(w * 64, min(w * 64 + 64, xt.shape[0])):
            bit = np.uint64(k & 63)
            for i in range(xt.shape[1]):
                word[i] |= np.uint64(xt[k, i] != 0) << bit
        out[:, w] = word


@njit(cache=True, nogil=True)
def _overlap(sa: np.ndarray, sb: np.ndarray, batch: np.ndarray, rows: np.ndarray, cols: np.ndarray,
             out: np.ndarray) -> None:
    """out[t]: whether row rows[t] of a and column cols[t] of b share a nonzero position k."""
    for t in range(rows.size):
        hit = False
        for w in range(sa.shape[2]):
            if sa[batch[t], rows[t], w] & sb[batch[t], cols[t], w]:
                hit = True
                break
        out[t] = hit


def _nonzero_terms(a: torch.Tensor, b: torch.Tensor) -> tuple[tuple[np.ndarray, np.ndarray],
                                                              Callable[[torch.Tensor], torch.Tensor]]:
    """For C = a @ b (batched): (the bitsets of each row's of a and column's of b nonzeros, a function from
    flat positions of C to whether some product a_ik b_kj there has both factors nonzero)."""
    m, n, words = a.shape[1], b.shape[2], -(-a.shape[2] // 64)
    sa = np.zeros((a.shape[0], m, words), dtype=np.uint64)
    sb = np.zeros((b.shape[0], n, words), dtype=np.uint64)
    _support(_numpy(a), sa)
    _support(_numpy(b.transpose(1, 2)), sb)

    def nonzero(pos: torch.Tensor) -> torch.Tensor:
        p = pos.numpy()
        out = np.empty(p.size, dtype=np.bool_)
        _overlap(sa, sb, p // (m * n), (p % (m * n)) // n, p % n, out)
        return torch.from_numpy(out)

    return (sa, sb), nonzero


def _numpy(t: torch.Tensor) -> np.ndarray:
    return (t.detach() if t.requires_grad else t).numpy()


@njit(cache=True, nogil=True)
def _e_at(a: np.ndarray, b: np.ndarray, by_rows: bool, pos: np.ndarray, alpha: float, bias: np.ndarray, beta: float,
          g: float) -> np.ndarray:
    """gamma (|alpha| sum_k |a_ik| |b_kj| + |beta| |bias_ij|) at flat positions pos of the (B, M, N) output, in
    float64, in this order (`_matmul_at`'s; a term with alpha or beta 0 left out, as torch leaves it out whatever
    it holds, inf and NaN included; bias (M, N), (0, 0) for none). by_rows: b is laid out row-major
    (`_abs_dots_by_rows`), else along k (`_abs_dots`)."""
    m, n = a.shape[1], b.shape[2]
    batch, rem = pos // (m * n), pos % (m * n)
    rows, cols = rem // n, rem % n
    e = np.zeros(pos.size)
    if alpha != 0:
        if by_rows:
            _abs_dots_by_rows(a, b, batch, rows, cols, e)
        else:
            _abs_dots(a, b, batch, rows, cols, e)
        if alpha != 1:
            e *= abs(alpha)
    if bias.size and beta != 0:
        for t in range(pos.size):
            e[t] += abs(beta) * np.float64(abs(bias[rows[t], cols[t]]))
    e *= g
    return e


def _matmul_at(func: Any) -> PositionBound:
    on_device = bounds.BOUNDS_AT[func]  # other devices gather in torch

    def bound_at(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None], i: int,
                 pos: torch.Tensor) -> torch.Tensor:
        """E at flat positions `pos` of the output: K products each, summed in float64 by one compiled loop
        (an upper bound whatever the order, as the full bound: see `bounds._finish`)."""
        v = outs[0]
        if not v.is_cpu:
            return on_device(args, kwargs, outs, i, pos)
        bias, beta, alpha, a, b, terms = _mm_operands(func, args, kwargs)
        u, k = unit_roundoff(v.dtype), a.shape[-1] + terms
        # In one compiled call: an op's few positions cost a fraction of torch's per-call time (~20 us a matmul),
        # and of the ~10 numpy calls that took it apart. (addmm's bias: v is (m, n), its rows and columns a
        # broadcast view's, no copy.)
        with_bias = bias is not None and beta != 0
        e = _e_at(_numpy(a), _numpy(b), b.stride(1) > b.stride(2), pos.numpy().astype(np.int64, copy=False),
                  float(alpha), np.broadcast_to(_numpy(bias), v.shape) if with_bias else inline.NO_BIAS, float(beta),
                  gamma(k, u))
        # (float32 work: rounding the float64 sum to float32 takes 2^-24 of _finish's 2^-20 slack)
        return torch.from_numpy(_finish(e.astype(_NUMPY_DTYPES[v.dtype], copy=False), k, u, v.dtype))

    return bound_at


# -- convolutions: U from window norms ---------------------------------------------------------------------
# Cauchy-Schwarz over each output's window, as for matmuls over lines: a forward output's terms are its
# window's inputs times one filter, so sum |x| |w| <= ||window|| ||w_co||, and a window's squared norm is a sum
# of per-pixel squares (all channels: a group's are fewer, so this bounds it) over the window's taps. An input
# gradient's terms are the output gradients whose windows cover the pixel times a channel's weights, the
# same way round. A weight gradient sums grad_co times input channel ci shifted by one tap over images and
# positions, row by row: each output row's terms are bounded by its norm times its input row's
# (`_weight_sums`), and a bias gradient's sum of n values is at most sqrt(n) ||grad_co||. Measured against E
# on the resnet-tiny example's layers: see docs/benchmarks.md (sessions 13 and 16).


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _squares(x: np.ndarray, pixel: np.ndarray, plane: np.ndarray, row: np.ndarray) -> tuple[int, int]:
    """pixel[a, y, z] = sum over b of x[a, b, y, z]^2, row[a, b, y] = sum over z of x[a, b, y, z]^2 and
    plane[a, b] = sum over y of row[a, b, y], in float64 (an empty array: not wanted); the largest |x| as
    float64 bits and the count of tiny nonzero values (see _TINY_LINE). Per row, one vectorised pass for the
    extremes and the row's sum (reassociated: every sum here is a norm's, which bounds in any order), then
    one for the pixels while the row is in cache."""
    top, tiny = 0, 0
    if pixel.size:
        pixel[:] = 0.0
    for a in range(x.shape[0]):
        for b in range(x.shape[1]):
            total = 0.0
            for y in range(x.shape[2]):
                line, s = x[a, b, y], 0.0
                for k in range(line.size):
                    v = np.float64(line[k])
                    s += v * v
                    top = max(top, _abs_bits(v))
                    tiny += _is_tiny(v)
                if row.size:
                    row[a, b, y] = s
                total += s
                if pixel.size:
                    pix = pixel[a, y]
                    for k in range(line.size):
                        v = np.float64(line[k])
                        pix[k] += v * v
            if plane.size:
                plane[a, b] = total
    return top, tiny


def _squares_of(x: np.ndarray, pixel: np.ndarray, plane: np.ndarray, row: np.ndarray) -> tuple[int, int]:
    """`_squares`, split into whole images across torch's threads where x is float64 and large (vtrain.omp): each
    image's sums on one thread in the one pass's order, the same bits. At two threads resnet-tiny width 32's 17
    calls a step took 5.7 ms whole, 4.4 in parts (docs/benchmarks.md, session 49)."""
    parts = min(omp.parts(x.size), x.shape[0]) if x.dtype == np.float64 else 1
    if parts > 1:
        return omp.kernels().squares(parts, x, pixel, plane, row)
    return _squares(x, pixel, plane, row)


Squares = tuple[np.ndarray, np.ndarray, np.ndarray, int, int]  # (pixel, plane, row, top, tiny) of `_squares`


def _conv_squares(t: torch.Tensor) -> Squares:
    """`_squares` of a 4-d convolution operand, all three sums (in one pass: the rows' and planes' come with the
    pixels' at no cost worth a second reading), as float64 arrays (N, H, W), (N, C) and (N, C, H)."""
    x = _numpy(t.contiguous())
    pixel, plane, row = np.empty((x.shape[0], *x.shape[2:])), np.empty(x.shape[:2]), np.empty(x.shape[:3])
    return (pixel, plane, row, *_squares_of(x, pixel, plane, row))


@njit(cache=True, nogil=True)
def _window_norms(sq: np.ndarray, geometry: np.ndarray, kh: int, kw: int, out: np.ndarray) -> None:
    """out[n, oy * OW + oz] = the root of sq[n] summed over output (oy, oz)'s window (padding skipped). The
    taps are the outer loops, so the inner one runs along a row of outputs."""
    s0, s1, p0, p1, d0, d1, oh, ow = geometry
    out[:] = 0.0
    for n in range(sq.shape[0]):
        for oy in range(oh):
            row = out[n, oy * ow:(oy + 1) * ow]
            for a in range(kh):
                y = oy * s0 - p0 + a * d0
                if y < 0 or y >= sq.shape[1]:
                    continue
                for b in range(kw):
                    for oz in range(ow):
                        z = oz * s1 - p1 + b * d1
                        if 0 <= z < sq.shape[2]:
                            row[oz] += sq[n, y, z]
    for t in range(out.size):
        out.flat[t] = math.sqrt(out.flat[t])


@njit(cache=True, nogil=True)
def _cover_norms(sq: np.ndarray, geometry: np.ndarray, kh: int, kw: int, h: int, wd: int, out: np.ndarray) -> None:
    """out[n, y * W + z] = the root of sq[n] (output-gradient squares) summed over the outputs whose windows
    cover input pixel (y, z): each output's square added to the pixels its taps reach (as _conv_abs_input
    finds them, without its divisions)."""
    s0, s1, p0, p1, d0, d1 = geometry[:6]
    out[:] = 0.0
    for n in range(sq.shape[0]):
        for oy in range(sq.shape[1]):
            for a in range(kh):
                y = oy * s0 - p0 + a * d0
                if y < 0 or y >= h:
                    continue
                row = out[n, y * wd:(y + 1) * wd]
                for b in range(kw):
                    for oz in range(sq.shape[2]):
                        z = oz * s1 - p1 + b * d1
                        if 0 <= z < wd:
                            row[z] += sq[n, oy, oz]
    for t in range(out.size):
        out.flat[t] = math.sqrt(out.flat[t])


def _norms_over(cover: bool, sq: np.ndarray, geometry: np.ndarray, kh: int, kw: int, h: int, wd: int,
                out: np.ndarray) -> None:
    """`_window_norms` (cover False; h and wd unused) or `_cover_norms`, split into whole images across torch's
    threads where the taps' additions are many (vtrain.omp): each image's on one thread, the same bits."""
    parts = min(omp.parts(out.size * kh * kw), sq.shape[0])
    if parts > 1:
        omp.kernels().window_norms(parts, cover, sq, geometry, kh, kw, h, wd, out)
    elif cover:
        _cover_norms(sq, geometry, kh, kw, h, wd, out)
    else:
        _window_norms(sq, geometry, kh, kw, out)


def _weight_sums(g_rows: np.ndarray, x_rows: np.ndarray, stride: Sequence[int], padding: Sequence[int],
                 dilation: Sequence[int], groups: int, kh: int, kw: int) -> np.ndarray:
    """(Co, Cg * KH * KW), at weight (co, cl, a, b): the sum over images n and output rows oy of
    ||grad[n, co, oy]|| ||x[n, ci, y]||, y the input row that tap a of output row oy reads (rows' norms
    given, (N, C, rows)). An output row's terms are its gradients times some of row y's values (those tap b
    reads, one per output), so Cauchy-Schwarz bounds them row by row. Whole channels' norms (||grad_co||
    ||x_ci||, the bound before session 16) mix rows that never meet: on resnet-tiny at width 32 these sums
    left 0.5-0.6x their candidates. Computed in float64 (norms, products and BLAS's sums: far fewer roundings
    of 2^-53 than _envelope's relative 2^-8 covers).

    One product for all taps: x's rows as (Cin, KH, images, OH), row y of tap a and output row oy read from
    the rows zero-padded (a padding row's norm is 0), a strided view copied once, and its dots in `_row_dots`,
    each dot on one thread however the columns are split across torch's threads: since session 51 the recording
    trainer logs with U itself (rounding.UPPER_BAND), so U's bits must not depend on the thread count, as a
    BLAS's split sums may. (torch.mm on two threads had taken 310-380 us a call on resnet-tiny width 32's
    32-channel layer, `_row_dots` one row at a time on one thread 490-650; numpy's OpenBLAS, before that, kept its
    own pool, whose threads contended with a busy core: ~1.3 ms a call alone, 8.6 ms while the other core was
    busy.)"""
    n_img, c_out, oh = g_rows.shape
    c_in, h = x_rows.shape[1:]
    co_g, c_g = c_out // groups, c_in // groups
    s, p, d = stride[0], padding[0], dilation[0]
    back = max(0, (oh - 1) * s + (kh - 1) * d - p - (h - 1))  # rows below the image that some tap reads
    padded = torch.nn.functional.pad(torch.from_numpy(x_rows), (p, back))
    hp = padded.shape[2]
    taps = padded.as_strided((c_in, kh, n_img, oh), (hp, d, c_in * hp, s)).reshape(c_in * kh, n_img * oh)
    gs = g_rows.transpose(1, 0, 2).reshape(c_out, n_img * oh)
    width = c_g * kh
    sums = np.empty((c_out, width))
    # (no-ops where the reshapes copied, as they do but for some layouts of one image: the kernels read C order)
    taps, gs = np.ascontiguousarray(taps.numpy()), np.ascontiguousarray(gs)
    parts = min(omp.parts(c_out * width * n_img * oh, _DOTS_PER_PART), width)  # (parts of whole columns)
    if parts > 1:
        omp.kernels().row_dots(parts, gs, taps, co_g, sums)
    else:
        _row_dots(gs, taps, co_g, 0, width, sums)
    return np.repeat(sums.reshape(c_out, c_g, kh, 1), kw, axis=3).reshape(c_out, -1)


# At least this many products in each part of `_row_dots` split on torch's threads (a 32-channel layer's 3M took
# ~300 us on one thread)
_DOTS_PER_PART = 2**18


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _row_dots(g: np.ndarray, taps: np.ndarray, co_g: int, first: int, last: int, out: np.ndarray) -> None:
    """out[co, t] = g[co] . taps[j * width + t] for co in group j and t in first:last (width: out's columns):
    `_weight_sums`' products, each a contiguous dot product (reassociated: a norm's sum, which bounds in any
    order). Four rows of a group at a time, each line read once for the four (0.65-0.86 of the time of one dot
    at a time on resnet-tiny's layers; the same bits as that on an AVX-512 machine, but LLVM may split a dot's
    sum differently in the two loops elsewhere: U bounds either way); every value is computed by the same loop
    whichever columns a call takes, so a pass split by columns (vtrain.omp_kernels.row_dots) gives the one
    pass's bits."""
    width = out.shape[1]
    for j in range(g.shape[0] // co_g):
        co, end = j * co_g, (j + 1) * co_g
        while co + 4 <= end:
            r0, r1, r2, r3 = g[co], g[co + 1], g[co + 2], g[co + 3]
            for t in range(first, last):
                line = taps[j * width + t]
                s0 = s1 = s2 = s3 = 0.0
                for k in range(line.size):
                    x = line[k]
                    s0 += r0[k] * x
                    s1 += r1[k] * x
                    s2 += r2[k] * x
                    s3 += r3[k] * x
                out[co, t], out[co + 1, t], out[co + 2, t], out[co + 3, t] = s0, s1, s2, s3
            co += 4
        for c in range(co, end):  # (a group's last rows, under four)
            row = g[c]
            for t in range(first, last):
                line = taps[j * width + t]
                s = 0.0
                for k in range(line.size):
                    s += row[k] * line[k]
                out[c, t] = s


_NONE = np.empty((0, 0, 0)), np.empty((0, 0))


def _convolution_upper(func: Any) -> Upper:
    forward = func is aten.convolution.default

    def upper(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None],
              norms: LineNorms | None = None) -> list[Prefilter | None] | None:
        """U >= E at every element of each convolution output (forward: the output; backward: grad_input,
        grad_weight, grad_bias), None for an output not computed or whose U would not be finite; None for
        all where the full bound is cheap or the convolution transposed or 3-d. Each operand is read once."""
        from vtrain.resolve import ResolveError, _bind, _conv_geometry  # noqa: PLC0415 (as in _convolution_at)
        v = next(o for o in outs if o is not None)
        least = MIN_PRODUCTS.get(v.dtype)
        ks = (bounds._conv_k(args) + 1,) if forward else bounds._convolution_backward_ks(args)
        if least is None or not v.is_cpu or sum(o.numel() * k for o, k in zip(outs, ks) if o is not None) < least:
            return None
        kw = _bind(func, args, kwargs)
        try:
            x, w, stride, padding, dilation, groups = _conv_geometry(func, kw)
        except ResolveError:
            return None
        g, bias = kw.get("grad_output"), kw.get("bias") if forward else None
        if any(t.dtype not in (torch.float64, torch.float32) or not t.is_cpu for t in (x, w, g, bias) if t is not None):
            return None
        want = [o is not None for o in outs] + [False] * (3 - len(outs))
        n_img, c_out, c_g, kh, kwd = x.shape[0], *w.shape
        # the weight's planes; the input's pixels (forward), its rows (grad_weight) or only its largest value
        # (grad_input): all from one pass over each, which the backward finds in `norms` after the forward
        squares = _conv_squares if norms is None else norms.squares
        (_, w_plane, _, *w_top), (x_pixel, _, x_row, *x_top) = squares(w), squares(x)
        tops = [w_top, x_top]
        if g is not None:  # grad_input: its pixels; grad_weight: its rows; grad_bias: its planes
            g = _numpy((g.unsqueeze(2) if g.dim() == 3 else g).contiguous())
            g_pixel = np.empty((n_img, *g.shape[2:])) if want[0] else _NONE[0]
            g_row = np.empty(g.shape[:3]) if want[1] else _NONE[0]
            g_plane = np.empty(g.shape[:2]) if want[2] else _NONE[1]
            tops.append(_squares_of(g, g_pixel, g_plane, g_row))
        bias_max = float(bias.abs().max()) if bias is not None and bias.numel() else 0.0
        top = max(t for t, _ in tops)  # the largest |operand| as float64 bits (NaN's above infinity's)
        if top >= 0x7FF0000000000000 or any(n for _, n in tops) or not math.isfinite(bias_max):
            return None
        largest = max(float(np.array(top, np.int64).view(np.float64)), bias_max)
        result: list[Prefilter | None] = []
        for i, o in enumerate(outs):
            if o is None:
                result.append(None)
                continue
            if forward:  # (N, Co, OH * OW): the filter's norm times its window's
                geometry = np.array([*stride, *padding, *dilation, *o.shape[-2:]] if o.dim() == 4 else
                                    [*stride, *padding, *dilation, 1, o.shape[-1]], np.int64)
                cols = np.empty((n_img, int(geometry[6] * geometry[7])))
                _norms_over(False, x_pixel, geometry, kh, kwd, 0, 0, cols)
                rows = np.broadcast_to(np.sqrt(w_plane.sum(1)), (n_img, c_out))
            elif i == 0:  # grad_input (N, Cin, H * W): a channel's weights (every group's: a bound) times its cover's
                cols = np.empty((n_img, x.shape[2] * x.shape[3]))
                _norms_over(True, g_pixel, np.array([*stride, *padding, *dilation], np.int64), kh, kwd, x.shape[2],
                            x.shape[3], cols)
                rows = np.broadcast_to(np.tile(np.sqrt(w_plane.sum(0)), groups), (n_img, x.shape[1]))
            elif i == 1:  # grad_weight (Co, 1, Cg * KH * KW): one "row" a filter, U = factor * its sums + floor
                cols = _weight_sums(np.sqrt(g_row), np.sqrt(x_row), stride, padding, dilation, groups, kh, kwd)
                rows = np.ones((c_out, 1))
            else:  # grad_bias (1, Co, 1)
                rows, cols = np.sqrt(g_plane.sum(0))[None], np.array([[math.sqrt(g.shape[0] * g.shape[2] * g.shape[3])]])
            # >= every sum of |terms|
            scale = rows.max(initial=0.0) * cols.max(initial=0.0) * (1 + 2.0**-8) + bias_max
            factor, floor = _envelope(ks[i], max(ks), largest, o.dtype)
            if not (math.isfinite(factor) and largest < 2.0**400 and (o.dtype == torch.float64 or scale < 2.0**126)):
                result.append(None)  # (an infinite gamma: 2^24 terms or more)
                continue
            add = np.full(cols.shape, floor + bias_max * factor)
            result.append(Prefilter(np.ascontiguousarray(rows * factor), cols, add, o.shape, o.dtype))
        return result

    return upper


BOUNDS_AT: dict[Any, PositionBound] = {
    **{op: _matmul_at(op) for op in (aten.mm.default, aten.bmm.default, aten.addmm.default)},
    **{op: _convolution_at(op) for op in (aten.convolution.default, aten.convolution_backward.default)},
}
UPPERS: dict[Any, Upper] = {
    **{op: _matmul_upper(op) for op in (aten.mm.default, aten.bmm.default, aten.addmm.default)},
    **{op: _convolution_upper(op) for op in (aten.convolution.default, aten.convolution_backward.default)},
}
