"""Float32 work's device-dependent ops computed in float64 under the exact resolution (issue 7).

Under float32 work (the scale models: bits = 19) about a tenth of a matmul's or convolution's outputs lie
within E32 = gamma_K(2^-24) * sum|terms| of a rounding boundary of the 10-bit grid, and fewer but still many
of a sum's, a pooling's or a transcendental function's; the exact resolution must settle every one of them.
The same op computed from the same inputs in float64 leaves almost none:

- Float32 inputs convert to float64 exactly. Whatever bounds the op's error in float64 work bounds it here
  (vtrain.bounds for float64 outputs: for linear ops E64 = gamma_K(2^-53) * sum|terms|, 2^-29 of E32, as
  products of float32 values are exact in float64 and no partial sum of them overflows or underflows; for
  transcendental functions a few float64 ulps), in any device's order, natively or emulated.
- The exact resolution then runs on the float64 op exactly as on float64 work: its bound, the norm
  pre-filter of vtrain.prefilter, its certificates and, for the few elements within E64 of a boundary (exact
  ties, sums that cancel), the exact recomputation. Its result is the correctly rounded exact value of the
  op on its inputs, a grid value at bits <= 32 and so a float32, whichever op produced it.

So the outputs are the same bits as from the float32 op with every ambiguous element resolved exactly
(tests/numerics/test_num_refine.py compares them on every device, op by op); only the cost changes. Session
12 ran the float32 matmul or convolution first and settled its ambiguous elements with a second, float64 op;
computing the float64 op instead also saves the float32 op, its full bound (float32 work's wide bands leave
too many candidates for the pre-filter) and the classification of ~13,600 candidates a step on the scale CNN,
and settles the other ops' elements too (docs/benchmarks.md). The stats count the outputs computed this way
as "refined". An in-place op computes its functional form so and writes the result into its operand. Not
widened: float64 work (no wider hardware type), the log policy (it rounds what the device's float32 op
computed), calls that name an output dtype or mix float32 and float64 tensors.
The single IEEE ops (+ - x / sqrt) stay float32: at bits <= 19 their double rounding is exact already.
"""

from __future__ import annotations

import torch

ENABLED = True  # tests turn it off to compare against the float32 op with every ambiguous element resolved


def widens(args: tuple, kwargs: dict) -> bool:
    """Whether the exact resolution computes a device-dependent op on these arguments in float64: float32
    work's (every floating-point tensor argument float32: a call mixing dtypes keeps the error torch gives
    it), unless the call asks for an output dtype of its own."""
    floats = [a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
    return ENABLED and kwargs.get("dtype") is None and bool(floats) and all(d == torch.float32 for d in floats)


def widen(args: tuple) -> tuple:
    """The arguments with every float32 tensor converted to float64 (exactly)."""
    return tuple(a.to(torch.float64) if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a
                 for a in args)
