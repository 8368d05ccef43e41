"""GPT-2's tanh GELU under rounded execution in three passes where the dispatch path makes twenty-two.

vtrain.models.gpt2 writes the GELU out, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): eight binary ops and a tanh
forward and fourteen binary ops backward (autograd's products and its four sums of x's five gradients), each a
dispatch, a pass over the whole (B, T, 4 d_model) activation and a rounding (vtrain.fused_binary). On GPT-2-tiny
d_model 256 those 44 passes a step over 1M values took ~30 ms of a ~165 ms rounded step on two threads.

Here the forward's six ops before the tanh are one pass (x in, the tanh's argument out), the tanh is dispatched as
before (a device op: rounded, and logged where its rounding is in doubt), the two after it are a second pass, and
the backward is a third (the gradient, x and the tanh's output in, x's gradient out). Each pass computes each value
by the same IEEE operations in the same order as the dispatch path, every op's output rounded to the grid in a
register (the order of autograd's sums included: `_backward_loop` follows the trace of its nodes), so every value is
the dispatch path's, bit for bit (tests/numerics/test_num_fused_gelu.py; tests/families trains GPT-2-tiny both ways
to identical logs and states), and the step counts the same ops and rounded values. What the backward reads, x / 2,
x x and 1 + tanh, it computes again from x and the tanh's output: the forward keeps those two only. Its sum of x's
five gradients is the written-out form's where x feeds the GELU alone, as the MLP's first layer's output does in
vtrain.models.gpt2 (a gradient from another use of x would enter autograd's sum first).

Where the kernels cannot take x (not a contiguous float64 CPU tensor at bits = 32, fused kernels off), `gelu` answers
None and
the model runs its written-out form. A value off the grid in a pass (an overflow) sends that pass the dispatch way,
op by op, so that the error names the op that wrote it, as without this module.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from numba import njit

from vtrain import fused
from vtrain.fused import off_grid as _off
from vtrain.fused import round_value as _r
from vtrain.fused_binary import TANH_BACKWARD, _op
from vtrain.rounding import RoundedExecution, active_rounding

ENABLED = True  # (tests compare the fused passes with the written-out form)

C, K = math.sqrt(2.0 / math.pi), 0.044715  # the written-out form's constants, as float64
INNER, OUTER, BACKWARD = range(3)  # the passes: the tanh's argument; the output; x's gradient
_OPS = {INNER: 6, OUTER: 2, BACKWARD: 14}  # the dispatched ops each pass stands for


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _inner_loop(x: np.ndarray, out: np.ndarray, m: int, cast32: bool, limit: float) -> int:
    nbad = 0
    for i in range(x.size):
        v = x[i]
        # (x * 0.5, the forward's first op, is on the grid for any x on it: the outer pass computes it)
        xx = _r(v * v, m, cast32)
        x3 = _r(xx * v, m, cast32)
        k3 = _r(x3 * K, m, cast32)
        s = _r(v + k3, m, cast32)
        u = _r(s * C, m, cast32)
        nbad += _off(xx, limit) + _off(x3, limit) + _off(k3, limit) + _off(s, limit) + _off(u, limit)
        out[i] = u
    return nbad


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _outer_loop(x: np.ndarray, t: np.ndarray, out: np.ndarray, m: int, cast32: bool, limit: float) -> int:
    nbad = 0
    for i in range(x.size):
        h = _r(x[i] * 0.5, m, cast32)
        p = _r(t[i] + 1.0, m, cast32)
        y = _r(h * p, m, cast32)
        nbad += _off(y, limit)
        out[i] = y
    return nbad


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _backward_loop(g: np.ndarray, x: np.ndarray, t: np.ndarray, out: np.ndarray, m: int, cast32: bool,
                   limit: float) -> int:
    nbad = 0
    for i in range(x.size):
        v, w, d = x[i], t[i], g[i]
        h = _r(v * 0.5, m, cast32)  # the forward's values that autograd keeps, again
        p = _r(w + 1.0, m, cast32)
        xx = _r(v * v, m, cast32)
        gh = _r(d * h, m, cast32)  # y = h p: p's gradient, then h's
        gp = _r(d * p, m, cast32)
        gu = _r(_op(TANH_BACKWARD, gh, w), m, cast32)
        gs = _r(gu * C, m, cast32)  # u = s C; s = x + k3, k3's gradient is s's
        gk = _r(gs * K, m, cast32)  # k3 = x3 K
        ga = _r(gk * xx, m, cast32)  # x3 = xx x: x's gradient, then xx's
        gxx = _r(gk * v, m, cast32)
        a1 = _r(gs + ga, m, cast32)  # x's buffer: s's share, then x3's
        gb = _r(gxx * v, m, cast32)  # xx = x x: both operands' gradients, one value
        a2 = _r(a1 + gb, m, cast32)
        a3 = _r(a2 + gb, m, cast32)
        gd = _r(gp * 0.5, m, cast32)  # h = x 0.5
        gx = _r(a3 + gd, m, cast32)
        nbad += _off(gh, limit) + _off(gp, limit) + _off(gu, limit) + _off(gs, limit) + _off(gk, limit) + \
            _off(ga, limit) + _off(gxx, limit) + _off(a1, limit) + _off(gb, limit) + _off(a2, limit) + \
            _off(a3, limit) + _off(gd, limit) + _off(gx, limit)
        out[i] = gx
    return nbad


@njit(cache=True, nogil=True, error_model="numpy")
def _pass(code: int, x: np.ndarray, t: np.ndarray, g: np.ndarray, e: np.ndarray, out: np.ndarray, q: np.ndarray,
          lo: int, hi: int, width: int, period: int, count: int, limit: float) -> int:
    """Pass `code` over values lo:hi (INNER reads x; OUTER x and t; BACKWARD g, x and t; e, q, width, period and
    count, which fused.run_chain passes every chain, unread): the count of rounded values off the grid. (The
    float32 cast a constant in the loops, as in vtrain.fused_optim: float64 work at bits = 32 only; each other
    grid would compile a second copy of every loop, which with vtrain.fused_norms' made numba's cold compile
    ~20 s longer.)"""
    x, t, g, out = x[lo:hi], t[lo:hi], g[lo:hi], out[lo:hi]
    if code == INNER:
        return _inner_loop(x, out, 23, True, limit)
    if code == OUTER:
        return _outer_loop(x, t, out, 23, True, limit)
    return _backward_loop(g, x, t, out, 23, True, limit)


def _run(rx: RoundedExecution | None, code: int, *inputs: torch.Tensor) -> torch.Tensor | None:
    """Pass `code` on the inputs (x; x and t; x, t and g) into a fresh tensor, counted as the ops it stands for, or
    None (fused.run_chain)."""
    out = fused.run_chain(rx, fused.CHAIN_GELU, _pass, code, _OPS[code], inputs[0], list(inputs), 1)
    return None if out is None else out[0]


class _Gelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        rx = active_rounding()
        u, h = _run(rx, INNER, x), None
        if u is None:  # the written-out form's ops before the tanh, dispatched
            h = x * 0.5
            u = C * (x + K * (x * x * x))
        t = torch.tanh(u)  # (dispatched: rounded, and logged, as in the written-out form)
        y = _run(rx, OUTER, x, t)
        if y is None:
            y = (fused.recomputed(rx.bits, torch.mul, x, 0.5) if h is None else h) * (1.0 + t)
        ctx.save_for_backward(x, t)
        return y

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        x, t = ctx.saved_tensors
        rx = active_rounding()
        gx = _run(rx, BACKWARD, x, t, g)
        if gx is not None:
            return gx
        bits = None if rx is None else rx.bits
        # autograd's ops on the written-out form, dispatched one by one, in its order (its sums into x's gradient
        # included); the forward's values they read computed again
        h, p, xx = (fused.recomputed(bits, op, a, b) for op, a, b in ((torch.mul, x, 0.5), (torch.add, t, 1.0),
                                                                        (torch.mul, x, x)))
        gh, gp = g * h, g * p
        gs = torch.ops.aten.tanh_backward(gh, t) * C
        gk = gs * K
        ga, gxx = gk * xx, gk * x
        a1 = gs + ga
        gb, gb2 = gxx * x, gxx * x
        return ((a1 + gb2) + gb) + gp * 0.5


def gelu(x: torch.Tensor) -> torch.Tensor | None:
    """GPT-2's GELU of x by the fused passes, inside a RoundedExecution at bits = 32 where they take x; else None."""
    rx = active_rounding()
    if not ENABLED or rx is None or rx.bits != 32 or not fused.usable64(x):
        return None
    return _Gelu.apply(x)
