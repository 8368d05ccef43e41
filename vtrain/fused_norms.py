"""The written-out LayerNorm and BatchNorm2d (vtrain.models.norms) under rounded execution with their elementwise
ops fused.

Written out, a norm is two means and three small ops on its statistics, five elementwise ops over the whole input
forward, and autograd's backward: four sums, two small ops and fifteen elementwise ops (its products, quotients,
negations and its sum of x's gradients from the centring and from the mean). Each elementwise op is a dispatch, a
pass over every value of x and a rounding. A LayerNorm over (B, T, D) has statistics for each row of D values, and
its weight and bias one value a column; a BatchNorm2d over (N, C, H, W) in training has them for each channel's N H W
values, its weight and bias one value a channel, and updates its running statistics between the variance and the
square root. Both are rows of values in memory whose statistics are one value a row: the layer norm's rows are its
own, the batch norm's are the (n, c) planes of H W values, row r of channel r % C (`Layout`).

Here the device ops (the means and sums, rounded and logged) and the small ops stay dispatched, in their order; the
elementwise ops between two of them are one pass each (six passes and the engine's sum where the dispatch path makes
twenty passes), each value computed by the same IEEE operations in the same order as the dispatch path and rounded
to the grid after each op in a register, and each pass counted as the ops it stands for. So every value, log entry
and count is the written-out form's (tests/numerics/test_num_fused_norms.py; tests/families/test_family_fused_ops.py
trains GPT-2-tiny and resnet-tiny both ways to identical logs and states).

x's gradient comes in autograd's two parts, the centring's and the mean's, one output each for x passed twice: the
engine sums them into x's gradient in the written-out form's order, after any gradient x had from elsewhere (the
residual stream's), so that sum rounds as it did. Where the kernels cannot take the tensors (not contiguous float64
on the CPU at bits = 32, fused kernels off), or where autograd's backward dispatches fewer sums than the passes'
order has (`_takes`), `layer_norm` and `batch_norm` answer None and the module runs its written-out form; a value off
the grid in a pass sends that pass's ops the dispatch way, whose error names the op that wrote it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from numba import njit

from vtrain import fused
from vtrain.fused import off_grid as _off
from vtrain.fused import round_value as _r
from vtrain.rounding import RoundedExecution, active_rounding

aten = torch.ops.aten

ENABLED = True  # (tests compare the fused passes with the written-out form)


# Each pass walks rows of d values, a row's statistics (number r % k) read once and its inner loop over columns
# vectorised (with each value's row and column by division, or the float32 cast a run-time choice in the loop, the
# passes ran slower than the dispatch path's twenty). `_pass` compiles each with the cast a constant, and the two
# that read the weight with its layout a constant: one value a column (AFFINE, SCALE_GRADS) or one a row's channel,
# r % k (the _CHANNELS codes). The inner loops index row slices from 0: indexed from r d on, their indices not known
# to be >= 0, the values went through numba's negative-index wraparound and LLVM stored them with scatters
# (vscatterqpd), 1.4-4.1 ns a value where the slices take 0.6-1.1 (one thread, resnet-tiny's (32, 32, 32, 32) batch
# norm; the recording trainer's step at width 32 on one thread: 341 against 409 ms; session 57).
CENTER, AFFINE, AFFINE_CHANNELS, SCALE_GRADS, SCALE_GRADS_CHANNELS, QUOTIENT_GRADS, SQUARE_GRADS, MEAN_GRAD = range(8)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _center(x: np.ndarray, mu: np.ndarray, xc: np.ndarray, sq: np.ndarray, r0: int, r1: int, d: int, k: int, m: int,
            cast32: bool, limit: float) -> int:
    """xc = x - mu, sq = xc xc."""
    nbad = 0
    for r in range(r0, r1):
        mr, i0 = mu[r % k], r * d
        xr, cr, qr = x[i0:i0 + d], xc[i0:i0 + d], sq[i0:i0 + d]
        for j in range(d):
            c = _r(xr[j] - mr, m, cast32)
            q = _r(c * c, m, cast32)
            nbad += _off(c, limit) + _off(q, limit)
            cr[j], qr[j] = c, q
    return nbad


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _affine(xc: np.ndarray, s: np.ndarray, w: np.ndarray, b: np.ndarray, y: np.ndarray, r0: int, r1: int, d: int,
            k: int, channels: bool, m: int, cast32: bool, limit: float) -> int:
    """y = xc / s * w + b."""
    nbad = 0
    for r in range(r0, r1):
        sr, i0 = s[r % k], r * d
        p0, step = (r % k, 0) if channels else (0, 1)  # (w and b's index: p0 + j step)
        xr, yr = xc[i0:i0 + d], y[i0:i0 + d]
        for j in range(d):
            n = _r(xr[j] / sr, m, cast32)
            p = _r(n * w[p0 + j * step], m, cast32)
            v = _r(p + b[p0 + j * step], m, cast32)
            nbad += _off(n, limit) + _off(p, limit) + _off(v, limit)
            yr[j] = v
    return nbad


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _scale_grads(g: np.ndarray, xc: np.ndarray, s: np.ndarray, w: np.ndarray, gwp: np.ndarray, gxn: np.ndarray,
                 r0: int, r1: int, d: int, k: int, channels: bool, m: int, cast32: bool, limit: float) -> int:
    """The product's gradients: gwp = g xn (to be summed into w's), gxn = g w; xn = xc / s as the forward made it."""
    nbad = 0
    for r in range(r0, r1):
        sr, i0 = s[r % k], r * d
        p0, step = (r % k, 0) if channels else (0, 1)
        gr, xr, ar, cr = g[i0:i0 + d], xc[i0:i0 + d], gwp[i0:i0 + d], gxn[i0:i0 + d]
        for j in range(d):
            n = _r(xr[j] / sr, m, cast32)
            a = _r(gr[j] * n, m, cast32)
            c = _r(gr[j] * w[p0 + j * step], m, cast32)
            nbad += _off(a, limit) + _off(c, limit)
            ar[j], cr[j] = a, c
    return nbad


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _quotient_grads(gxn: np.ndarray, xc: np.ndarray, s: np.ndarray, gsp: np.ndarray, gxc: np.ndarray, r0: int,
                    r1: int, d: int, k: int, m: int, cast32: bool, limit: float) -> int:
    """The quotient xc / s's gradients: gsp = -gxn (xc / s / s) (to be summed into s's), gxc = gxn / s."""
    nbad = 0
    for r in range(r0, r1):
        sr, i0 = s[r % k], r * d
        gr, xr, ar, cr = gxn[i0:i0 + d], xc[i0:i0 + d], gsp[i0:i0 + d], gxc[i0:i0 + d]
        for j in range(d):
            q1 = _r(xr[j] / sr, m, cast32)
            q2 = _r(q1 / sr, m, cast32)
            ng = _r(-gr[j], m, cast32)
            a = _r(ng * q2, m, cast32)
            c = _r(gr[j] / sr, m, cast32)
            nbad += _off(q1, limit) + _off(q2, limit) + _off(a, limit) + _off(c, limit)
            ar[j], cr[j] = a, c
    return nbad


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _square_grads(gvar: np.ndarray, xc: np.ndarray, gxc: np.ndarray, a2: np.ndarray, n2: np.ndarray, r0: int,
                  r1: int, d: int, k: int, count: int, m: int, cast32: bool, limit: float) -> int:
    """The variance's mean and the square's gradients, summed into xc's: a2 = gxc + gq xc + gq xc with gq = gvar /
    count (both products, one value), and n2 = -a2 (to be summed into the mean's)."""
    nbad = 0
    for r in range(r0, r1):
        gq, i0 = _r(gvar[r % k] / count, m, cast32), r * d
        nbad += _off(gq, limit)
        xr, gr, ar, nr = xc[i0:i0 + d], gxc[i0:i0 + d], a2[i0:i0 + d], n2[i0:i0 + d]
        for j in range(d):
            p = _r(gq * xr[j], m, cast32)
            a1 = _r(gr[j] + p, m, cast32)
            a = _r(a1 + p, m, cast32)
            nbad += _off(p, limit) + _off(a1, limit) + _off(a, limit)
            ar[j], nr[j] = a, -a
    return nbad


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _mean_grad(gm: np.ndarray, out: np.ndarray, r0: int, r1: int, d: int, k: int, count: int, m: int, cast32: bool,
               limit: float) -> int:
    """The mean's gradient, gm / count (one value a row)."""
    nbad = 0
    for r in range(r0, r1):
        v, i0 = _r(gm[r % k] / count, m, cast32), r * d
        nbad += _off(v, limit)
        out[i0:i0 + d] = v
    return nbad


@njit(cache=True, nogil=True, error_model="numpy")
def _pass(code: int, a: np.ndarray, b: np.ndarray, c: np.ndarray, e: np.ndarray, o: np.ndarray, p: np.ndarray,
          r0: int, r1: int, d: int, k: int, count: int, limit: float) -> int:
    """Pass `code` over rows r0:r1 (of d values, row r's statistics number r % k, each over `count` values) on inputs
    a, b, c, e (as many as it reads) into outputs o and p: the count of values off the grid. (Float64 work at bits =
    32 only, as vtrain.fused_gelu's.)"""
    return _step(code, a, b, c, e, o, p, r0, r1, d, k, count, 23, True, limit)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _step(code: int, a: np.ndarray, b: np.ndarray, c: np.ndarray, e: np.ndarray, o: np.ndarray, p: np.ndarray,
          r0: int, r1: int, d: int, k: int, count: int, m: int, cast32: bool, limit: float) -> int:
    if code == CENTER:
        return _center(a, b, o, p, r0, r1, d, k, m, cast32, limit)
    if code == AFFINE:
        return _affine(a, b, c, e, o, r0, r1, d, k, False, m, cast32, limit)
    if code == AFFINE_CHANNELS:
        return _affine(a, b, c, e, o, r0, r1, d, k, True, m, cast32, limit)
    if code == SCALE_GRADS:
        return _scale_grads(a, b, c, e, o, p, r0, r1, d, k, False, m, cast32, limit)
    if code == SCALE_GRADS_CHANNELS:
        return _scale_grads(a, b, c, e, o, p, r0, r1, d, k, True, m, cast32, limit)
    if code == QUOTIENT_GRADS:
        return _quotient_grads(a, b, c, o, p, r0, r1, d, k, m, cast32, limit)
    if code == SQUARE_GRADS:
        return _square_grads(a, b, c, o, p, r0, r1, d, k, count, m, cast32, limit)
    return _mean_grad(a, o, r0, r1, d, k, count, m, cast32, limit)


@dataclass(frozen=True)
class Layout:
    """A norm's statistics and parameters over x's values, as the kernels and the written-out form address them."""

    stat_dims: list[int]  # the dims a statistic is over: the means', and autograd's sums over them
    param_dims: list[int]  # the dims autograd sums the weight's and bias's gradients over
    param_shape: tuple[int, ...] | None  # the weight and bias as the written-out form broadcasts them (None: as is)
    width: int  # the values of a row in memory, whose statistics are one value
    period: int  # row r's statistics are number r % period
    count: int  # the values a statistic is over

    @property
    def channels(self) -> bool:
        """Whether the weight and bias are one value a row's channel (r % period), as the batch norm broadcasts
        them, else one a column."""
        return self.param_shape is not None

    def params(self, w: torch.Tensor) -> torch.Tensor:
        return w if self.param_shape is None else w.reshape(self.param_shape)


def _fused(rx: RoundedExecution | None, code: int, ops: int, like: torch.Tensor, inputs: list[torch.Tensor],
           outputs: int, at: Layout) -> list[torch.Tensor] | None:
    """Pass `code` on the inputs' values, rows of like's values laid out as `at` says, into `outputs` fresh tensors,
    counted as the `ops` elementwise ops it stands for; or None (fused.run_chain)."""
    return fused.run_chain(rx, fused.CHAIN_NORM, _pass, code, ops, like, inputs, outputs, at.width, at.period, at.count)


class _Norm(torch.autograd.Function):
    """y = (x - mean(x)) / sqrt(var(x) + eps) w + b with statistics and parameters laid out as `at` says, x given
    twice: its gradient's two parts. `running(mean, var, count)`, where given, runs between the variance and the
    square root, as the written-out batch norm updates its running statistics there."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, x_again: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float,
                at: Layout, running: Callable[[torch.Tensor, torch.Tensor, int], None] | None) -> torch.Tensor:
        rx = active_rounding()
        mu = x.mean(at.stat_dims, keepdim=True)
        out = _fused(rx, CENTER, 2, x, [x, mu], 2, at)
        if out is None:
            xc = x - mu
            out = [xc, xc * xc]
        xc, sq = out
        var = sq.mean(at.stat_dims, keepdim=True)
        if running is not None:
            running(mu, var, at.count)
        s = torch.sqrt(var + eps)
        out = _fused(rx, AFFINE_CHANNELS if at.channels else AFFINE, 3, xc, [xc, s, w, b], 1, at)
        ctx.save_for_backward(xc, s, w)
        ctx.layout = at
        return xc / s * at.params(w) + at.params(b) if out is None else out[0]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple:
        # autograd's ops on the written-out form in its order, the device ops (sums) and the small ones on the
        # statistics dispatched, the elementwise ones between them fused
        xc, s, w = ctx.saved_tensors
        at: Layout = ctx.layout
        rx = active_rounding()
        gb = g.sum(at.param_dims, keepdim=True)
        out = _fused(rx, SCALE_GRADS_CHANNELS if at.channels else SCALE_GRADS, 2, xc, [g, xc, s, w], 2, at)
        if out is None:
            xn = fused.recomputed(None if rx is None else rx.bits, torch.div, xc, s)
            out = [g * xn, g * at.params(w)]
        gwp, gxn = out
        gw = gwp.sum(at.param_dims, keepdim=True)
        out = _fused(rx, QUOTIENT_GRADS, 4, xc, [gxn, xc, s], 2, at)  # (a negation is exact: no op counted)
        if out is None:
            q2 = xc / s / s
            out = [-gxn * q2, gxn / s]
        gsp, gxc = out
        gvar = aten.div.Tensor(gsp.sum(at.stat_dims, keepdim=True), aten.mul.Scalar(s, 2))
        out = _fused(rx, SQUARE_GRADS, 5, xc, [gvar, xc, gxc], 2, at)
        if out is None:
            gq = aten.div.Scalar(gvar.expand(xc.shape), at.count)
            p1, p2 = gq * xc, gq * xc
            a2 = (gxc + p2) + p1
            out = [a2, -a2]
        a2, n2 = out
        gm = n2.sum(at.stat_dims, keepdim=True)
        out = _fused(rx, MEAN_GRAD, 1, xc, [gm], 1, at)
        gmx = aten.div.Scalar(gm.expand(xc.shape), at.count) if out is None else out[0]
        return a2, gmx, gw.reshape(w.shape), gb.reshape(w.shape), None, None, None


def _takes(x: torch.Tensor, count: int, *params: torch.Tensor) -> bool:
    """Whether the passes run a norm of x whose statistics are each over `count` values, with these weight and bias.
    Not for an empty x, nor where a statistic is over one value: autograd sums a broadcast operand's gradient over
    the dims of more than one value only, so its backward then dispatches no sums for the statistics, or for a batch
    norm's weight and bias, where the passes' order has them."""
    rx = active_rounding()
    return ENABLED and rx is not None and rx.bits == 32 and count > 1 and x.numel() > 0 and \
        all(fused.usable64(t) for t in (x, *params))


def layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor | None:
    """The written-out LayerNorm of x over its last dim by the fused passes, inside a RoundedExecution at bits = 32
    where they take x, w and b; else None."""
    # (over a 1-d x, autograd sums the weight's gradient over no dim, and `g.sum([])` would sum them all)
    if x.dim() < 2 or not _takes(x, x.shape[-1], w, b):
        return None
    return _Norm.apply(x, x, w, b, eps, layer_layout(x), None)


def batch_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float,
               running: Callable[[torch.Tensor, torch.Tensor, int], None] | None) -> torch.Tensor | None:
    """The written-out BatchNorm2d of x (N, C, H, W) in training, by the fused passes, inside a RoundedExecution at
    bits = 32 where they take x, w and b; else None. `running(mean, var, count)` updates the running statistics."""
    if x.dim() != 4 or not _takes(x, x.numel() // max(x.shape[1], 1), w, b):
        return None
    return _Norm.apply(x, x, w, b, eps, batch_layout(x), running)


def layer_layout(x: torch.Tensor) -> Layout:
    """A LayerNorm's over x's last dim: its rows, and its weight and bias one value a column. (Its means over the
    last dim named by number, where the written-out form says -1: the same values, and a site of the log names the
    op and the shape only.)"""
    d = x.shape[-1]
    return Layout([x.dim() - 1], list(range(x.dim() - 1)), None, d, x.numel() // d, d)


def batch_layout(x: torch.Tensor) -> Layout:
    """A BatchNorm2d's over x (N, C, H, W) in training: planes of H W values, row r of channel r % C."""
    n, c, h, w = x.shape
    return Layout([0, 2, 3], [0, 2, 3], (1, -1, 1, 1), h * w, c, n * h * w)
