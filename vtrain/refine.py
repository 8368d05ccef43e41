"""Float32 work's ambiguous elements settled by the same op in float64 (resolution `exact`, issue 7).

Under float32 work (the scale models: bits = 19) about a tenth of a matmul's or convolution's outputs lie
within E of a rounding boundary, E = gamma_K(2^-24) * sum|terms|, so the exact resolution would recompute
each of those exactly, one exact sum of K products per element. Almost none of them is ambiguous at float64
precision, and one float64 op settles them all at once:

- The op recomputed from the same float32 inputs in float64 (natively, in any summation order, FMA or
  not: the assumption E makes of every device's kernels, that they sum the products) is within
  E64 = gamma_K(2^-53) * sum|terms| of the exact value: products of float32 values are exact in float64,
  and partial sums of them are multiples of 2^-298 that neither overflow nor underflow.
- gamma_K(2^-53) / gamma_K(2^-24) = 2^-29 (1 - K 2^-24) / (1 - K 2^-53) < 2^-29, and E is at least
  gamma_K(2^-24) * sum|terms| whatever else it adds (the inflation that keeps a computed E an upper bound,
  the floor for underflow, the extra roundings of addmm's alpha and beta, which float64 makes as well with
  the smaller u). So E64 <= E * 2^-29, with the E the op was filtered with.
- Where the float64 value v lies farther than E * 2^-29 from both rounding boundaries around its grid
  rounding r, the exact value lies strictly between them: RNE_grid(exact) = r. The distance is one
  float64 subtraction from a boundary (the midpoint of two neighbouring grid values is exact in float64),
  so a relative error of 2^-53 at most, which the test's factor (1 + 2^-50) absorbs.
- Everything else goes on to the exact recomputation: elements still within E64 of a boundary (exact ties,
  sums that cancel), grid values at the largest magnitude (their upper boundary is the overflow threshold,
  not a midpoint), and anything not finite.

The result is the same bits as recomputing every ambiguous element exactly; only the cost changes. (One
visible difference: ops that vtrain.resolve cannot recompute, such as transposed and 3-d convolutions, raise
its ResolveError only when an element is still ambiguous after this step, not already when one is
ambiguous before it.) Float64 work has no wider hardware type to do this with, so it always recomputes
exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from vtrain import fused
from vtrain.grid import check_bits, grid_max

aten = torch.ops.aten

ENABLED = True  # tests turn it off to compare against resolving every ambiguous element exactly

# The ops whose every output element is a sum of products (or of values) of float32 inputs, bounded by
# vtrain.bounds as gamma_K times the sum of |terms|.
REFINABLE = frozenset({aten.mm.default, aten.bmm.default, aten.dot.default, aten.mv.default, aten.addmm.default,
                       aten.convolution.default, aten.convolution_backward.default})

# The float64 op costs about what the float32 op did; it pays once this share of an output is ambiguous.
# Exact-resolution step time with refinement against without, medians of five pairs: at 1/64, scale CNN
# 0.65, scale MLP 0.79; refining whenever any element is ambiguous, 0.60 and 0.97 (the MLP's small ops
# then pay a float64 op for a handful of cheap exact sums).
MIN_SHARE = 1 / 64


def pays(op: Any, v: torch.Tensor, ambiguous: int) -> bool:
    """Whether `ambiguous` elements of float32 output v of `op` are worth one float64 recomputation."""
    return (ENABLED and v.dtype == torch.float32 and op in REFINABLE
            and ambiguous >= max(1.0, v.numel() * MIN_SHARE))


def recompute(op: Any, args: tuple, kwargs: dict) -> list[torch.Tensor | None]:
    """The op's outputs computed natively in float64 from its float32 arguments (exact conversions). Not in
    an emulated device's order: E64 holds for every order, and the emulations cost several times the native
    op. cuDNN is off for it: its FFT and Winograd convolutions are not sums of the products, which is all
    the argument allows (CPU float64 convolutions are im2col and GEMM). (Run it where no dispatch mode is
    active, as inside one's handler.)"""
    wide = tuple(a.to(torch.float64) if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a
                 for a in args)
    with torch.backends.cudnn.flags(enabled=False):
        out = op(*wide, **kwargs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def settle(v64: torch.Tensor, e: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(which elements the float64 values v64 settle, their grid roundings, float64), with E (the float32
    op's bound) at them: settled elements' roundings are RNE_grid of their exact values (module docstring).
    One compiled pass (vtrain.fused.settle): a small op's few hundred elements cost more in ~20 torch calls
    than the exact sums they save."""
    settled, r = fused.settle(v64.cpu().contiguous().numpy(), e.cpu().contiguous().numpy(), check_bits(bits),
                              2.0**-29 * (1 + 2.0**-50), grid_max(bits))
    return torch.from_numpy(settled).to(v64.device), torch.from_numpy(r).to(v64.device)
