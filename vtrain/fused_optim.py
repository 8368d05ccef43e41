"""Optimizer updates as one fused pass per parameter: torch.optim's Adam, AdamW and SGD, rounded.

Under rounded execution every elementwise op of an optimizer update is a dispatch, a torch kernel and a
rounding pass over the whole parameter: an Adam update is 7-8 of them per parameter, more than half the
ops of a small step and, on a 1M-parameter MLP, as much time as its forward and backward passes. These
numba kernels compute, per element, exactly what that dispatch path computes: the same operations in the
work dtype (float32 work: float32 operations, the coefficients rounded to float32 as torch's float32
kernels take a Python scalar) in the same order, the primitives of a decomposed op (vtrain.ops: lerp,
addcmul, addcdiv, add with alpha) unrounded and every dispatched op's output rounded to the grid
(vtrain.fused). So the parameters and the optimizer state after a step are bit-identical to the dispatch
path's (tests/numerics/test_num_fused_optim.py steps both side by side), and so are the checkpoints.
On several torch threads, float64 work runs a group's parameters as one pass cut in parts across them
(vtrain.omp): on two threads GPT-2-tiny d_model 256's update took 4.8 against 8.1 ms a step.

The optimizers are torch's classes with `step` taking this path only where it applies: inside a
RoundedExecution, float64 work (or float32 work below bits = 32) on contiguous CPU tensors, the plain
single-tensor algorithm (no amsgrad, maximize, nesterov, capturable or differentiable). Everything else,
and every scalar op (the step counter), goes through torch's own code and the dispatch mode. State is
created by torch's own `_init_group` (torch is pinned), so the state dict is torch's.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import torch
from numba import njit
from torch.autograd.graph import increment_version
from torch.optim.adam import adam as torch_adam
from torch.optim.sgd import sgd as torch_sgd
from torch.utils._mode_utils import no_dispatch

from vtrain import fused, omp
from vtrain.fused import round_scalar as _r
from vtrain.rounding import NonFiniteError, RoundedExecution, active_rounding


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _flags(ok_p: bool, ok_s1: bool, ok_s2: bool) -> int:
    """What a kernel returns, checked as it writes (NaN fails `abs(x) <= limit` too): bit 0: the parameter
    left the grid, bit 1: the first state tensor, bit 2: the second."""
    return (0 if ok_p else 1) | (0 if ok_s1 else 2) | (0 if ok_s2 else 4)


@njit(cache=True, nogil=True, error_model="numpy")
def _adam(p: np.ndarray, g: np.ndarray, m1: np.ndarray, m2: np.ndarray, decay: float, wd: float, w1: float,
          beta2: float, w2: float, bc2_sqrt: float, eps: float, scale: float, m: int, cast32: bool, limit: float,
          lo: int, hi: int) -> int:
    # Elements lo:hi, the loop over slices from 0: over range(lo, hi), its indices not known to be >= 0, each read
    # kept numba's negative-index wrap and the loop stayed scalar (13 against 5 ms on 1M values). (lo and hi as
    # defaults left out, the compiled loop ran 1.6x as long.) The float32 cast as a constant, so the compiler
    # drops the general rounding from the loop (~1.4x).
    p, g, m1, m2 = p[lo:hi], g[lo:hi], m1[lo:hi], m2[lo:hi]
    if cast32:
        return _adam_loop(p, g, m1, m2, decay, wd, w1, beta2, w2, bc2_sqrt, eps, scale, 23, True, limit)
    return _adam_loop(p, g, m1, m2, decay, wd, w1, beta2, w2, bc2_sqrt, eps, scale, m, False, limit)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _adam_loop(p: np.ndarray, g: np.ndarray, m1: np.ndarray, m2: np.ndarray, decay: float, wd: float, w1: float,
               beta2: float, w2: float, bc2_sqrt: float, eps: float, scale: float, m: int, cast32: bool,
               limit: float) -> int:
    ok_p = ok_m1 = ok_m2 = True
    for i in range(p.size):
        x = p[i]
        grad = g[i]
        if decay != 1.0:  # AdamW: param.mul_(1 - lr * wd)
            x = _r(x * decay, m, cast32)
        if wd != 0.0:  # Adam: grad.add(param, alpha=wd)
            grad = _r(grad + x * wd, m, cast32)
        avg = _r(m1[i] + (grad - m1[i]) * w1, m, cast32)  # exp_avg.lerp_(grad, 1 - beta1)
        sq = _r(m2[i] * beta2, m, cast32)  # exp_avg_sq.mul_(beta2)
        gg = grad * grad
        sq = _r(sq + (gg if w2 == 1.0 else gg * w2), m, cast32)  # .addcmul_(grad, grad, value=1 - beta2)
        den = _r(math.sqrt(sq), m, cast32)  # exp_avg_sq.sqrt()
        den = _r(den / bc2_sqrt, m, cast32)  # / bias_correction2_sqrt
        den = _r(den + eps, m, cast32)  # .add_(eps)
        q = avg / den
        x = _r(x + (q if scale == 1.0 else q * scale), m, cast32)  # param.addcdiv_(avg, den, value=-step_size)
        p[i] = x
        m1[i] = avg
        m2[i] = sq
        ok_p &= abs(x) <= limit
        ok_m1 &= abs(avg) <= limit
        ok_m2 &= abs(sq) <= limit
    return _flags(ok_p, ok_m1, ok_m2)


@njit(cache=True, nogil=True, error_model="numpy")
def _sgd(p: np.ndarray, g: np.ndarray, buf: np.ndarray, fresh: bool, wd: float, momentum: float, alpha: float,
         neg_lr: float, m: int, cast32: bool, limit: float, lo: int, hi: int) -> int:
    p, g, buf = p[lo:hi], g[lo:hi], buf[lo:hi]
    if cast32:  # as in _adam
        return _sgd_loop(p, g, buf, fresh, wd, momentum, alpha, neg_lr, 23, True, limit)
    return _sgd_loop(p, g, buf, fresh, wd, momentum, alpha, neg_lr, m, False, limit)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _sgd_loop(p: np.ndarray, g: np.ndarray, buf: np.ndarray, fresh: bool, wd: float, momentum: float, alpha: float,
              neg_lr: float, m: int, cast32: bool, limit: float) -> int:
    ok_p = ok_buf = True
    for i in range(p.size):
        x = p[i]
        grad = g[i]
        if wd != 0.0:  # grad.add(param, alpha=wd)
            grad = _r(grad + x * wd, m, cast32)
        if momentum != 0.0:
            if fresh:  # buf = grad.clone()
                b = grad
            else:  # buf.mul_(momentum).add_(grad, alpha=1 - dampening)
                b = _r(buf[i] * momentum, m, cast32)
                b = _r(b + (grad if alpha == 1.0 else grad * alpha), m, cast32)
            buf[i] = b
            ok_buf &= abs(b) <= limit
            grad = b
        x = _r(x + grad * neg_lr, m, cast32)  # param.add_(grad, alpha=-lr)
        p[i] = x
        ok_p &= abs(x) <= limit
    return _flags(ok_p, ok_buf, True)


def _fits(rx: RoundedExecution | None, tensors: list[torch.Tensor]) -> bool:
    # float64 work, or float32 work below bits = 32 (at 32 its rounding is the identity, which torch's own
    # path skips as cheaply); one dtype for all
    if rx is None or not tensors:
        return False
    dtype = tensors[0].dtype
    work = dtype is torch.float64 or (dtype is torch.float32 and rx.bits < 32)
    return work and all(t.dtype is dtype and fused.usable(t) and not t.is_sparse for t in tensors)


def _zeros_agree(tensors: list[torch.Tensor], *coefficients: float) -> bool:
    """Whether each coefficient is zero in the work dtype exactly where it is zero as a Python float. The
    kernels skip a term on a zero coefficient as they hold it (float32 for float32 work), torch's code on
    the Python float: a weight decay of 1e-46 is 0 in float32, and torch still adds p * 0 (turning a -0
    gradient into +0), a momentum of 1e-46 still keeps a buffer. Where they disagree, torch's path runs."""
    if not tensors or tensors[0].dtype is not torch.float32:
        return True
    return all((c == 0) == (np.float32(c) == 0) for c in coefficients)


# One parameter's update: (its index in the group, [param, grad, state...], the kernel's coefficients, how many
# rounded ops it stands for)
Update = tuple[int, list[torch.Tensor], tuple, int]


def _run(rx: RoundedExecution, kernel: Callable[..., int], name: str, updates: list[Update]) -> None:
    """Run an update kernel on each update's (param, grad, state...) in place; it checks what it writes.

    Checking only the results suffices: every intermediate that can leave the grid (a weight-decayed
    gradient, a moment, a momentum buffer, the parameter) flows into a stored result, and Adam's
    denominator, sqrt(v) / sqrt(1 - beta2^t) + eps, stays finite for a second moment v on the grid. (The
    check as the kernel writes, a comparison folded into a flag, costs nothing measurable; a numpy pass
    over each written tensor afterwards cost ~4 us per tensor of 4096 elements.) tensors[1] is the
    gradient, read only; SGD without momentum passes the parameter as its buffer and writes no buffer.
    Float64 work over a group of 256K values or more runs as one pass over all its parameters, in parts on
    torch's threads (vtrain.omp; each value's update is its own, so the bits are the one pass's).
    """
    if not updates:
        return
    m = rx.bits - 9
    with no_dispatch():  # numpy views without sending each tensor's detach through the rounding mode
        arrays = [[fused.flat(t) for t in tensors] for _, tensors, _, _ in updates]
    # The coefficients in the work dtype, as torch's kernels take a Python scalar: float32 work then
    # computes every operation in float32 (its roundings return float32s: fused._to_multiple), float64 work
    # in float64. (Python ints as floats too: a kernel compiled for an integer coefficient ran 2.6x slower,
    # 31 against 12 ns an element for Adam on 4M parameters.)
    work = arrays[0][0].dtype.type
    scalars = [tuple(s if type(s) is bool else work(s) for s in u[2]) for u in updates]
    parts = omp.parts(sum(a[0].size for a in arrays)) if work is np.float64 else 1
    if parts > 1:
        kernels = omp.kernels()
        at, bad = kernels.update(kernels.ADAM if kernel is _adam else kernels.SGD, parts, arrays, scalars, m,
                                 rx._limit)
        flags = [bad if i == at else 0 for i in range(len(updates))]
    else:
        flags = [kernel(*a, *c, m, m == 23, rx._limit, 0, a[0].size) for a, c in zip(arrays, scalars)]
    for (index, tensors, _, rounded), bad in zip(updates, flags):
        for t in tensors[:1] + tensors[2:]:  # written through numpy: bumped as torch's in-place updates would be
            increment_version(t)  # (vtrain.prefilter.LineNorms trusts version counters)
        rx.count_rounded(tensors[0].numel() * rounded, ops=rounded)
        if bad:
            which = "parameter" if bad & 1 else "state"
            raise NonFiniteError(rx.step, -1, f"{name} update of parameter {index}",
                                 f"its {which} left the grid (NaN, inf or beyond the largest grid value)")


class RoundedAdam(torch.optim.Adam):
    """torch.optim.Adam (and AdamW: `decoupled_weight_decay=True`) with the fused rounded update."""

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        rx = active_rounding()
        if closure is not None or rx is None:
            return super().step(closure)
        for group in self.param_groups:
            if any(group[k] for k in ("amsgrad", "maximize", "capturable", "differentiable", "foreach", "fused")) \
                    or any(isinstance(v, torch.Tensor) for v in (group["lr"], *group["betas"])):
                return super().step(closure)
        for group in self.param_groups:
            params, grads, avgs, sqs, maxs, steps = [], [], [], [], [], []
            self._init_group(group, params, grads, avgs, sqs, maxs, steps)
            lr, (beta1, beta2), wd, eps = group["lr"], group["betas"], group["weight_decay"], group["eps"]
            if not (_fits(rx, [*params, *grads, *avgs, *sqs]) and _zeros_agree(params, wd)):
                self._torch_group(group, params, grads, avgs, sqs, steps)
                continue
            decoupled = group["decoupled_weight_decay"]
            updates: list[Update] = []
            for i, (p, g, avg, sq, step_t) in enumerate(zip(params, grads, avgs, sqs, steps)):
                with no_dispatch():  # the step counter's += 1 as the mode computes it, without its dispatch
                    rx.call(torch.ops.aten.add_.Tensor, step_t, 1)
                    step = step_t.item()
                # the Python scalars exactly as torch's _single_tensor_adam computes them
                bc1, bc2 = 1 - beta1**step, 1 - beta2**step
                step_size = lr / bc1
                decay = 1 - lr * wd if decoupled and wd != 0 else 1.0
                updates.append((i, [p, g, avg, sq], (decay, 0.0 if decoupled else wd, 1 - beta1, beta2, 1 - beta2,
                                                     bc2**0.5, eps, -step_size), 7 + (wd != 0)))
            _run(rx, _adam, "adam", updates)
        return None

    def _torch_group(self, group: dict, params: list, grads: list, avgs: list, sqs: list, steps: list) -> None:
        torch_adam(params, grads, avgs, sqs, [], steps, amsgrad=False, has_complex=False,
                   beta1=group["betas"][0], beta2=group["betas"][1], lr=group["lr"],
                   weight_decay=group["weight_decay"], eps=group["eps"], maximize=False, foreach=False,
                   capturable=False, differentiable=False, fused=False,
                   decoupled_weight_decay=group["decoupled_weight_decay"])


class RoundedAdamW(RoundedAdam):
    """torch.optim.AdamW's algorithm (Adam with decoupled weight decay), with the fused rounded update."""

    def __init__(self, params: Any, **kwargs: Any) -> None:
        super().__init__(params, decoupled_weight_decay=True, **kwargs)


class RoundedSGD(torch.optim.SGD):
    """torch.optim.SGD with the fused rounded update."""

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        rx = active_rounding()
        if closure is not None or rx is None or any(g["nesterov"] or g["maximize"] or g["foreach"] or g["fused"]
                                                    or isinstance(g["lr"], torch.Tensor) for g in self.param_groups):
            return super().step(closure)
        for group in self.param_groups:
            params, grads, bufs = [], [], []
            self._init_group(group, params, grads, bufs)
            momentum = group["momentum"]
            if not (_fits(rx, [*params, *grads, *(b for b in bufs if b is not None)])
                    and _zeros_agree(params, group["weight_decay"], momentum)):
                torch_sgd(params, grads, bufs, weight_decay=group["weight_decay"], momentum=momentum,
                          lr=group["lr"], dampening=group["dampening"], nesterov=False, maximize=False,
                          foreach=False, fused=False)
            else:
                wd, alpha = group["weight_decay"], 1 - group["dampening"]
                updates = []
                for i, (p, g) in enumerate(zip(params, grads)):
                    buf = bufs[i] if momentum != 0 else None
                    fresh = momentum != 0 and buf is None
                    if fresh:
                        buf = bufs[i] = torch.empty_like(p)
                    rounded = 1 + (wd != 0) + (2 if momentum != 0 and not fresh else 0)
                    updates.append((i, [p, g, buf if buf is not None else p],
                                    (fresh, wd, momentum, alpha, -group["lr"]), rounded))
                _run(rx, _sgd, "sgd", updates)
            if momentum != 0:  # as torch.optim.SGD.step
                for p, buf in zip(params, bufs, strict=True):
                    self.state[p]["momentum_buffer"] = buf
        return None
