"""Composite ops written as primitives, for the `exact` resolution (DESIGN.md §1.3b).

Under `resolution = "exact"` every op output is the correctly rounded exact value of *its* definition.
A fused kernel such as softmax has no single exact value a device could agree on cheaply (its exact
value involves K transcendental terms), so the spec defines it as a fixed sequence of primitives, each
of which is correctly rounded onto the grid on its own: max (exact), a subtraction (IEEE), exp
(transcendental, correctly rounded), a sum (linear, correctly rounded exact sum), log or a division.
That sequence *is* the computation the spec's hash commits to, so it is versioned: changing any
decomposition below means a new CANONICAL_VERSION, and old runs keep the version they were trained
with (the spec's `canonical_version`). Ops that are already a single rounding of an exact value
(matmuls, convolutions, sums, means, the NLL loss, GELU) are not here: vtrain.resolve rounds them
exactly as they are.

Each function gets `call(op, *args)`, which runs a primitive through the rounded execution (so it is
rounded, and resolved when ambiguous), and the aten arguments of the composite.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from vtrain.composites import masked_exp

aten = torch.ops.aten

CANONICAL_VERSION = 1

Call = Callable[..., torch.Tensor]


def _shifted(call: Call, x: torch.Tensor, dim: int) -> torch.Tensor:
    # x - max(x): exact max, then one correctly rounded subtraction; every exponent argument is <= 0
    return call(aten.sub.Tensor, x, call(aten.amax.default, x, [dim], True))


def _softmax(call: Call, x: torch.Tensor, dim: int, half_to_float: bool = False) -> torch.Tensor:
    lost = torch.isneginf(x)
    # (where x holds a mask's -inf: 0 there, the others' values as `_shifted`'s, whose IEEE subtraction would
    # have an infinite output; a line of -inf only sums to 0, and the division fails there, naming it)
    e = masked_exp(call, x, lost, dim)[0] if lost.any() else call(aten.exp.default, _shifted(call, x, dim))
    return call(aten.div.Tensor, e, call(aten.sum.dim_IntList, e, [dim], True))


def _log_softmax(call: Call, x: torch.Tensor, dim: int, half_to_float: bool = False) -> torch.Tensor:
    s = _shifted(call, x, dim)
    total = call(aten.sum.dim_IntList, call(aten.exp.default, s), [dim], True)
    return call(aten.sub.Tensor, s, call(aten.log.default, total))


def _softmax_backward(call: Call, grad: torch.Tensor, out: torch.Tensor, dim: int, dtype: Any) -> torch.Tensor:
    # p (g - sum(g p))
    dot = call(aten.sum.dim_IntList, call(aten.mul.Tensor, grad, out), [dim], True)
    return call(aten.mul.Tensor, out, call(aten.sub.Tensor, grad, dot))


def _log_softmax_backward(call: Call, grad: torch.Tensor, out: torch.Tensor, dim: int, dtype: Any) -> torch.Tensor:
    # g - exp(out) sum(g)
    total = call(aten.sum.dim_IntList, grad, [dim], True)
    return call(aten.sub.Tensor, grad, call(aten.mul.Tensor, call(aten.exp.default, out), total))


DECOMPOSITIONS: dict[Any, Callable[..., torch.Tensor]] = {
    aten._softmax.default: _softmax,
    aten._log_softmax.default: _log_softmax,
    aten._softmax_backward_data.default: _softmax_backward,
    aten._log_softmax_backward_data.default: _log_softmax_backward,
}
