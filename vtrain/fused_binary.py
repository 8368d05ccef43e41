"""Binary IEEE ops and their rounding in one pass: add, sub, mul and div of float64 CPU tensors, and the
backward of tanh and sigmoid (vtrain.ops decomposes each into three IEEE operations, computed here in turn
on each value: one pass where the dispatch path makes four; on GPT-2-tiny d_model 256's 1M-value GELU
gradient, in situ, those took 12 ms a call against torch's own kernel's 4, and 4.5 against 2.6 here alone).

Under rounded execution an IEEE op's output is computed by torch and then rounded in place (vtrain.fused):
two passes over a fresh tensor. On large outputs the second pass reads the tensor back from memory, since
it no longer sits in cache: on resnet-tiny at width 32 (1M-value activations) the rounding passes of these
four ops took 140 ms of a 1,000 ms step, at 1.6 ns a value against 0.4 in cache. Here each value is
rounded while it is in a register, right after the one IEEE operation that makes it, the same operation
torch's float64 kernel performs (numba compiles a + b, a - b, a * b, a / b to single IEEE instructions,
never contracted, and its numpy error model gives IEEE's inf and NaN on a division by zero). So the bits
are the dispatch path's (tests/numerics/test_num_fused_binary.py compares them on broadcasts, scalars,
ties, zeros, subnormals and overflows; tests/families/test_family_one_pass.py trains the model families
with and without this path to identical logs and states).

What it takes: float64 tensors on the CPU, each contiguous (row-major strides) or a broadcast view of one, and
broadcast against each other, or a 0-d tensor or Python number; alpha = 1. After merging the output's dims
that both operands step through alike, at most four remain, and each operand's innermost step is 1 or 0 (a
broadcast), the cases the loops below vectorise. Everything else (other dtypes and devices, strided views,
small outputs, which stay in cache anyway) returns None and goes the two-pass way, as does an output with a
value off the grid, whose error the two-pass way then names. (A negated view, which torch resolves before an op
reaches a dispatch mode, is read resolved where it is contiguous, else left to the two-pass way.)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numba import njit, types
from numba.extending import overload
from torch.autograd.graph import increment_version

from vtrain import fused, omp
from vtrain.fused import round_value
from vtrain.grid import GridOverflowError, check_finite_range

aten = torch.ops.aten

# Smaller outputs are still in cache when the two-pass way rounds them, and a one-value-per-line broadcast
# pays this path's loop per line: measured on fresh outputs, one pass took 1.2-1.5x the time of two at 32K
# and 64K values, 0.45-0.95x at 128K and 0.35-0.7x at 1M.
MIN_ELEMENTS = 1 << 17

ADD, SUB, MUL, DIV, TANH_BACKWARD, SIGMOID_BACKWARD = range(6)
_CODES = {aten.tanh_backward.default: TANH_BACKWARD, aten.sigmoid_backward.default: SIGMOID_BACKWARD,
          aten.add.Tensor: ADD, aten.add_.Tensor: ADD, aten.add.Scalar: ADD, aten.add_.Scalar: ADD,
          aten.sub.Tensor: SUB, aten.sub_.Tensor: SUB, aten.sub.Scalar: SUB, aten.sub_.Scalar: SUB,
          aten.mul.Tensor: MUL, aten.mul_.Tensor: MUL, aten.mul.Scalar: MUL, aten.mul_.Scalar: MUL,
          aten.div.Tensor: DIV, aten.div_.Tensor: DIV, aten.div.Scalar: DIV, aten.div_.Scalar: DIV}
_IN_PLACE = frozenset(op for op in _CODES if op._schema.name.endswith("_"))
_DIMS = 4


def binary(func: Any, args: tuple, kwargs: dict, m: int, limit: float, into_x: bool = False) -> torch.Tensor | None:
    """The rounded output of the binary op `func` on (args, kwargs), a fresh contiguous tensor, or None where
    this path does not apply (see the module docstring) or a value is off the grid.

    An in-place op's output, and with `into_x` an out-of-place op's where x allows it (x of the output's shape,
    contiguous, sharing no memory with y), is x itself, computed and rounded where it lies: no second tensor
    to write and copy. The caller of `into_x` must know that nothing else reads x; x's version counter then counts
    the write, as torch's in-place ops count theirs (caches key on it). There, since x's values are
    gone, a value off the grid raises GridOverflowError at once, naming its rounding (inf, NaN, or a value beyond
    the grid) rather than the value itself, as the two-pass way would."""
    code = _CODES.get(func)
    if code is None or not fused.ENABLED or len(args) != 2 or (kwargs and not _unit_alpha(kwargs)):
        return None
    x, y = args
    least = max(MIN_ELEMENTS, 1)  # (an empty output is torch's)
    if _numel(x) * _numel(y) < least:  # (no output is larger: small ops leave here, in ~1 us)
        return None
    plan = _plan(_key(x), _key(y))
    if plan is None or plan.size < least:
        return None
    in_place = (func in _IN_PLACE or into_x) and plan.in_place and _apart(x, y) and not x.is_neg()
    if func in _IN_PLACE and not in_place:
        return None
    a, b = _memory(x, plan.x_span), _memory(y, plan.y_span)
    if a is None or b is None:
        return None
    out = x if in_place else torch.empty(plan.shape, dtype=torch.float64)
    o = None if in_place else out.numpy().reshape(-1)
    parts = omp.parts(plan.size)
    if parts > 1:
        nbad = omp.kernels().binary(parts, code, a, plan.sa, b, plan.sb, plan.dims, o, m, m == 23, limit, plan.size)
    else:
        nbad = _binary(code, a, plan.sa, b, plan.sb, plan.dims, o, m, m == 23, limit, 0, plan.size)
    if nbad:
        if in_place:  # (x's values are gone: no second way to take; x holds the value's rounding, off the grid)
            check_finite_range(x, m + 9)
            raise GridOverflowError(f"{func} left the grid (bits={m + 9}) where it was written in place")
        return None
    if in_place and func not in _IN_PLACE:  # (torch counts its own in-place ops' writes; this one is ours)
        increment_version(x)
    return out


def _unit_alpha(kwargs: dict) -> bool:
    alpha = kwargs.get("alpha", 1)
    return type(alpha) in (int, float) and alpha == 1


def _numel(v: Any) -> int:
    return v.numel() if isinstance(v, torch.Tensor) else 1


def _apart(x: torch.Tensor, y: Any) -> bool:
    """Whether an in-place op's operand y shares no memory with x (else torch's own op raises the error that
    names it)."""
    return not (isinstance(y, torch.Tensor) and y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())


# An operand's memory as `_binary` reads it: one value (a number or a 0-d tensor), a contiguous tensor's
# values in order, or a broadcast view's span of its storage (a positive count).
_VALUE, _FLAT = -1, 0


def _memory(v: Any, span: int) -> np.ndarray | None:
    """The operand's memory as a flat float64 array (`_Plan`'s spans), or None (a negated view's span)."""
    if span == _VALUE:
        return np.array([v.item() if isinstance(v, torch.Tensor) else float(v)])
    if span == _FLAT:  # (`force` detaches, and resolves a negated view into a copy)
        return v.numpy(force=True).reshape(-1)
    if v.is_neg():
        return None
    return fused.memory(v, span)


def _key(v: Any) -> tuple:
    """What `_plan` reads of an operand: a tensor's layout, or of a number whether float64 holds it exactly
    (a float, or an int of at most 53 bits: for others torch's own conversion decides; a bool is no number
    here)."""
    if isinstance(v, torch.Tensor):
        return v.shape, v.stride(), v.dtype, v.is_cpu
    return (isinstance(v, float) or (isinstance(v, int) and not isinstance(v, bool) and abs(v) <= 2**53),)


@dataclass(frozen=True, slots=True)
class _Plan:
    shape: tuple[int, ...]  # the output's
    size: int
    dims: np.ndarray  # `_merge`'s
    sa: np.ndarray
    sb: np.ndarray
    x_span: int  # `_memory`'s
    y_span: int
    in_place: bool  # whether an in-place op may write the output into x (a contiguous x of the output's shape)


# An op's operands keep their layouts step after step, so each pair is worked out once. Worked out on every
# call (~20 Python calls more) the path took 44 against 9 us a call on a 64 x 64 op, and 131 against 70 us
# right after a pass over 8 MB, which pushes the interpreter's own memory out of the core's cache, as the
# large op before it does in a training step.
@functools.lru_cache(maxsize=1024)
def _plan(kx: tuple, ky: tuple) -> _Plan | None:
    """How `_binary` reads operands of these `_key`s, or None where this path does not take them."""
    shape = _shape([k[0] for k in (kx, ky) if len(k) == 4])
    if shape is None:
        return None
    layouts = [_layout(k, shape) for k in (kx, ky)]
    if None in layouts:
        return None
    (x_span, sa), (y_span, sb) = layouts
    merged = _merge(shape, sa, sb)
    if merged is None:
        return None
    return _Plan(shape, math.prod(shape), *merged, x_span, y_span,
                 in_place=x_span == _FLAT and tuple(kx[0]) == shape)


def _layout(key: tuple, shape: tuple[int, ...]) -> tuple[int, list[int]] | None:
    """(the operand's span for `_memory`, its element strides over `shape`), or None.

    A Python number or a 0-d floating tensor is one value (a float64 tensor of one dim or more decides the
    result's dtype, and float64 holds any float32 or Python float exactly). A tensor of one dim or more must
    be float64 and `_canonical`: contiguous, or a broadcast view of a contiguous tensor (a mean's gradient,
    expanded over the dims it averaged)."""
    if len(key) == 1:  # a number
        return (_VALUE, [0] * len(shape)) if key[0] else None
    size, stride, dtype, cpu = key
    if not cpu:
        return None
    if not size:
        return (_VALUE, [0] * len(shape)) if dtype.is_floating_point else None
    if dtype is not torch.float64 or not _canonical(size, stride):
        return None
    lead = len(shape) - len(size)
    strides = [0] * lead + [0 if d == 1 else s for d, s in zip(size, stride)]
    expanded = any(s == 0 and d > 1 for d, s in zip(size, stride))
    return (fused.span(size, stride) if expanded else _FLAT), strides


def _shape(shapes: list) -> tuple[int, ...] | None:
    """The tensors' broadcast shape where one at least has a dim (None otherwise, or where the shapes do not
    broadcast)."""
    shapes = [tuple(s) for s in shapes]
    if not any(shapes):
        return None
    if len(shapes) == 1 or shapes[0] == shapes[1]:
        return shapes[0]
    (p, q), out = shapes, []
    for i in range(1, max(len(p), len(q)) + 1):
        d, e = p[-i] if i <= len(p) else 1, q[-i] if i <= len(q) else 1
        if d != e and 1 not in (d, e):
            return None  # torch's op raises the error that names the shapes
        out.append(e if d == 1 else d)
    return tuple(reversed(out))


def _canonical(size: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Whether a tensor of this layout is contiguous with row-major strides on every dim, size-1 dims included,
    or such a tensor expanded (stride 0 on dims longer than 1). Torch lays its output out by its operands'
    strides, size-1 dims' too (a pooled channels_last tensor's (4, 1, 4, 4) gives a channels_last product):
    with these operands only is its output the row-major tensor this path writes."""
    expected = 1
    for d, s in zip(reversed(size), reversed(stride)):
        if s == 0 and d > 1:
            continue
        if s != expected:
            return False
        expected *= d
    return True


def _merge(shape: tuple[int, ...], sa: list[int], sb: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The output's dims with the ones both operands step through alike merged (as torch's TensorIterator
    does), padded to _DIMS, and each operand's strides over them; None where more than _DIMS remain or an
    innermost stride is not 0 or 1."""
    dims: list[list[int]] = []  # [size, stride a, stride b], outermost first
    for d, s, t in zip(shape, sa, sb):
        if d == 1:
            continue
        if dims and dims[-1][1] == s * d and dims[-1][2] == t * d:
            dims[-1] = [dims[-1][0] * d, s, t]
        else:
            dims.append([d, s, t])
    if len(dims) > _DIMS or (dims and (dims[-1][1] not in (0, 1) or dims[-1][2] not in (0, 1))):
        return None
    dims = [[1, 0, 0]] * (_DIMS - len(dims)) + dims
    return tuple(np.array([row[k] for row in dims], np.int64) for k in range(3))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _op(code: int, x: float, y: float) -> float:
    if code == ADD:
        return x + y
    if code == SUB:
        return x - y
    if code == MUL:
        return x * y
    if code == DIV:
        return x / y
    # (grad x, output y) of tanh and sigmoid: vtrain.ops' decompositions, operation by operation (each its
    # own IEEE operation, never contracted into an FMA: the decompositions are the spec's definition)
    if code == TANH_BACKWARD:
        return x * (1.0 - y * y)
    return x * ((1.0 - y) * y)


def _item(v: np.ndarray | float, i: int) -> float:
    """v[i] for an array, v itself for a number (`_item_at` gives compiled code each case's own)."""
    return v[i] if isinstance(v, np.ndarray) else v


@overload(_item)
def _item_at(v, i):  # noqa: ANN001, ANN202, ARG001 (numba's overload protocol: its lambdas' signature, unannotated)
    if isinstance(v, types.Array):
        return lambda v, i: v[i]
    return lambda v, i: v


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _pairs_as(code: int, x: np.ndarray | float, y: np.ndarray | float, out: np.ndarray, m: int, cast32: bool,
              limit: float) -> int:
    nbad = 0
    for i in range(out.size):
        r = round_value(_op(code, _item(x, i), _item(y, i)), m, cast32)
        nbad += not abs(r) <= limit
        out[i] = r
    return nbad


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _pairs(code: int, x: np.ndarray | float, y: np.ndarray | float, out: np.ndarray, m: int, cast32: bool,
           limit: float) -> int:
    """out = rounded x op y elementwise (x and y arrays of out's length, or one value for all; out may be x itself);
    the count of values off the grid."""
    if not cast32:  # (the other grids: float64 work at bits < 32, which no example runs; one loop, not measured)
        return _pairs_as(code, x, y, out, m, False, limit)
    # One loop per op, each with its op a constant. With the op read at run time, LLVM kept its tests, and
    # the backward ops' arithmetic, inside the vectorised loop, for every value: in situ the kernels took
    # 4-7 % longer (docs/benchmarks.md, session 33).
    if code == ADD:
        return _pairs_as(ADD, x, y, out, m, True, limit)
    if code == SUB:
        return _pairs_as(SUB, x, y, out, m, True, limit)
    if code == MUL:
        return _pairs_as(MUL, x, y, out, m, True, limit)
    if code == DIV:
        return _pairs_as(DIV, x, y, out, m, True, limit)
    if code == TANH_BACKWARD:
        return _pairs_as(TANH_BACKWARD, x, y, out, m, True, limit)
    return _pairs_as(SIGMOID_BACKWARD, x, y, out, m, True, limit)


@njit(cache=True, nogil=True, error_model="numpy")
def _binary(code: int, a: np.ndarray, sa: np.ndarray, b: np.ndarray, sb: np.ndarray, dims: np.ndarray,
            out: np.ndarray | None, m: int, cast32: bool, limit: float, lo: int, hi: int) -> int:
    """out[lo:hi] (flat, C order over dims) = the rounded a op b there, a and b read through their strides over
    dims (innermost 0 or 1); the count of values off the grid. Out None: a itself is the output (contiguous)."""
    # (numba compiles a None out and an array apart, each with its own loop below only: with both loops in one
    # function, every op's out-of-place kernel ran 3-11 % slower in situ)
    n = dims[3]
    nbad, o = 0, lo
    line, start = lo // n, lo % n  # [lo, hi) may start and end inside a line (vtrain.omp's parts)
    i0, i1, i2 = line // (dims[1] * dims[2]), line // dims[2] % dims[1], line % dims[2]
    while o < hi:
        stop = min(n, start + hi - o)
        pa = i0 * sa[0] + i1 * sa[1] + i2 * sa[2]
        pb = i0 * sb[0] + i1 * sb[1] + i2 * sb[2]
        first = o - start  # (the line's first value in out)
        # An operand broadcast along the line (innermost step 0) is its one value there, a number in the loop:
        # against its value repeated in a buffer (session 48's loop), 0.30 against 0.38 ms for a (32, 32, 32, 32)
        # by (1, 32, 1, 1) product (docs/benchmarks.md, session 49). Each case is a call of its own (numba types
        # each argument once).
        if out is None:
            # the line read and written as one array: given as two (one memory), the vectorised loop's run-time
            # check finds them overlapping and takes its scalar fallback (1.88 against 0.94 ms for a 1M-value sum;
            # 1.19 into a fresh tensor)
            part = a[first + start:first + stop]
            if sb[3]:
                nbad += _pairs(code, part, b[pb + start:pb + stop], part, m, cast32, limit)
            else:
                nbad += _pairs(code, part, b[pb], part, m, cast32, limit)
        else:
            dest = out[first + start:first + stop]
            if sa[3] and sb[3]:
                nbad += _pairs(code, a[pa + start:pa + stop], b[pb + start:pb + stop], dest, m, cast32, limit)
            elif sa[3]:
                nbad += _pairs(code, a[pa + start:pa + stop], b[pb], dest, m, cast32, limit)
            elif sb[3]:
                nbad += _pairs(code, a[pa], b[pb + start:pb + stop], dest, m, cast32, limit)
            else:
                nbad += _pairs(code, a[pa], b[pb], dest, m, cast32, limit)
        o += stop - start
        start = 0
        i2 += 1  # (the next line's indices by carries: a division a line cost ~10 % on 256-value lines)
        if i2 == dims[2]:
            i2, i1 = 0, i1 + 1
            if i1 == dims[1]:
                i1, i0 = 0, i0 + 1
    return nbad
