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
value off the grid, whose error the two-pass way then names.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from numba import njit

from vtrain import fused
from vtrain.fused import POW2, round_value

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
_BLOCK = 2048


def binary(func: Any, args: tuple, kwargs: dict, m: int, limit: float) -> torch.Tensor | None:
    """The rounded output of the binary op `func` on (args, kwargs), a fresh contiguous tensor, or None where
    this path does not apply (see the module docstring) or a value is off the grid."""
    code = _CODES.get(func)
    alpha = kwargs.get("alpha", 1)
    if code is None or not fused.ENABLED or len(args) != 2 or type(alpha) not in (int, float) or alpha != 1:
        return None
    x, y = args
    least = max(MIN_ELEMENTS, 1)  # (an empty output is torch's)
    if _numel(x) * _numel(y) < least:  # (no output is larger: small ops leave here, in ~1 us)
        return None
    shape = _shape(x, y)
    if shape is None or math.prod(shape) < least or (func in _IN_PLACE and not _writable(x, y, shape)):
        return None
    a, b = _operand(x, shape), _operand(y, shape)
    if a is None or b is None:
        return None
    merged = _merge(shape, a[1], b[1])
    if merged is None:
        return None
    dims, sa, sb = merged
    out = torch.empty(shape, dtype=torch.float64)
    if _binary(code, a[0], sa, b[0], sb, dims, out.numpy().reshape(-1), m, m == 23, limit, POW2):
        return None
    return out


def _writable(x: torch.Tensor, y: Any, shape: tuple[int, ...]) -> bool:
    """Whether an in-place op's output may be copied into x: x has the output's shape, is contiguous and
    shares no memory with y. Otherwise torch's own op raises the error that names it (a broadcast that would
    grow x, operands that overlap)."""
    return tuple(x.shape) == shape and x.is_contiguous() and not (
        isinstance(y, torch.Tensor) and y.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())


def _numel(v: Any) -> int:
    return v.numel() if isinstance(v, torch.Tensor) else 1


def _shape(x: Any, y: Any) -> tuple[int, ...] | None:
    """The broadcast output shape where one operand at least is a tensor of one dim or more (None otherwise,
    or where the shapes do not broadcast)."""
    shapes = [tuple(t.shape) for t in (x, y) if isinstance(t, torch.Tensor)]
    if not any(shapes):
        return None
    if len(shapes) == 1 or shapes[0] == shapes[1]:
        return shapes[0]
    # (by hand: torch.broadcast_shapes took 15 us, a quarter of this path's cost on a small op)
    (p, q), out = shapes, []
    for i in range(1, max(len(p), len(q)) + 1):
        d, e = p[-i] if i <= len(p) else 1, q[-i] if i <= len(q) else 1
        if d != e and 1 not in (d, e):
            return None  # torch's op raises the error that names the shapes
        out.append(e if d == 1 else d)
    return tuple(reversed(out))


def _operand(v: Any, shape: tuple[int, ...]) -> tuple[np.ndarray, list[int]] | None:
    """(the operand's memory as a flat float64 array, its element strides over `shape`), or None.

    A Python number or a 0-d floating tensor is one value (a float64 tensor of one dim or more decides the
    result's dtype, and float64 holds any float32 or Python float exactly). A tensor of one dim or more must
    be float64 and `_canonical`: contiguous, or a broadcast view of a contiguous tensor (a mean's gradient,
    expanded over the dims it averaged)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, torch.Tensor)):
        return None
    if not isinstance(v, torch.Tensor):  # (an int float64 cannot hold exactly: torch's own conversion decides)
        return (np.array([float(v)]), [0] * len(shape)) if isinstance(v, float) or abs(v) <= 2**53 else None
    if not v.is_cpu or v.is_neg():
        return None
    if v.dim() == 0:
        return (np.array([v.item()]), [0] * len(shape)) if v.is_floating_point() else None
    if v.dtype is not torch.float64 or not _canonical(v):
        return None
    span = 1 + sum((d - 1) * s for d, s in zip(v.shape, v.stride()))
    memory = torch.as_strided(v.detach(), (span,), (1,), v.storage_offset())
    return memory.numpy(), list(v.expand(shape).stride())


def _canonical(v: torch.Tensor) -> bool:
    """Whether v is a contiguous tensor with row-major strides on every dim, size-1 dims included, or such a
    tensor expanded (stride 0 on dims longer than 1). Torch lays its output out by its operands' strides,
    size-1 dims' too (a pooled channels_last tensor's (4, 1, 4, 4) gives a channels_last product): with
    these operands only is its output the row-major tensor this path writes."""
    expected = 1
    for d, s in zip(reversed(v.shape), reversed(v.stride())):
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


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _pairs_as(code: int, x: np.ndarray, y: np.ndarray, out: np.ndarray, m: int, cast32: bool, limit: float,
              pow2: np.ndarray) -> int:
    nbad = 0
    for i in range(out.size):
        r = round_value(_op(code, x[i], y[i]), m, cast32, pow2)
        nbad += not abs(r) <= limit
        out[i] = r
    return nbad


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _pairs(code: int, x: np.ndarray, y: np.ndarray, out: np.ndarray, m: int, cast32: bool, limit: float,
           pow2: np.ndarray) -> int:
    """out = rounded x op y elementwise (arrays of one length); the count of values off the grid."""
    if cast32:
        return _pairs_as(code, x, y, out, m, True, limit, pow2)
    return _pairs_as(code, x, y, out, m, False, limit, pow2)


@njit(cache=True, nogil=True, error_model="numpy")
def _binary(code: int, a: np.ndarray, sa: np.ndarray, b: np.ndarray, sb: np.ndarray, dims: np.ndarray,
            out: np.ndarray, m: int, cast32: bool, limit: float, pow2: np.ndarray) -> int:
    """out (flat, C order over dims) = the rounded a op b, a and b read through their strides over dims
    (innermost 0 or 1); the count of values off the grid."""
    n = dims[3]
    # A broadcast operand's value along a line, repeated in a buffer of up to _BLOCK values that stays in cache:
    # then one loop shape, which vectorises, serves every case.
    w = min(n, _BLOCK)
    xs, ys = np.empty(w), np.empty(w)
    nbad, o = 0, 0
    for i0 in range(dims[0]):
        for i1 in range(dims[1]):
            for i2 in range(dims[2]):
                pa = i0 * sa[0] + i1 * sa[1] + i2 * sa[2]
                pb = i0 * sb[0] + i1 * sb[1] + i2 * sb[2]
                if not sa[3]:
                    xs[:] = a[pa]
                if not sb[3]:
                    ys[:] = b[pb]
                for j in range(0, n, w):
                    k = min(w, n - j)
                    nbad += _pairs(code, a[pa + j:pa + j + k] if sa[3] else xs[:k],
                                   b[pb + j:pb + j + k] if sb[3] else ys[:k], out[o + j:o + j + k], m, cast32, limit,
                                   pow2)
                o += n
    return nbad
