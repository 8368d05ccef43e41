"""Float32 work's matmuls and convolutions computed in float64 under the exact resolution (issue 7).

Under float32 work (the scale models: bits = 19) about a tenth of a matmul's or convolution's outputs lie
within E32 = gamma_K(2^-24) * sum|terms| of a rounding boundary of the 10-bit grid, and the exact resolution
must settle every one of them. The same op computed from the same inputs in float64 leaves almost none:

- Products of float32 values are exact in float64, and partial sums of them are multiples of 2^-298 that
  neither overflow nor underflow, so the float64 op (natively or in an emulated device's order, FMA or not:
  the assumption the bounds make of every device's kernels, that they sum the products) is within
  E64 = gamma_K(2^-53) * sum|terms| of the exact value, and gamma_K(2^-53) < 2^-29 gamma_K(2^-24).
- The exact resolution then runs on the float64 op exactly as on float64 work: its bound E64 (vtrain.bounds
  for float64 outputs, with the norm pre-filter of vtrain.prefilter), its certificates and, for the few
  elements within E64 of a boundary (exact ties, sums that cancel), the exact recomputation. Its result is
  the correctly rounded exact value, a grid value at bits <= 32 and so a float32, whichever op produced it.

So the outputs are the same bits as from the float32 op with every ambiguous element resolved exactly
(tests/numerics/test_num_refine.py compares them on every device); only the cost changes. Session 12 ran the
float32 op first and settled its ambiguous elements with a second, float64 op; computing the float64 op
instead of the float32 one saves the float32 op, its full bound (a second convolution: float32 work's wide
bands leave too many candidates for the pre-filter) and the classification of ~12,000 candidates a step on
the scale CNN (step time 0.60x on the scale CNN and MLP, docs/benchmarks.md). The stats count the outputs
computed this way as "refined". Float64 work has no wider hardware type, and the log policy must round what
the device's float32 op computed, so neither changes.
"""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten

ENABLED = True  # tests turn it off to compare against the float32 op with every ambiguous element resolved

# The ops whose every output element is a sum of products (or of values) of the inputs, bounded by
# vtrain.bounds as gamma_K times the sum of |terms|.
REFINABLE = frozenset({aten.mm.default, aten.bmm.default, aten.dot.default, aten.mv.default, aten.addmm.default,
                       aten.convolution.default, aten.convolution_backward.default})


def widens(op: Any, args: tuple) -> bool:
    """Whether the exact resolution computes `op` on these arguments in float64 (float32 work's linear ops)."""
    return ENABLED and op in REFINABLE and any(isinstance(a, torch.Tensor) and a.dtype == torch.float32
                                               for a in args)


def widen(args: tuple) -> tuple:
    """The arguments with every float32 tensor converted to float64 (exactly)."""
    return tuple(a.to(torch.float64) if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a
                 for a in args)
