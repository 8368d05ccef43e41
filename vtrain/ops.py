"""The op registry: every aten op the rounded training may meet, in one of five classes (DESIGN.md §1.2).

1. EXACT: exact on grid inputs (views, copies, relu, neg, max, where, fills, comparisons, ...): the output
   is a grid value (or not floating at all), so nothing is done.
2. IEEE: a single correctly rounded IEEE operation per element (+, -, *, /, sqrt, dtype casts): every
   IEEE device gives the same bits, so the output is rounded to the grid and never logged.
   Fused elementwise ops (add/sub with alpha != 1, addcmul, addcdiv, lerp) are several roundings, which
   kernels order differently (FMA contraction, lerp's branch at weight 0.5). We *decompose* them into a
   fixed sequence of IEEE primitives in the work dtype, written out in `_DECOMPOSED`; each primitive is
   correctly rounded, so the sequence gives the same bits on every device, and only the final result is
   rounded to the grid. No log, no bound, and cheaper than a device op. Division goes through `_div`
   for the same reason: CUDA divides by a scalar as a multiplication by its reciprocal. And the square
   root through `_sqrt`: torch's CPU kernel is not correctly rounded.
3. DEVICE: device-dependent (matmuls, convolutions, reductions, softmax family, NLL loss, pooling sums,
   embedding backward, transcendental functions, GELU): computed by the Device, rounded, and logged with
   an error bound from vtrain.bounds.
4. COMPOSITE: ops run as fixed sequences of registry ops (vtrain.composites), each op of them dispatched on its
   own: torch's fused norms, vector norms, variances, SiLU, softplus, scaled dot-product attention, the
   regression and binary losses, and their backward passes.
5. DRAW: random draws (bernoulli, native_dropout: dropout's masks; rand, randn and their like, normal_, uniform_:
   noise), drawn from the rounded execution's seed rather than the device's generator (vtrain.draws), so that every
   device draws the same values.

An op in no class raises UnsupportedOpError naming it: nothing passes through silently. In-place class 3
ops are computed out of place (through their functional overload) so that the error bound sees the
original inputs, then copied into `self`.

torch.optim's multi-tensor (foreach) ops are composites (vtrain.composites): each tensor's op in turn; and so are
its fused kernels (fused=True): each parameter's update as the single-tensor loop computes it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch
from torch.utils import _pytree as pytree

from vtrain.composites import COMPOSITES
from vtrain.draws import DRAWS
from vtrain.grains import EXACT_ALL, ExactAll
from vtrain.inline import INLINE, InlineBound
from vtrain.prefilter import BOUNDS_AT, UPPERS, Upper
from vtrain.bounds import BOUNDS, RELATIVE, ROWS, Bound, PositionBound, Relative, RowBand
from vtrain.errors import UnsupportedOpError

aten = torch.ops.aten


class OpClass(enum.IntEnum):
    EXACT = 1
    IEEE = 2
    DEVICE = 3
    COMPOSITE = 4
    DRAW = 5


@dataclass(frozen=True)
class OpSpec:
    """How the rounded execution treats one aten overload."""

    name: str
    cls: OpClass
    inplace: bool = False  # writes its result into args[0]
    functional: Any = None  # class 3 in-place ops: the out-of-place overload actually computed
    bound: Bound | None = None  # class 3: the error bound of vtrain.bounds
    bound_at: PositionBound | None = None  # class 3 matmuls: `bound` at given flat positions only
    bound_upper: Upper | None = None  # class 3 matmuls: a cheap upper bound of `bound` (vtrain.prefilter)
    bound_inline: InlineBound | None = None  # class 3 small matmuls: `bound` computed as they round (vtrain.inline)
    bound_relative: Relative | None = None  # class 3 functions of one output: `bound`'s terms (vtrain.bounds.RELATIVE)
    bound_rows: RowBand | None = None  # class 3 softmax family: `bound` computed row by row as it rounds (bounds.ROWS)
    exact_all: ExactAll | None = None  # class 3 sums: whether every output is exact on any device (vtrain.grains)
    constants: bool = False  # class 1 ops whose number arguments become output values (`_CONSTANTS`)
    integer: bool = False  # class 1 by its operands: outside the registry, on integer and boolean tensors only
    decomposed: Callable[..., Any] | None = None  # class 2 fused ops: the primitive sequence; class 4: its
    # sequence of registry ops, given a function that dispatches one (`RoundedExecution.call`) first


def _names(*ops: Any) -> list[Any]:
    return list(ops)


_EXACT = _names(
    # views and layout
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten._reshape_alias.default,
    aten.t.default, aten.transpose.int, aten.permute.default, aten.expand.default, aten.alias.default,
    aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default, aten.select.int,
    aten.slice.Tensor, aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int,
    aten.as_strided.default, aten.detach.default, aten.detach_.default, aten.lift_fresh.default,
    aten.lift_fresh_copy.default, aten.clone.default, aten.contiguous.default, aten._local_scalar_dense.default,
    aten.unfold.default, aten.flip.default, aten.roll.default, aten.transpose_.default, aten.unsafe_split.Tensor,
    aten.unsafe_split_with_sizes.default, aten.repeat.default, aten.pixel_shuffle.default,
    aten.pixel_unshuffle.default, aten.diagonal.default, aten.unsqueeze_.default, aten.squeeze_.dim,
    # gathers and joins of existing values
    aten.index_select.default, aten.gather.default, aten.index.Tensor, aten.cat.default, aten.stack.default,
    aten.embedding.default, aten.masked_fill.Scalar, aten.masked_fill_.Scalar, aten.scatter.value,
    aten.scatter.src, aten.scatter_.value, aten.scatter_.src, aten.index_put_.default, aten.index_put.default,
    aten.constant_pad_nd.default, aten.sort.default, aten.topk.default, aten.masked_fill.Tensor,
    aten.masked_fill_.Tensor, aten.tril.default, aten.triu.default, aten.tril_.default, aten.triu_.default,
    aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.replication_pad1d.default,
    aten.replication_pad2d.default, aten.reflection_pad3d.default, aten.replication_pad3d.default,
    aten.upsample_nearest1d.default, aten.upsample_nearest3d.default, aten._upsample_nearest_exact1d.default,
    aten._upsample_nearest_exact2d.default, aten._upsample_nearest_exact3d.default, aten.im2col.default,
    aten.channel_shuffle.default, aten.hardshrink.default, aten.hardshrink_backward.default,
    aten.softshrink_backward.default,
    # backward passes of views and selections: the gradient copied into zeros
    aten.slice_backward.default, aten.select_backward.default, aten.slice_scatter.default,
    aten.select_scatter.default, aten.diagonal_backward.default, aten.diag_embed.default, aten.index_fill.int_Tensor,
    aten.index_fill.int_Scalar,
    # creation and fills with grid constants (zero, one, a grid scalar)
    aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default, aten.zeros.default,
    aten.ones.default, aten.empty.memory_format, aten.new_zeros.default, aten.new_ones.default,
    aten.new_empty.default, aten.zero_.default, aten.scalar_tensor.default, aten.eye.default, aten.eye.m,
    # (autograd's AccumulateGrad copies a gradient it cannot take over, one something else still references,
    # into a new_empty_strided tensor in the parameter's layout, every value written before it is read, as
    # with the empty tensors above)
    aten.new_empty_strided.default, aten.empty_strided.default,
    # exact elementwise functions and selections
    aten.relu.default, aten.relu_.default, aten.threshold_backward.default, aten.neg.default, aten.neg_.default,
    aten.hardtanh.default, aten.hardtanh_.default, aten.hardtanh_backward.default, aten.upsample_nearest2d.default,
    aten.abs.default, aten.sign.default, aten.sgn.default, aten.where.self, aten.maximum.default, aten.minimum.default,
    aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.clamp.Tensor, aten.clamp_min.Tensor,
    aten.clamp_min_.Tensor, aten.clamp_max.Tensor, aten.clamp_max_.Tensor, aten.clamp_.default, aten.clamp_.Tensor,
    aten.clamp_min_.default, aten.clamp_max_.default, aten.floor.default, aten.ceil.default, aten.trunc.default,
    aten.round.default, aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default,
    aten.adaptive_max_pool2d.default, aten.argmax.default,
    aten.argmin.default, aten.max.dim, aten.min.dim, aten.max.default, aten.min.default, aten.amax.default,
    aten.amin.default, aten.threshold.default, aten.threshold_.default, aten.diagonal_copy.default,
    aten.adaptive_max_pool3d.default, aten.cummax.default, aten.cummin.default, aten.nan_to_num.default,
    aten.take.default, aten.masked_select.default, aten.masked_scatter.default, aten.masked_scatter_.default,
    aten.median.dim, aten.median.default, aten.kthvalue.default, aten.frac.default, aten.floor_.default,
    aten.ceil_.default, aten.trunc_.default, aten.round_.default,
    # x - n y exactly (IEEE's fmod is exact, and of two grid values a grid value: a multiple of the smaller lsb
    # below |y|)
    aten.fmod.Scalar, aten.fmod.Tensor, aten.fmod_.Scalar, aten.fmod_.Tensor,
    # comparisons and boolean logic (no floating output)
    aten.eq.Tensor, aten.eq.Scalar, aten.ne.Tensor, aten.ne.Scalar, aten.lt.Tensor, aten.lt.Scalar,
    aten.le.Tensor, aten.le.Scalar, aten.gt.Tensor, aten.gt.Scalar, aten.ge.Tensor, aten.ge.Scalar,
    aten.logical_not.default, aten.logical_and.default, aten.logical_or.default, aten.isnan.default,
    aten.isinf.default, aten.isfinite.default, aten.any.default, aten.all.default, aten.nonzero.default,
    aten.bitwise_and.Tensor, aten.bitwise_or.Tensor, aten.bitwise_not.default, aten.maximum.out,
    aten.logical_and_.default, aten.logical_or_.default, aten.bitwise_and_.Tensor, aten.bitwise_or_.Tensor,
    # bookkeeping
    torch.ops.profiler._record_function_enter_new.default, torch.ops.profiler._record_function_exit._RecordFunction,
)

# Class 1 ops that write their number arguments (a Python number, or a one-value tensor torch made of one) into
# the output, or compute it from them exactly (fmod by a number): exact only where those are grid
# values, as a mask's -128 or a clamp's 0 and 1. The rounded
# execution rounds their output where one is off the grid (clamp(x, 0.1)); values beyond the grid's range stay,
# as infinities do (a mask of -inf or finfo.min before a softmax); a NaN fails there, naming the op.
_CONSTANTS = frozenset(_names(
    aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default, aten.clamp.Tensor, aten.clamp_min.Tensor,
    aten.clamp_min_.Tensor, aten.clamp_max.Tensor, aten.clamp_max_.Tensor, aten.clamp_.default, aten.clamp_.Tensor,
    aten.clamp_min_.default, aten.clamp_max_.default, aten.hardtanh.default, aten.hardtanh_.default,
    aten.masked_fill.Scalar, aten.masked_fill_.Scalar, aten.masked_fill.Tensor, aten.masked_fill_.Tensor,
    aten.scalar_tensor.default, aten.constant_pad_nd.default, aten.where.self, aten.scatter.value,
    aten.scatter_.value, aten.index_put.default, aten.index_put_.default, aten.threshold.default,
    aten.threshold_.default, aten.index_fill.int_Scalar, aten.nan_to_num.default, aten.fmod.Scalar, aten.fmod.Tensor,
    aten.fmod_.Scalar, aten.fmod_.Tensor,
))

_IEEE = _names(
    aten.mul.Tensor, aten.mul_.Tensor, aten.mul.Scalar, aten.mul_.Scalar,
    aten.reciprocal.default, aten.reciprocal_.default,
    aten._to_copy.default, aten.copy_.default, aten.fill_.Scalar, aten.fill_.Tensor, aten.full.default,
    aten.full_like.default, aten.new_full.default,
    # dropout's gradient: the mask is 0/1 and the kept values are scaled by one multiplication
    aten.native_dropout_backward.default,
    # start + i step: off the grid wherever the grid's spacing exceeds the step's, or the step is not a grid value
    aten.arange.default, aten.arange.start, aten.arange.start_step,
    # x - lambda above lambda, x + lambda below -lambda, 0 between: one operation a value
    aten.softshrink.default,
    # fmod (exact), plus y where the signs differ (torch's kernels, CPU and CUDA): one rounded addition
    aten.remainder.Scalar, aten.remainder.Tensor, aten.remainder_.Scalar, aten.remainder_.Tensor,
)

# Fused ops as fixed sequences of IEEE primitives (each torch op below is one correctly rounded
# operation per element; separate eager kernels are never contracted into an FMA).
def _scaled(t: Any, alpha: Any) -> Any:
    if alpha == 1:
        return t
    # a Python scalar times alpha is one IEEE double multiplication, the same on every host
    return torch.mul(t, alpha) if isinstance(t, torch.Tensor) else t * alpha


def _add(x: Any, other: Any, alpha: Any = 1) -> torch.Tensor:
    return torch.add(x, _scaled(other, alpha))


def _sub(x: Any, other: Any, alpha: Any = 1) -> torch.Tensor:
    return torch.sub(x, _scaled(other, alpha))


def _rsub(x: Any, other: Any, alpha: Any = 1) -> torch.Tensor:
    return torch.rsub(_scaled(x, alpha), other)  # other - alpha * x


def _addcmul(x: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor, value: Any = 1) -> torch.Tensor:
    prod = torch.mul(t1, t2)
    return torch.add(x, prod if value == 1 else torch.mul(prod, value))


def _addcdiv(x: torch.Tensor, t1: torch.Tensor, t2: torch.Tensor, value: Any = 1) -> torch.Tensor:
    quot = torch.div(t1, t2)
    return torch.add(x, quot if value == 1 else torch.mul(quot, value))


def _lerp(x: torch.Tensor, end: torch.Tensor, weight: Any) -> torch.Tensor:
    return torch.add(x, torch.mul(torch.sub(end, x), weight))  # one formula for every weight


def _div(x: torch.Tensor, other: Any) -> torch.Tensor:
    # CUDA's true-division kernel multiplies by the reciprocal when the divisor is a CPU scalar (two
    # roundings; Adam divides by one every step). A divisor tensor of x's shape keeps it one IEEE division.
    if x.is_cuda and (not isinstance(other, torch.Tensor) or (other.dim() == 0 and not other.is_cuda)):
        other = torch.full_like(x, float(other))
    return torch.div(x, other)


def _put(x: torch.Tensor, index: torch.Tensor, source: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    # put (take's backward, with accumulate) as index_put over x's flat values: a repeated position refused
    flat, values = x.reshape(-1), source.reshape(-1)
    if accumulate:
        return _index_add(flat, [index.reshape(-1)], values).view(x.shape)
    _once(aten.put.default, flat, [index.reshape(-1)], "a position named twice takes one of its values, and the "
          "device's kernel chooses which")
    return aten.index_put.default(flat, [index.reshape(-1)], values).view(x.shape)


def _index_copy(x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    # copies, but an index named twice keeps one of its sources, the kernel's choice, as in `_index_write`: refused
    _once(aten.index_copy.default, x, [None] * (dim % x.dim()) + [index], "an index named twice keeps one of its "
          "sources, and the device's kernel chooses which; name each index once")
    return aten.index_copy.default(x, dim, index, source)


def _div_out(x: torch.Tensor, other: Any, *, out: torch.Tensor) -> torch.Tensor:
    # (spectral_norm's power iteration normalises into its vectors with out=)
    return out.copy_(_div(x, other))


def _sqrt(x: torch.Tensor) -> torch.Tensor:
    # torch's vectorised CPU square root (2.13 on AVX-512) is off by one ulp on ~0.7 % of values, float32 and
    # float64 alike: not the IEEE operation every other device (CUDA, the fused optimizers) computes.
    # numpy's is the hardware's correctly rounded one.
    if x.is_cpu and x.dtype in (torch.float32, torch.float64):
        a = x.detach().numpy()
        return torch.from_numpy(np.sqrt(a, out=np.empty_like(a)))  # (an array out: 0-d inputs stay arrays)
    return torch.sqrt(x)


def _tanh_backward(grad: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.mul(grad, torch.rsub(torch.mul(y, y), 1))  # g (1 - y^2)


def _sigmoid_backward(grad: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.mul(grad, torch.mul(torch.rsub(y, 1), y))  # g ((1 - y) y)


def _distinct(x: torch.Tensor, indices: list) -> bool:
    """Whether the positions of x that index_put's `indices` name are all different (one boolean mask alone names
    each once; a mask beside other indices counts as not)."""
    given = [(d, t) for d, t in enumerate(indices) if t is not None]
    if any(t.dtype == torch.bool for _, t in given):
        return len(given) == 1
    # Each position as one integer, its indices' mixed-radix number over the named dims, sorted: unique rows of a
    # 2-d key tensor (torch.unique(dim=0)) took ~5 ms a call on a padding's 300 gradients, the sort ~0.1.
    keys = torch.zeros((), dtype=torch.long)
    for d, t in given:
        keys = keys * x.shape[d] + t.remainder(x.shape[d])
    keys = keys.reshape(-1).sort().values
    return bool((keys[1:] != keys[:-1]).all())


def _once(op: Any, x: torch.Tensor, indices: list, detail: str) -> None:
    """UnsupportedOpError naming `op` (with `detail`) where a floating x's positions that `indices` name repeat
    (`_distinct`): what lands there would be the device kernel's order's choice. (Integer writes are exact.)"""
    if x.is_floating_point() and not _distinct(x, indices):
        raise UnsupportedOpError(str(op), detail)


def _index_add(x: torch.Tensor, indices: list, values: torch.Tensor, accumulate: bool = True) -> torch.Tensor:
    # index_put with accumulate: each named position plus its values, which for distinct positions is one IEEE
    # addition each (an indexing's backward into zeros: exact). Repeated positions would sum floats in the order
    # the device's kernel chooses: refused. (Integer sums are the same in any order.)
    _once(aten.index_put.default, x, indices, "accumulate=True at a position named twice sums in the device's "
          "order; gather with a one-hot matmul or an embedding instead")
    return aten.index_put.default(x, indices, values, True)  # (the aten op: its indices may hold None)


def _integer_indices(indices: list) -> bool:
    """Whether index_put's indices are integer tensors only, which may name a position twice."""
    given = [t for t in indices if t is not None]
    return bool(given) and all(t.dtype != torch.bool for t in given)


def _index_write(x: torch.Tensor, indices: list, values: torch.Tensor, accumulate: bool = False) -> torch.Tensor:
    # index_put without accumulate by integer indices: a position named twice takes one of its values, and which
    # one is the kernel's choice (in order on one CPU thread, any on parallel ones and on a GPU): refused.
    # Distinct positions are copies.
    _once(aten.index_put.default, x, indices, "x[idx] = values at a position idx names twice keeps one of its "
          "values, and the device's kernel chooses which; name each position once")
    return aten.index_put.default(x, indices, values)


_DECOMPOSED = {
    aten.tanh_backward.default: (_tanh_backward, False),
    aten.sigmoid_backward.default: (_sigmoid_backward, False),
    aten.add.Tensor: (_add, False), aten.add_.Tensor: (_add, True),
    aten.add.Scalar: (_add, False), aten.add_.Scalar: (_add, True),
    aten.sub.Tensor: (_sub, False), aten.sub_.Tensor: (_sub, True),
    aten.sub.Scalar: (_sub, False), aten.sub_.Scalar: (_sub, True),
    aten.rsub.Scalar: (_rsub, False), aten.rsub.Tensor: (_rsub, False),
    aten.addcmul.default: (_addcmul, False), aten.addcmul_.default: (_addcmul, True),
    aten.addcdiv.default: (_addcdiv, False), aten.addcdiv_.default: (_addcdiv, True),
    aten.lerp.Scalar: (_lerp, False), aten.lerp_.Scalar: (_lerp, True),
    aten.lerp.Tensor: (_lerp, False), aten.lerp_.Tensor: (_lerp, True),
    aten.div.Tensor: (_div, False), aten.div_.Tensor: (_div, True),
    aten.div.Scalar: (_div, False), aten.div_.Scalar: (_div, True), aten.div.out: (_div_out, False),
    aten.put.default: (_put, False), aten.put_.default: (_put, True),
    aten.index_copy.default: (_index_copy, False), aten.index_copy_.default: (_index_copy, True),
    aten.sqrt.default: (_sqrt, False), aten.sqrt_.default: (_sqrt, True),
}

_DEVICE_INPLACE = {
    aten.pow_.Scalar: aten.pow.Tensor_Scalar, aten.pow_.Tensor: aten.pow.Tensor_Tensor,
    aten.atan2_.default: aten.atan2.default,
    **{getattr(aten, name + "_").default: getattr(aten, name).default
       for name in ("exp", "exp2", "log", "tanh", "sigmoid", "rsqrt", "erf", "sin", "cos", "tan", "asin", "acos", "atan",
                    "sinh", "cosh", "asinh", "acosh", "atanh", "log2", "log10", "erfc", "lgamma", "digamma", "erfinv")},
}


def _build() -> dict[Any, OpSpec]:
    table: dict[Any, OpSpec] = {}
    for op in _EXACT:
        table[op] = OpSpec(str(op), OpClass.EXACT, constants=op in _CONSTANTS)
    for op in _IEEE:
        table[op] = OpSpec(str(op), OpClass.IEEE, inplace=op._schema.name.endswith("_"))
    for op, bound in BOUNDS.items():
        table[op] = OpSpec(str(op), OpClass.DEVICE, bound=bound, bound_at=BOUNDS_AT.get(op), bound_upper=UPPERS.get(op),
                           bound_inline=INLINE.get(op), bound_relative=RELATIVE.get(op), bound_rows=ROWS.get(op),
                           exact_all=EXACT_ALL.get(op))
    for op, functional in _DEVICE_INPLACE.items():
        table[op] = OpSpec(str(op), OpClass.DEVICE, inplace=True, functional=functional, bound=BOUNDS[functional],
                           bound_relative=RELATIVE.get(functional))
    for op, (fn, inplace) in _DECOMPOSED.items():
        table[op] = OpSpec(str(op), OpClass.IEEE, inplace=inplace, decomposed=fn)
    for op, fn in COMPOSITES.items():
        table[op] = OpSpec(str(op), OpClass.COMPOSITE, decomposed=fn)
    for op in DRAWS:
        table[op] = OpSpec(str(op), OpClass.DRAW, inplace=op._schema.name.endswith("_"))
    return table


_TABLE = _build()
_POW_SQUARE = OpSpec(str(aten.pow.Tensor_Scalar), OpClass.IEEE,
                     decomposed=lambda x, e: torch.mul(x, x) if e == 2 else x.clone())
_INDEX_ADDS = {op: OpSpec(str(op), OpClass.IEEE, inplace=op is aten.index_put_.default, decomposed=_index_add)
               for op in (aten.index_put.default, aten.index_put_.default)}
_INDEX_WRITES = {op: OpSpec(str(op), OpClass.IEEE, inplace=op is aten.index_put_.default, decomposed=_index_write)
                 for op in (aten.index_put.default, aten.index_put_.default)}


# Unregistered ops that a common model meets, and what to do instead (the error's detail)
_INSTEAD = {
    aten.mkldnn_rnn_layer.default: "oneDNN's fused LSTM kernel, which torch takes for float32 work on the CPU; "
                                   "run the model under torch.backends.mkldnn.flags(enabled=False), and the LSTM "
                                   "runs as its cells' matmuls and functions",
    aten.logcumsumexp.default: "its backward pass (torch's formula, which autograd runs op by op) takes log(0) as "
                               "float64's lowest value, beyond the grid; where no value falls far below its line's "
                               "maximum, write it as m + log(cumsum(exp(x - m))) with m the line's maximum",
}


def _integers_only(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether the call reads tensors, integer and boolean ones only, and draws no random numbers: integer
    arithmetic (a position id's remainder, a mask's count) is exact on every device. (Its result is checked: an
    op that returns floating values from integers stays refused.)"""
    if torch.Tag.nondeterministic_seeded in func.tags:
        return False
    tensors = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)]
    return bool(tensors) and not any(t.is_floating_point() or t.is_complex() for t in tensors)


def classify(func: Any, args: tuple, kwargs: dict) -> OpSpec:
    """The registry entry for this call of `func` (an op outside the registry on integer and boolean tensors
    only: class 1, `OpSpec.integer`); UnsupportedOpError when there is none."""
    spec = _TABLE.get(func)
    if spec is None:
        if _integers_only(func, args, kwargs):
            return OpSpec(str(func), OpClass.EXACT, integer=True)
        raise UnsupportedOpError(str(func), _INSTEAD.get(func))
    if func is aten.pow.Tensor_Scalar and args[1] in (1, 2):  # x*x: one rounding
        return _POW_SQUARE
    if func in _INDEX_ADDS:
        if args[3] if len(args) > 3 else kwargs.get("accumulate", False):
            return _INDEX_ADDS[func]
        if _integer_indices(args[1]):  # (x[idx] = v: a position idx names twice is checked; masks name each once)
            return _INDEX_WRITES[func]
    return spec


def registry() -> dict[str, OpClass]:
    """Op name -> class, for documentation and `vtrain` introspection."""
    return dict(sorted((spec.name, spec.cls) for spec in _TABLE.values()))
