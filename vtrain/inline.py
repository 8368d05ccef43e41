"""Small matmuls: the error bound E computed inside the rounding pass (the trainer's filter, DESIGN.md §1.3).

On a small model a matmul's full bound (vtrain.bounds.abs_bounds: |A|, |B|, a second matmul and a
scaling pass) costs five torch calls and a buffer, more than its arithmetic, before the rounding kernel
reads it back; the norm pre-filter (vtrain.prefilter) costs ~100 us of Python and numpy calls around its
kernels. For outputs of up to INLINE_PRODUCTS products (M N K) fused.round_near_mm instead tests each value
against the two lines' norms and sums |a_ik| |b_kj| only where that test flags it, as it rounds: one
compiled call. (A 32 x 64 @ 64 x 64 mm's bound and rounding: 5 us. The limit, measured in one process:
GPT-2-tiny's default step 43.3 ms with 2^18, 41.5 with 2^24, 41.3 with 2^26, with logs and states identical;
at d_model 256, whose matmuls have 2^25 to 2^28 products, 409 ms with 2^18 or 2^24, 411 with 2^26 and 426 with
every matmul here: the pre-filter's norms are shared by the forward and backward matmuls of an operand, and
computed once. Session 56 lowered it from 2^24 to 2^22 (at context 128, batch 8): the pre-filter's kernels
run on torch's threads and this one on one, and its norms are shared, so the larger of these products go faster
there, the language-model head's at d_model 128 and 256 (1024 x d_model x 37: 2^22.2 and 2^23.2 products) and
attention's at d_model 64 and 128 (2^23 and 2^24): the trainer's step 0.95, 0.97 and 0.98 of its time at d_model
64, 128 and 256 on two threads, 0.97-0.99 on one; 2^21 made the default size's step (its products 2^22 or fewer)
~3 % slower. The logs take a few more entries there, as the pre-filter's band is U's (rounding.UPPER_BAND); the
states are the same.)

E is the full bound's formula, gamma_k (1 + 2 gamma_k + 2^-20) times the sum of |terms| (alpha and beta
as absolute values) plus k floor units (bounds._floor_unit), with k = K (+ 3 for addmm's scaling and
addition), its sums added in the kernel's order: vtrain.bounds' slack covers any order. The auditor
gathers E at its entries by vtrain.prefilter's BOUNDS_AT, in yet another order; each side's E bounds the
same exact sum, which is all the band needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from vtrain.bounds import _floor_unit, gamma, unit_roundoff

aten = torch.ops.aten

INLINE_PRODUCTS = 1 << 22
NO_BIAS = np.zeros((0, 0))  # (no bias: a matmul's, for the kernels that take one as a 2-d array)


@dataclass(frozen=True)
class Inline:
    """The operands of E = (alpha sum_k |a_ik| |b_kj| + beta |bias_ij|) * scale + floor, as numpy views (a and
    b as batches, (B, M, K) and (B, K, N); bias (M, N), broadcast, or (0, 0) for none), for
    fused.round_near_mm."""

    a: np.ndarray
    b: np.ndarray
    bias: np.ndarray
    alpha: float
    beta: float
    scale: float
    floor: float


InlineBound = Callable[[tuple, dict, Sequence["torch.Tensor | None"]], "Inline | None"]


def _numpy(t: torch.Tensor) -> np.ndarray:
    return (t.detach() if t.requires_grad else t).numpy()


def _inline(func: Any) -> InlineBound:
    def inline(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> Inline | None:
        """E's operands for a small float64 CPU matmul, or None (the full bound takes it)."""
        v = outs[0]
        if v.dtype is not torch.float64 or not v.is_cpu or v.dim() != (3 if func is aten.bmm.default else 2):
            return None
        if func is aten.addmm.default:
            bias, a, b = args[:3]
            beta, alpha, terms = kwargs.get("beta", 1), kwargs.get("alpha", 1), 3
        else:
            (a, b), bias, beta, alpha, terms = args[:2], None, 1, 1, 0
        k = a.shape[-1]
        if not 0 < v.numel() * k <= INLINE_PRODUCTS or any(x.dtype is not torch.float64 or not x.is_cpu
                                                         for x in (a, b)):
            return None
        if alpha == 0:  # torch skips the products, inf and NaN included, where the kernel's 0 * inf would not
            return None
        if bias is not None and beta != 0 and (bias.dtype is not torch.float64 or not bias.is_cpu):
            return None
        kk = k + terms
        g = gamma(kk, unit_roundoff(v.dtype))
        # (beta 0: torch ignores the bias)
        bias_np = NO_BIAS if bias is None or beta == 0 else _numpy(bias.expand(v.shape))
        a_np, b_np = _numpy(a), _numpy(b)
        if a_np.ndim == 2:  # a batch of one
            a_np, b_np = a_np[None], b_np[None]
        return Inline(a_np, b_np, bias_np, float(abs(alpha)), float(abs(beta)), g * (1 + 2 * g + 2.0**-20),
                      max(kk, 1) * _floor_unit(v.dtype))

    return inline


INLINE: dict[Any, InlineBound] = {op: _inline(op)
                                  for op in (aten.mm.default, aten.addmm.default, aten.bmm.default)}
