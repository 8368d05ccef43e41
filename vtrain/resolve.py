"""Exact resolution of ambiguous elements, and exactness certificates, per device-dependent op (issue 7).

Under the `exact` policy (DESIGN.md §1.3b) every device-dependent op's output must be RNE_grid(exact value).
The engine (vtrain.rounding) rounds the work-dtype value v and finds the few elements whose distance to a
grid rounding boundary is within the a-priori error bound E of vtrain.bounds. This module gives it two
things per op:

- a RESOLVER, `resolver_for(op)(args, kwargs, i, pos, bits)` -> RNE_grid(exact value) of output i at the
  flat (row-major) positions `pos`. It gathers only the terms those positions need, in one vectorised
  gather per call (chunked to bound memory), and hands them to the exact arithmetic in one batch: linear
  ops are exact dot products or sums of the grid inputs (plus an exact addend, or one exact rational
  division), by vtrain.exactdot's compiled kernel for CPU float matmuls and by vtrain.exactmath otherwise;
  elementwise functions are correctly rounded by exactmath's multi-precision fallback. Measured on 2
  shared cores, 4,000 positions of a 512x512 output: mm ~0.3 us per position at K = 64 and 2-3 us at
  K = 1024 (the numpy path of exactmath took ~9 and ~90 us).
- a CERTIFIER, `CERTIFIERS[op](args, kwargs, outs, e, i, pos)` (e: output i's error bound E of
  vtrain.bounds at the positions pos, gathered or taken from the full bound) -> a bool tensor of len(pos) (on pos's
  device) that is True where output i's computed value at flat position pos is provably the exact value
  whatever order and blocking any IEEE device summed in, or None (none certified). The engine skips the
  resolver there. Linear ops: every term is an integer multiple of a power of two q, and
  S = sum|terms| < 2^p q with p the work dtype's precision; then every partial sum, in any order and
  grouping, FMA or not, is an integer multiple of q of magnitude at most S, an integer below 2^p times q:
  representable, so no rounding ever happens. q is a product of lowest set bits (lsb) of the factors'
  smallest-lsb elements (per row, column, image or channel); it must not underflow (q >= the dtype's
  smallest subnormal). Only the rows, columns, images or channels of the asked positions are read, each
  once: the ambiguous positions are typically 1e-3 of an output, and lsb over whole weights cost more than
  the rest of an exact step. S comes from the engine's own bound: vtrain.bounds computes E >= gamma_k * S
  with k at least the op's term count K, so S <= E / gamma_K (a coupling to that module's formulas,
  guarded by a test against exact sums for every certified op). Divisions by a power of two (mean, avg
  pooling) are exact too when q / n does not underflow. Structural certificates: a single term is copied
  exactly (non-overlapping max pooling, embedding rows gathered once, the unweighted NLL loss and its
  backward). Quantised data (k/16 pixels) is certified almost everywhere; float64 sums of FP32-grid
  values often are. The engine asks through `certify`, which first reads a matmul's or convolution's own
  values: a certified sum is exact, so its lowest set bit bounds q from above (`_ruled_out`); and then
  samples of its lines or slices, whose lowest lsb bound q from above too (`_certify_lines`, which does both
  in one compiled pass for a matmul; `_sampled_out` for a convolution).

Ops are read through their aten schema (_bind), so positional and keyword calls look the same. Only
2-d pooling and 1-d, 2-d and 3-d convolutions (any groups, stride, padding, dilation; transposed ones read
through the convolution they transpose, 3-d ones by their gathered terms) are supported; anything else raises
ResolveError naming the op, as does an op with no resolver at all.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from numba import njit

from vtrain import exactdot, exactmath, fused
from vtrain.devices import transposed_size
from vtrain.errors import VtrainError
from vtrain.grid import check_bits, grid_max
from vtrain.prefilter import _inside, _unravel4, input_taps

aten = torch.ops.aten

Resolver = Callable[[tuple, dict, int, np.ndarray, int], np.ndarray]
# E at a certifier's positions: a float64 numpy array (the engine's) or a tensor
Bound = torch.Tensor | np.ndarray
Certifier = Callable[[tuple, dict, Sequence["torch.Tensor | None"], "Bound | None", int, "torch.Tensor"],
                     "torch.Tensor | None"]
# S's upper bound at the positions, the precision p and the smallest subnormal of the output's dtype (`_sum_bound`)
SumBound = tuple[np.ndarray, int, float]

_GATHER_ELEMENTS = 1 << 22  # memory cap (elements) of one gathered chunk of terms
_WINDOWS_MAX = 1 << 24  # memory cap (elements) of a convolution's im2col copy (beyond it: gathered in chunks)


class ResolveError(VtrainError):
    """An op or an op configuration the exact policy cannot resolve (or a result with no exact value)."""


# -- plumbing ---------------------------------------------------------------------------------------


def _bind(op: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The op's arguments by schema name, defaults filled in (positional and keyword calls alike)."""
    bound: dict[str, Any] = {}
    for k, (name, has_default, default) in enumerate(_schema(op)):
        if k < len(args):
            bound[name] = args[k]
        elif name in kwargs:
            bound[name] = kwargs[name]
        elif has_default:
            bound[name] = default
        else:
            raise ResolveError(f"{op}: argument {name!r} missing in the call being resolved")
    return bound


@functools.lru_cache(maxsize=None)
def _schema(op: Any) -> tuple[tuple[str, bool, Any], ...]:
    """(name, has a default, the default) of each argument (reading `_schema` builds these objects anew
    each time: 30 us a call, more than the rest of a small certificate)."""
    return tuple((a.name, a.has_default_value(), a.default_value if a.has_default_value() else None)
                 for a in op._schema.arguments)


def _t(pos: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(pos, dtype=np.int64))


def _np(t: torch.Tensor) -> np.ndarray:
    """float64 numpy copy of a (small, gathered) tensor; float32 converts exactly."""
    return t.detach().to("cpu", torch.float64).numpy()


def _unravel(pos: np.ndarray, shape: Sequence[int]) -> tuple[torch.Tensor, ...]:
    return tuple(_t(ix) for ix in np.unravel_index(pos, tuple(shape)))


def _at(t: torch.Tensor, pos: np.ndarray) -> np.ndarray:
    """Elements of t at flat positions, without copying the whole tensor (t may be a broadcast view)."""
    if not t.dim():
        return _np(t.reshape(1).expand(len(pos)))
    if t.is_cpu and t.is_contiguous() and t.dtype in (torch.float64, torch.float32) and not t.is_neg():
        # (numpy's gather: torch's indexing costs ~20 us a call on a few values)
        return t.detach().reshape(-1).numpy()[pos].astype(np.float64, copy=False)
    return _np(t[_unravel(pos, t.shape)])


def _chunked(pos: np.ndarray, width: int, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """fn over chunks of pos so that one chunk gathers at most _GATHER_ELEMENTS terms."""
    step = max(1, _GATHER_ELEMENTS // max(width, 1))
    if len(pos) <= step:
        return fn(pos)
    return np.concatenate([fn(pos[s:s + step]) for s in range(0, len(pos), step)])


def _pair(v: Any) -> tuple[int, int]:
    v = [v] if isinstance(v, int) else list(v)
    return (int(v[0]), int(v[-1])) if v else (0, 0)


def _masked(t: torch.Tensor, index: tuple[torch.Tensor, ...], valid: torch.Tensor) -> torch.Tensor:
    """t[index] with out-of-range (invalid) index entries reading an exact zero (on the CPU, like the index)."""
    safe = tuple(ix.clamp(0, size - 1) if ix.dtype == torch.int64 else ix for ix, size in zip(index, t.shape))
    vals = t[safe].cpu()
    return torch.where(valid, vals, torch.zeros((), dtype=vals.dtype))


def _rounded_dots(a: torch.Tensor, b: torch.Tensor, bits: int, extra: torch.Tensor | None = None) -> np.ndarray:
    p, k = a.shape[0], math.prod(a.shape[1:])
    a2, b2 = _np(a.reshape(p, k)), _np(b.reshape(p, k))
    if a2.shape[1] == 0:  # an empty dot product is an exact zero (plus the addend)
        a2, b2 = np.zeros((p, 1)), np.zeros((p, 1))
    # The terms are host float64 copies by now, whatever the tensors' device: the compiled kernel takes them.
    dots = exactdot.rounded_dots if exactdot.ENABLED else exactmath.rounded_dots
    return dots(a2, b2, bits, extra=None if extra is None else _np(extra))


def _views(*ts: torch.Tensor) -> tuple[np.ndarray, ...] | None:
    """Numpy views (shared memory, the tensors' strides) of CPU float32/float64 tensors for vtrain.exactdot,
    or None when the kernel cannot read one of them in place (other devices and dtypes, lazy negation): the
    torch path then."""
    for t in ts:
        if not (exactdot.ENABLED and t.device.type == "cpu" and t.dtype in (torch.float64, torch.float32)) \
                or t.is_neg() or t.is_conj():
            return None
    return tuple(t.detach().numpy() for t in ts)


def _dots_at(a: np.ndarray, b: np.ndarray, shape: tuple[int, int, int], ps: np.ndarray, bits: int,
             extra: np.ndarray | None = None) -> np.ndarray:
    """Compiled RNE_grid dot products of a (N, R, K) and b (N, K, C) at flat positions of the (N, R, C) output."""
    n, r, c = np.unravel_index(ps, shape)
    return exactdot.rounded_dots_at(a, b, n, r, c, bits, extra)


def _rounded_sums(x: torch.Tensor, bits: int, divisor: Any = None) -> np.ndarray:
    x2 = _np(x.reshape(x.shape[0], math.prod(x.shape[1:])))
    if x2.shape[1] == 0:
        x2 = np.zeros((x2.shape[0], 1))
    return exactmath.rounded_sums(x2, bits, divisor)


# -- matmul family ----------------------------------------------------------------------------------


def _mm(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
    a, b = args[0], args[1]
    views = _views(a, b)
    if views is not None:
        av, bv = views
        shape = (1, a.shape[0], b.shape[1])
        return _chunked(pos, a.shape[1], lambda ps: _dots_at(av[None], bv[None], shape, ps, bits))

    def part(ps: np.ndarray) -> np.ndarray:
        r, c = _unravel(ps, (a.shape[0], b.shape[1]))
        return _rounded_dots(a[r], b[:, c].T, bits)

    return _chunked(pos, a.shape[1], part)


def _bmm(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
    a, b = args[0], args[1]
    views = _views(a, b)
    if views is not None:
        av, bv = views
        shape = (a.shape[0], a.shape[1], b.shape[2])
        return _chunked(pos, a.shape[2], lambda ps: _dots_at(av, bv, shape, ps, bits))

    def part(ps: np.ndarray) -> np.ndarray:
        n, r, c = _unravel(ps, (a.shape[0], a.shape[1], b.shape[2]))
        return _rounded_dots(a[n, r], b[n, :, c], bits)  # (P, K) each

    return _chunked(pos, a.shape[2], part)


def _dot(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
    views = _views(args[0], args[1])
    if views is not None:  # (1, 1, K) @ (1, K, 1)
        av, bv = views
        first = np.zeros(1, np.int64)
        return np.full(len(pos), _dots_at(av[None, None], bv[None, :, None], (1, 1, 1), first, bits)[0])
    return np.full(len(pos), _rounded_dots(args[0][None], args[1][None], bits)[0])


def _mv(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
    a, x = args[0], args[1]
    views = _views(a, x)
    if views is not None:  # (1, R, K) @ (1, K, 1)
        av, xv = views
        shape = (1, a.shape[0], 1)
        return _chunked(pos, a.shape[1], lambda ps: _dots_at(av[None], xv[None, :, None], shape, ps, bits))

    def part(ps: np.ndarray) -> np.ndarray:
        r = _t(ps)
        return _rounded_dots(a[r], x.expand(len(ps), -1), bits)

    return _chunked(pos, a.shape[1], part)


def _addmm(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
    kw = _bind(aten.addmm.default, args, kwargs)
    bias, a, b, beta, alpha = kw["self"], kw["mat1"], kw["mat2"], kw["beta"], kw["alpha"]
    shape = (a.shape[0], b.shape[1])
    views = _views(a, b) if alpha == 1 and beta == 1 else None  # then the bias is an exact addend
    if views is not None:
        av, bv = views
        return _chunked(pos, a.shape[1], lambda ps: _dots_at(av[None], bv[None], (1, *shape), ps, bits,
                                                             extra=_at(bias.expand(shape), ps)))

    def part(ps: np.ndarray) -> np.ndarray:
        r, c = _unravel(ps, shape)
        ra, cb = a[r], b[:, c].T
        if alpha == 1 and beta == 1:  # the common case (nn.Linear): the bias is an exact addend
            return _rounded_dots(ra, cb, bits, extra=bias.expand(shape)[r, c])
        # beta*bias and alpha*sum are not exact in floating point: combine as rationals. beta = 0
        # ignores the bias altogether (torch's rule, which also ignores NaN there).
        sums = exactmath.exact_dots(_np(ra), _np(cb))
        addend = [Fraction(0)] * len(ps) if beta == 0 else \
            [Fraction(beta) * Fraction(float(v)) for v in _np(bias.expand(shape)[r, c])]
        return exactmath.round_fractions([Fraction(alpha) * s + e for s, e in zip(sums, addend)], bits)

    return _chunked(pos, a.shape[1], part)


# -- convolutions -----------------------------------------------------------------------------------


def _conv_geometry(op: Any, kw: dict,
                   volumes: bool = False) -> tuple[torch.Tensor, torch.Tensor, tuple, tuple, tuple, int]:
    """(input as 4-d, weight as 4-d, stride, padding, dilation, groups); 1-d convs get height 1. 3-d ones (5-d
    tensors) as they are where `volumes` (the gathered terms read any number of dims; the compiled kernels, the
    matmul path and the certificates 2 only)."""
    x, w = kw["input"], kw["weight"]
    if kw["transposed"]:  # (the resolver reads one through the convolution it transposes: `_transposed_terms`)
        raise ResolveError(f"{op}: a transposed convolution's geometry is the one it transposes")
    stride, padding, dilation = list(kw["stride"]), list(kw["padding"]), list(kw["dilation"])
    if x.dim() == 3 and w.dim() == 3:
        x, w = x.unsqueeze(2), w.unsqueeze(2)
        stride, padding, dilation = [1] + stride[-1:], [0] + padding[-1:], [1] + dilation[-1:]
    if volumes and x.dim() == 5 and w.dim() == 5:
        return x, w, tuple(stride), tuple(padding), tuple(dilation), int(kw["groups"])
    if x.dim() != 4 or w.dim() != 4:
        raise ResolveError(f"{op}: exact resolution supports batched 1-d, 2-d and 3-d convolutions only, got input "
                           f"{tuple(kw['input'].shape)} and weight {tuple(kw['weight'].shape)}")
    return x, w, _pair(stride), _pair(padding), _pair(dilation), int(kw["groups"])


def _out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


Terms = Callable[[np.ndarray], tuple]  # flat positions -> (a, b, extra): their sums as gathered (P, ...) tensors


def _along(values: torch.Tensor, d: int, nd: int) -> torch.Tensor:
    """(P, K) values as (P, 1, 1.., K at spatial dim d of nd, ..1): one index of a gather over P positions, a
    channel (or image) dim and nd spatial dims."""
    shape = [values.shape[0]] + [1] * (1 + nd)
    shape[2 + d] = values.shape[1]
    return values.reshape(shape)


def _convolution_terms(args: tuple, kwargs: dict, i: int, volumes: bool = False) -> tuple[int, Terms]:
    """(terms per position, positions -> (a, b, extra)) of the convolution's output i = 0: each position's
    value is sum(a[p] * b[p]) + extra[p] (extra None: no addend). The resolver rounds these dot products
    exactly; vtrain.bounds' gathered E sums their absolute values. (`volumes`: 3-d convolutions too.)"""
    kw = _bind(aten.convolution.default, args, kwargs)
    x, w, stride, padding, dilation, groups = _conv_geometry(aten.convolution.default, kw, volumes)
    bias = kw["bias"]
    n_img, spatial = x.shape[0], x.shape[2:]
    c_out, c_g, kernel = w.shape[0], w.shape[1], w.shape[2:]
    nd, co_g = len(spatial), c_out // groups
    out = [_out_size(spatial[d], kernel[d], stride[d], padding[d], dilation[d]) for d in range(nd)]

    def part(ps: np.ndarray) -> tuple:
        n, co, *o = _unravel(ps, (n_img, c_out, *out))
        ci = (co // co_g)[:, None] * c_g + torch.arange(c_g)  # (P, Cg): the input channels of co's group
        taps = [_along(o[d][:, None] * stride[d] - padding[d] + torch.arange(kernel[d]) * dilation[d], d, nd)
                for d in range(nd)]  # (the window's input coordinates along each dim)
        valid = functools.reduce(torch.logical_and, [(t >= 0) & (t < spatial[d]) for d, t in enumerate(taps)])
        # (P, Cg, *kernel), the padding reads zeros
        patch = _masked(x, (n.reshape(-1, *[1] * (nd + 1)), ci.reshape(-1, c_g, *[1] * nd), *taps), valid)
        return patch, w[co], None if bias is None else bias[co]

    return c_g * math.prod(kernel), part


def _rounded(part: Terms, bits: int) -> Callable[[np.ndarray], np.ndarray]:
    """positions -> the grid rounding of their terms' exact sums (dot products; sums of a where b is None)."""
    def rounded(ps: np.ndarray) -> np.ndarray:
        a, b, extra = part(ps)
        return _rounded_sums(a, bits) if b is None else _rounded_dots(a, b, bits, extra=extra)

    return rounded


def _backward_operands(args: tuple, kwargs: dict, volumes: bool = False) -> tuple:
    """convolution_backward's (grad_output, input, weight, stride, padding, dilation, groups), all 4-d (or, with
    `volumes`, 5-d for a 3-d convolution)."""
    op = aten.convolution_backward.default
    kw = _bind(op, args, kwargs)
    g = kw["grad_output"]
    x, w, stride, padding, dilation, groups = _conv_geometry(op, kw, volumes)
    return (g.unsqueeze(2) if g.dim() == 3 else g), x, w, stride, padding, dilation, groups


def _channel_sums(g: torch.Tensor) -> tuple[int, Terms]:
    """grad_bias's terms: channel co's gradient over images and output positions."""
    return g[:, 0].numel(), lambda ps: (g.transpose(0, 1)[_t(ps)], None, None)


def _convolution_backward_terms(args: tuple, kwargs: dict, i: int, volumes: bool = False) -> tuple[int, Terms]:
    """`_convolution_terms` for output i of convolution_backward (grad_bias: b None, a sum of a)."""
    g, x, w, stride, padding, dilation, groups = _backward_operands(args, kwargs, volumes)
    n_img, c_in, spatial = x.shape[0], x.shape[1], x.shape[2:]
    c_out, c_g, kernel = w.shape[0], w.shape[1], w.shape[2:]
    nd, co_g, out = len(spatial), c_out // groups, g.shape[2:]

    if i == 0:  # grad_input[n, ci, *y] = sum over (co in ci's group, taps) of grad * weight
        def part(ps: np.ndarray) -> tuple:
            n, ci, *y = _unravel(ps, tuple(x.shape))
            co = (ci // c_g)[:, None] * co_g + torch.arange(co_g)  # (P, COg)
            reach = [y[d][:, None] + padding[d] - torch.arange(kernel[d]) * dilation[d] for d in range(nd)]
            # (the output position a tap reaches y from: o * stride when it lands on one)
            valid = functools.reduce(torch.logical_and, [_along((t >= 0) & (t % stride[d] == 0) &
                                                                (t // stride[d] < out[d]), d, nd)
                                                         for d, t in enumerate(reach)])
            lines = co.reshape(-1, co_g, *[1] * nd)
            terms = _masked(g, (n.reshape(-1, *[1] * (nd + 1)), lines,
                                *(_along(t // stride[d], d, nd) for d, t in enumerate(reach))), valid)
            wts = w[(lines, (ci % c_g).reshape(-1, 1, *[1] * nd),
                     *(torch.arange(kernel[d]).reshape([1, 1] + [kernel[d] if e == d else 1 for e in range(nd)])
                       for d in range(nd)))]  # (P, COg, *kernel)
            return terms, wts, None

        return co_g * math.prod(kernel), part
    if i == 1:  # grad_weight[co, cl, *k] = sum over (n, output positions) of grad * input tap
        views = _views(g, x) if nd == 2 else None

        def part(ps: np.ndarray) -> tuple:
            if views is not None:  # (compiled: torch's indexing took 20 of 28 ms on 45 positions of 32,768 terms)
                ga, xb = np.empty((ps.size, g[:, 0].numel())), np.empty((ps.size, g[:, 0].numel()))
                _weight_taps(*views, ps.astype(np.int64), *_tap_geometry(w, stride, padding, dilation, groups),
                             ga, xb)
                return torch.from_numpy(ga), torch.from_numpy(xb), None
            co, cl, *k = _unravel(ps, tuple(w.shape))
            ci = (co // co_g) * c_g + cl
            taps = [_along(torch.arange(out[d]) * stride[d] - padding[d] + k[d][:, None] * dilation[d], d, nd)
                    for d in range(nd)]  # (P, 1, ..O_d..)
            valid = functools.reduce(torch.logical_and, [(t >= 0) & (t < spatial[d]) for d, t in enumerate(taps)])
            taps = _masked(x, (torch.arange(n_img).reshape(1, -1, *[1] * nd), ci.reshape(-1, 1, *[1] * nd), *taps),
                           valid)  # (P, N, *out)
            return g.transpose(0, 1)[co], taps, None

        return g[:, 0].numel(), part
    if i == 2:
        return _channel_sums(g)
    raise ResolveError(f"{aten.convolution_backward.default}: output {i} does not exist (grad_input, grad_weight, "
                       "grad_bias)")


@njit(cache=True, nogil=True, inline="always")
def _image_taps(g: np.ndarray, x: np.ndarray, n: int, co: int, ci: int, a: int, b: int, geometry: np.ndarray,
                ga: np.ndarray, xb: np.ndarray, k: int) -> int:
    """ga[k:], xb[k:]: image n's OH OW terms of the grad_weight position of output channel co, input channel ci
    and tap (a, b), g[n, co, oy, oz] and its input tap x[n, ci, y, z], in float64 (exact), an exact zero where
    the window reaches into the padding; k past them."""
    s0, s1, p0, p1, d0, d1 = geometry
    for oy in range(g.shape[2]):
        y = oy * s0 - p0 + a * d0
        inside = 0 <= y < x.shape[2]
        for oz in range(g.shape[3]):
            z = oz * s1 - p1 + b * d1
            ga[k] = g[n, co, oy, oz]
            xb[k] = x[n, ci, y, z] if inside and 0 <= z < x.shape[3] else 0.0
            k += 1
    return k


@njit(cache=True, nogil=True, inline="always")
def _image_products(g: np.ndarray, x: np.ndarray, n: int, co: int, ci: int, a: int, b: int, geometry: np.ndarray,
                    terms: np.ndarray) -> int:
    """terms[:k] (k returned): image n's products g[n, co, oy, oz] x[n, ci, y, z] of `_image_taps`' grad_weight
    position, those whose tap lies inside the image (the padding's are exact zeros, which an exact sum needs
    not), for planes that exactdot.known_short_plane accepts (each product exact in float64). Made as the
    factors are read, in runs along a row; unsigned indices, which numba does not wrap around, let LLVM
    vectorise the run. On resnet-tiny width 32's 32 x 32 images, `_image_taps`, its short tests and the
    products took 62 of a position's 92 us; this takes 17, and testing the planes 11."""
    s0, s1, p0, p1, d0, d1 = geometry
    y0, y1 = _inside(g.shape[2], s0, a * d0 - p0, x.shape[2])
    z0, z1 = _inside(g.shape[3], s1, b * d1 - p1, x.shape[3])
    k = 0
    for oy in range(y0, y1):
        y = oy * s0 + a * d0 - p0
        for j in range(z1 - z0):  # z = (z0 + j) s1 + b d1 - p1 >= 0
            terms[np.uint64(k + j)] = np.float64(g[n, co, oy, np.uint64(z0 + j)]) * np.float64(
                x[n, ci, y, np.uint64((z0 + j) * s1 + b * d1 - p1)])
        k += z1 - z0
    return k


@njit(cache=True, nogil=True)
def _weight_taps(g: np.ndarray, x: np.ndarray, pos: np.ndarray, geometry: np.ndarray, shape: np.ndarray, co_g: int,
                 ga: np.ndarray, xb: np.ndarray) -> None:
    """ga[t], xb[t]: the factors of the N OH OW terms of grad_weight position pos[t] (shape: Co, Cg, KH, KW),
    image by image (`_image_taps`)."""
    c_g, kh, kw = shape[1], shape[2], shape[3]
    for t in range(pos.size):
        co, cl, a, b = _unravel4(pos[t], c_g, kh, kw)
        k = 0
        for n in range(g.shape[0]):
            k = _image_taps(g, x, n, co, (co // co_g) * c_g + cl, a, b, geometry, ga[t], xb[t], k)


def _tap_geometry(w: torch.Tensor, stride: tuple, padding: tuple, dilation: tuple, groups: int) -> tuple:
    """The gathering kernels' geometry arguments: (s0, s1, p0, p1, d0, d1), the weight's shape, Co per group."""
    return np.array([*stride, *padding, *dilation], np.int64), np.array(w.shape, np.int64), w.shape[0] // groups


@njit(cache=True, nogil=True)
def _weight_dots(g: np.ndarray, x: np.ndarray, pos: np.ndarray, geometry: np.ndarray, shape: np.ndarray, co_g: int,
                 m: int, gmax: float, out: np.ndarray, flag: np.ndarray, chunk: int) -> None:
    """out[t] = RNE_grid of grad_weight position pos[t]'s exact sum; flag[t] where exactdot's kernel cannot
    (its reasons). Image by image: each position's terms in the image (`_image_taps`) are added exactly to its
    own partials (exactdot.accumulate) while the image's planes stay in L2 for the positions that share a
    channel, and the partials are rounded at the end (exactdot.round_partials): the same exact sum, so the same
    value. Position by position, each position read its images' planes from memory again: on three calls
    captured at resnet-tiny width 32 (51-58 positions of 32,768 terms), 93-99 against 79-82 us a position
    (docs/benchmarks.md, session 29). Positions go `chunk` at a time (their partials take 1 KB each).
    An image's products are made as they are read (`_image_products`) where both its planes hold short values
    (exactdot.known_short_plane), else gathered and split (`_image_taps`, exactdot.accumulate's TwoProduct)."""
    c_g, kh, kw = shape[1], shape[2], shape[3]
    size = g.shape[2] * g.shape[3]
    ga, xb = np.empty(size), np.empty(size)
    terms, q1, q2, box, _, tmp = exactdot.workspace(size)
    parts, count = exactdot.partials(min(pos.size, chunk)), np.empty(min(pos.size, chunk), np.int64)
    g_short, x_short = np.full(g.shape[:2], -1, np.int8), np.full(x.shape[:2], -1, np.int8)
    for c0 in range(0, pos.size, chunk):
        some = pos[c0:c0 + chunk]
        count[:] = 0  # -1: flagged
        for n in range(g.shape[0]):
            for t in range(some.size):
                if count[t] < 0:
                    continue
                co, cl, a, b = _unravel4(some[t], c_g, kh, kw)
                ci = (co // co_g) * c_g + cl
                if exactdot.known_short_plane(g, n, co, g_short) and \
                        exactdot.known_short_plane(x, n, ci, x_short):
                    k = _image_products(g, x, n, co, ci, a, b, geometry, terms)
                    count[t] = exactdot.distill_into(terms, k, q1, q2, box, parts[t], count[t])
                else:  # products that may be inexact: TwoProduct's, on the factors
                    _image_taps(g, x, n, co, ci, a, b, geometry, ga, xb, 0)
                    count[t] = exactdot.accumulate(ga, xb, False, terms, q1, q2, box, parts[t], count[t])
        for t in range(some.size):
            if count[t] < 0:
                flag[c0 + t] = True
            else:
                out[c0 + t], done = exactdot.round_partials(parts[t], count[t], m, gmax, tmp)
                flag[c0 + t] = not done


_WEIGHT_CHUNK = 1024  # `_weight_dots`' positions at a time


@njit(cache=True, nogil=True)
def _input_dots(g: np.ndarray, w: np.ndarray, pos: np.ndarray, geometry: np.ndarray, shape: np.ndarray, groups: int,
                m: int, gmax: float, out: np.ndarray, flag: np.ndarray) -> None:
    """`_weight_dots` for grad_input positions pos (shape: N, Cin, H, W): the output gradients that reach each
    pixel times their weights (the taps found as the pre-filter's E finds them; those that reach it from
    nowhere, padding and stride gaps, left out: an exact sum needs no zeros), gathered into one pair of
    buffers. (Torch's indexing gathered every tap of every position through index tensors, ~1 ms a call.)"""
    c_out, c_g, kh, kw = w.shape
    co_g = c_out // groups
    ga, wb = np.empty(co_g * kh * kw), np.empty(co_g * kh * kw)
    tap_a, tap_y, tap_b, tap_z = (np.empty(kh, np.int64), np.empty(kh, np.int64), np.empty(kw, np.int64),
                                  np.empty(kw, np.int64))
    work = exactdot.workspace(ga.size)
    for t in range(pos.size):
        n, ci, y, z = _unravel4(pos[t], shape[1], shape[2], shape[3])
        na, nb = input_taps(y, z, geometry, g.shape[2], g.shape[3], tap_a, tap_y, tap_b, tap_z)
        k, cl = 0, ci % c_g
        for co in range((ci // c_g) * co_g, (ci // c_g + 1) * co_g):
            for i in range(na):
                for j in range(nb):
                    ga[k] = g[n, co, tap_y[i], tap_z[j]]
                    wb[k] = w[co, cl, tap_a[i], tap_b[j]]
                    k += 1
        exactdot.dot_at(ga[:k], wb[:k], 0.0, m, gmax, work, out, flag, t)


@njit(cache=True, nogil=True)
def _forward_dots(x: np.ndarray, w: np.ndarray, bias: np.ndarray, pos: np.ndarray, geometry: np.ndarray, groups: int,
                  m: int, gmax: float, out: np.ndarray, flag: np.ndarray) -> None:
    """`_input_dots` for convolution outputs pos ((N, Co, OH, OW); geometry: stride, padding, dilation, OH,
    OW): a window's taps inside the image times their weights (found as the pre-filter's E finds them), the
    bias (empty: none) the addend."""
    s0, s1, p0, p1, d0, d1, oh, ow = geometry
    c_out, c_g, kh, kw = w.shape
    co_g = c_out // groups
    xa, wb = np.empty(c_g * kh * kw), np.empty(c_g * kh * kw)
    work = exactdot.workspace(xa.size)
    for t in range(pos.size):
        n, co, oy, oz = _unravel4(pos[t], c_out, oh, ow)
        y0, z0 = oy * s0 - p0, oz * s1 - p1
        a0, a1 = _inside(kh, d0, y0, x.shape[2])
        b0, b1 = _inside(kw, d1, z0, x.shape[3])
        k, c0 = 0, (co // co_g) * c_g
        for cl in range(c_g):
            for a in range(a0, a1):
                for b in range(b0, b1):
                    xa[k] = x[n, c0 + cl, y0 + a * d0, z0 + b * d1]
                    wb[k] = w[co, cl, a, b]
                    k += 1
        exactdot.dot_at(xa[:k], wb[:k], np.float64(bias[co]) if bias.size else 0.0, m, gmax, work, out, flag, t)


def _convolution_dots(op: Any, args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int,
                      reference: Callable[[np.ndarray], np.ndarray]) -> np.ndarray | None:
    """Output i of a convolution (0) or of its backward (grad_input 0, grad_weight 1) at flat positions `pos`,
    correctly rounded by `_forward_dots`, `_input_dots` or `_weight_dots`, each position's terms summed as they
    are gathered; the positions they flag (and all of them where the kernels cannot read the operands in place)
    by `reference` (positions -> their values: the gathered terms' exact dots). None for grad_bias."""
    forward = op is aten.convolution.default
    if not forward and i > 1:
        return None
    if forward:
        kw = _bind(op, args, kwargs)
        x, w, stride, padding, dilation, groups = _conv_geometry(op, kw)
        bias = kw["bias"]
        views = _views(x, w) if bias is None else _views(x, w, bias)
    else:
        g, x, w, stride, padding, dilation, groups = _backward_operands(args, kwargs)
        views = _views(g, w if i == 0 else x)
    if views is None:
        return reference(pos)
    m, gmax, ps = check_bits(bits), grid_max(bits), pos.astype(np.int64)
    out, flag = np.empty(pos.size), np.zeros(pos.size, dtype=np.bool_)
    geometry, shape, co_g = _tap_geometry(w, stride, padding, dilation, groups)
    if forward:
        sizes = [_out_size(x.shape[d], w.shape[d], stride[d - 2], padding[d - 2], dilation[d - 2]) for d in (2, 3)]
        _forward_dots(views[0], views[1], views[2].reshape(-1) if bias is not None else _NO_BIAS, ps,
                      np.array([*geometry, *sizes], np.int64), groups, m, gmax, out, flag)
    elif i == 0:
        _input_dots(*views, ps, geometry, np.array(x.shape, np.int64), groups, m, gmax, out, flag)
    else:
        _weight_dots(*views, ps, geometry, shape, co_g, m, gmax, out, flag, _WEIGHT_CHUNK)
    f = np.flatnonzero(flag)
    if f.size:
        out[f] = reference(pos[f])
    return out


_NO_BIAS = np.zeros(0)


# op -> its outputs' terms (the gathering the resolver falls back to, and the sums of |terms| bounds take)
_CONVOLUTION_TERMS = {aten.convolution.default: _convolution_terms,
                      aten.convolution_backward.default: _convolution_backward_terms}


def _transposed_terms(op: Any, args: tuple, kwargs: dict, i: int) -> tuple[int, Terms] | None:
    """`_convolution_terms` for output i of a transposed convolution (op: forward or backward), None for others.

    A transposed convolution is the input gradient of the convolution it transposes (the same weight and
    geometry; its weight's (C_in, C_out / groups) are that convolution's (O, C / groups)), and its backward
    that convolution's forward (grad_input) and weight gradient with the roles of input and gradient swapped:
    each position's terms are read from those, at the position's coordinates in their outputs. Output padding
    can give the convolution a window more along a dim than the transposed one has input values for, so
    positions are re-laid in that output's shape."""
    kw = _bind(op, args, kwargs)
    if not kw["transposed"]:
        return None
    x, w, groups = kw["input"], kw["weight"], int(kw["groups"])
    geometry = (list(kw["stride"]), list(kw["padding"]), list(kw["dilation"]))
    if op is aten.convolution.default:  # out = grad_input of a convolution whose gradient is x, + bias
        out_shape = (x.shape[0], w.shape[1] * groups, *transposed_size(x, w, *geometry, kw["output_padding"]))
        regular = (x, x.new_zeros(()).expand(out_shape), w, None, *geometry, False, [0] * (x.dim() - 2), groups,
                   [True, False, False])
        width, part = _convolution_backward_terms(regular, {}, 0, volumes=True)
        bias = kw["bias"]
        if bias is None:
            return width, part

        def with_bias(ps: np.ndarray) -> tuple:
            a, b, _ = part(ps)
            return a, b, bias[_unravel(ps, out_shape)[1]]
        return width, with_bias
    g = kw["grad_output"]
    if i == 0:  # grad_input: the forward convolution of g, over x's windows
        regular = (g, w, None, *geometry, False, [0] * (x.dim() - 2), groups)
        width, part = _convolution_terms(regular, {}, 0, volumes=True)
        windows = [_out_size(g.shape[d], w.shape[d], *(geo[d - 2] for geo in geometry)) for d in range(2, g.dim())]
        return width, lambda ps: part(np.ravel_multi_index(np.unravel_index(ps, tuple(x.shape)),
                                                           (*x.shape[:2], *windows)))
    if i == 1:  # grad_weight: that of a convolution of g whose gradient is x
        regular = (x, g, w, None, *geometry, False, [0] * (x.dim() - 2), groups, [False, True, False])
        return _convolution_backward_terms(regular, {}, 1, volumes=True)
    if i == 2:
        return _channel_sums(g)
    raise ResolveError(f"{op}: output {i} does not exist (grad_input, grad_weight, grad_bias)")


def _convolution(op: Any) -> Resolver:
    """The resolver of a convolution or its backward: as a matmul over im2col columns where that applies
    (`_convolution_matmul`), else each position's terms gathered (a transposed convolution's always: see
    `_transposed_terms`)."""
    def resolve(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
        gathered_only = _transposed_terms(op, args, kwargs, i)
        if gathered_only is None and _bind(op, args, kwargs)["input"].dim() == 5:  # (3-d: the kernels take 2)
            gathered_only = _CONVOLUTION_TERMS[op](args, kwargs, i, volumes=True)
        if gathered_only is not None:
            return _chunked(pos, gathered_only[0], _rounded(gathered_only[1], bits))
        as_matmul = _convolution_matmul(op, args, kwargs, i, len(pos))
        if as_matmul is not None:
            return _matmul_at(as_matmul, pos, bits)
        def gathered(ps: np.ndarray) -> np.ndarray:
            # (built when asked: the kernels below take nearly every position without these terms)
            width, part = _CONVOLUTION_TERMS[op](args, kwargs, i)
            return _chunked(ps, width=width, fn=_rounded(part, bits))

        out = _convolution_dots(op, args, kwargs, i, pos, bits, gathered)
        return gathered(pos) if out is None else out

    return resolve


Located = Callable[[np.ndarray], tuple]  # flat positions -> (batch, row, column, addend or None) of a matmul


def _convolution_matmul(op: Any, args: tuple, kwargs: dict, i: int,
                        positions: int) -> tuple[tuple[np.ndarray, ...], Located] | None:
    """Output i of a convolution (op: forward, or backward's grad_input and grad_weight) as a batched matmul
    over im2col columns, ((a (N', R, K), b (N', K, C)) numpy views, positions -> where in a @ b), for
    vtrain.exactdot. Each position's dot product has the terms `_convolution_terms` gathers, in another
    order, which an exact sum does not see. One copy of the windows (torch's unfold, padding reads zeros)
    replaces gathering every position's K terms from both operands: on the scale CNN a weight gradient
    position has 2,048 terms, and the gathering took most of the exact resolution's time. None where it
    does not apply: tensors the kernel cannot read (vtrain.resolve._views), grad_input of a strided
    convolution or one padded beyond the kernel's reach, grad_bias (a plain sum); and where gathering the
    `positions`' terms from both operands reads fewer values than the copy of the windows (the examples
    recompute a position or two a step, where the copy cost 0.3 ms a step), or where the copy would pass
    _WINDOWS_MAX (gathering goes in chunks of bounded memory)."""
    kw = _bind(op, args, kwargs)
    x, w, (s0, s1), (p0, p1), (d0, d1), groups = _conv_geometry(op, kw)
    g = kw.get("grad_output")
    if i > 1 or _views(*(t for t in (x, w, g) if t is not None)) is None:
        return None
    n_img, c_in, h, wd = x.shape
    c_out, c_g, kh, kwd = w.shape
    co_g, kk = c_out // groups, kh * kwd
    oh, ow = _out_size(h, kh, s0, p0, d0), _out_size(wd, kwd, s1, p1, d1)
    if g is not None and i == 0:  # grad_input: the windows are g's
        terms, windows = co_g * kk, n_img * c_out * kk * h * wd
    else:
        terms, windows = c_g * kk if g is None else n_img * oh * ow, n_img * c_in * kk * oh * ow
    # the windows, a permuted copy of them (grad_weight) or of g, the float64 lines exactdot gathers from
    # them, and `_per_image`'s weights
    copies = 3 * windows + (n_img * w.numel() if groups > 1 and i == 0 else 0)
    if 2 * positions * terms < windows or copies > _WINDOWS_MAX:
        return None
    if g is None:  # out[n, co, y, z] = w[co] . window(n, y, z) of co's group, + bias[co]
        cols = F.unfold(x, (kh, kwd), dilation=(d0, d1), padding=(p0, p1), stride=(s0, s1))
        a = _per_image(w.reshape(groups, co_g, c_g * kk), n_img)
        b = cols.reshape(n_img * groups, c_g * kk, oh * ow)
        bias = kw["bias"]

        def locate(ps: np.ndarray) -> tuple:
            n, co, yz = np.unravel_index(ps, (n_img, c_out, oh * ow))
            return n * groups + co // co_g, co % co_g, yz, None if bias is None else _at(bias, co)
        return _views(a, b), locate
    g = g.unsqueeze(2) if g.dim() == 3 else g
    if i == 1:  # grad_weight[co, cl, a, b] = g[:, co] . window column (cl, a, b), over images and positions
        cols = F.unfold(x, (kh, kwd), dilation=(d0, d1), padding=(p0, p1), stride=(s0, s1))
        a = g.reshape(n_img, groups, co_g, oh * ow).permute(1, 2, 0, 3).reshape(groups, co_g, n_img * oh * ow)
        b = cols.reshape(n_img, groups, c_g * kk, oh * ow).permute(1, 0, 3, 2).reshape(groups, n_img * oh * ow,
                                                                                       c_g * kk)

        def locate(ps: np.ndarray) -> tuple:
            co, j = np.unravel_index(ps, (c_out, c_g * kk))
            return co // co_g, co % co_g, j, None
        return _views(a, b), locate
    # grad_input at stride 1: the convolution of g, padded by (k - 1) d - p, with the flipped weight
    q0, q1 = (kh - 1) * d0 - p0, (kwd - 1) * d1 - p1
    if (s0, s1) != (1, 1) or q0 < 0 or q1 < 0:
        return None
    cols = F.unfold(g, (kh, kwd), dilation=(d0, d1), padding=(q0, q1))  # (N, C_out kk, H W)
    a = w.flip(2, 3).reshape(groups, co_g, c_g, kk).permute(0, 2, 1, 3).reshape(groups, c_g, co_g * kk)
    b = cols.reshape(n_img * groups, co_g * kk, h * wd)

    def locate(ps: np.ndarray) -> tuple:
        n, ci, yz = np.unravel_index(ps, (n_img, c_in, h * wd))
        return n * groups + ci // c_g, ci % c_g, yz, None
    return _views(_per_image(a, n_img), b), locate


def _per_image(t: torch.Tensor, n_img: int) -> torch.Tensor:
    """A weight (G, R, K) as the (N G, R, K) batch of a matmul whose batch is (image, group): a broadcast
    view for one group, else a copy per image."""
    return t.expand(n_img, *t.shape[1:]) if t.shape[0] == 1 else t.repeat(n_img, 1, 1)


def _matmul_at(as_matmul: tuple[tuple[np.ndarray, ...], Located], pos: np.ndarray, bits: int) -> np.ndarray:
    (a, b), locate = as_matmul
    batch, rows, cols, extra = locate(pos)
    return exactdot.rounded_dots_at(a, b, batch, rows, cols, bits, extra)


def abs_sums(op: Any, args: tuple, kwargs: dict, i: int, pos: np.ndarray) -> np.ndarray:
    """Per flat position of output i of a convolution (or its backward), the sum of its terms' absolute
    values (and the addend's), in float64: what vtrain.bounds' gathered E scales."""
    width, part = _CONVOLUTION_TERMS[op](args, kwargs, i)

    def sums(ps: np.ndarray) -> np.ndarray:
        a, b, extra = part(ps)
        a = a.to(torch.float64).abs().reshape(len(ps), -1)
        s = (a if b is None else a * b.to(torch.float64).abs().reshape(len(ps), -1)).sum(1)
        return (s if extra is None else s + extra.to(torch.float64).abs()).numpy()

    return _chunked(pos, width, sums)


# -- reductions -------------------------------------------------------------------------------------


def _reduction(op: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, list[int], list[int]]:
    """(input, kept dims, reduced dims) of sum/mean; dim None or [] reduces everything."""
    kw = _bind(op, args, kwargs)
    x = kw["self"]
    if not x.is_floating_point():
        x = x.to(torch.float64)  # integer and bool sums: exact in float64 while below 2^53
    dim = kw.get("dim")
    nd = x.dim()
    red = sorted({d % nd for d in dim}) if dim and nd else list(range(nd))
    return x, [d for d in range(nd) if d not in red], red


def _rows(x: torch.Tensor, keep: list[int], red: list[int], pos: np.ndarray) -> torch.Tensor:
    """(P, n): the reduced slice of x for each output position (flat over the kept dims)."""
    if not x.dim():
        return x.reshape(1, 1).expand(len(pos), 1)
    xp = x.permute(*keep, *red)
    n = math.prod(x.shape[d] for d in red)
    if not keep:
        return xp.reshape(1, n).expand(len(pos), n)
    return xp[_unravel(pos, [x.shape[d] for d in keep])].reshape(len(pos), n)


def _reduce(op: Any, mean: bool) -> Resolver:
    def resolve(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
        x, keep, red = _reduction(op, args, kwargs)
        n = math.prod(x.shape[d] for d in red)
        if mean and n == 0:
            raise ResolveError(f"{op}: the mean of an empty slice has no exact value (0/0)")
        return _chunked(pos, n, lambda ps: _rounded_sums(_rows(x, keep, red, ps), bits, n if mean else None))

    return resolve


# -- NLL loss ---------------------------------------------------------------------------------------


def _nll_terms(x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
               ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(picked x[n, target[n]], weight of target[n]; both 0 where ignored), for (C,) or (N, C) input."""
    x2 = x.reshape(1, -1) if x.dim() == 1 else x
    t = target.reshape(-1)
    valid = t != ignore_index
    safe = torch.where(valid, t, torch.zeros_like(t))
    picked = torch.where(valid, x2[torch.arange(len(t)), safe], torch.zeros((), dtype=x.dtype))
    wt = torch.ones_like(picked) if weight is None else weight[safe].to(picked.dtype)
    return picked, torch.where(valid, wt, torch.zeros((), dtype=wt.dtype))


def _nll_loss_forward(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
    op = aten.nll_loss_forward.default
    kw = _bind(op, args, kwargs)
    weight = None if kw["weight"] is None else kw["weight"].cpu()
    picked, wt = _nll_terms(kw["self"].cpu(), kw["target"].cpu(), weight, kw["ignore_index"])
    reduction = kw["reduction"]
    if reduction == 0:  # none: loss[n] = -w[t_n] x[n, t_n]; total_weight is 0 by torch's convention
        if i == 1:
            return np.zeros(len(pos))
        ix = _t(pos)
        return _rounded_dots(-picked[ix][:, None], wt[ix][:, None], bits)
    if i == 1:  # total_weight = sum of the weights of the non-ignored targets
        return np.full(len(pos), _rounded_sums(wt[None], bits)[0])
    if reduction == 2:
        return np.full(len(pos), _rounded_dots(-picked[None], wt[None], bits)[0])
    total = exactmath.exact_sums(_np(wt[None]))[0]
    if total == 0:
        raise ResolveError(f"{op}: mean reduction with zero total weight (every target ignored) is 0/0")
    loss = exactmath.exact_dots(_np(-picked[None]), _np(wt[None]))[0]
    return np.full(len(pos), exactmath.round_fraction(loss / total, bits))


def _nll_loss_backward(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
    op = aten.nll_loss_backward.default
    kw = _bind(op, args, kwargs)
    x, target, weight, g = kw["self"], kw["target"].reshape(-1).cpu(), kw["weight"], kw["grad_output"]
    reduction, ignore = kw["reduction"], kw["ignore_index"]
    n, c = np.unravel_index(pos, (1, x.shape[0]) if x.dim() == 1 else tuple(x.shape))
    t = target.numpy()[n]
    hit = (c == t) & (t != ignore)  # every other element of grad_input is an exact zero
    out = np.zeros(len(pos))
    if not hit.any():
        return out
    wt = np.ones(int(hit.sum())) if weight is None else _np(weight[_t(t[hit])])
    gv = _np(g.reshape(-1)[_t(n[hit])]) if reduction == 0 else np.full(len(wt), float(g))
    if reduction == 1:  # mean: -w g / total_weight, one rounding of the exact rational
        total = Fraction(float(kw["total_weight"]))
        if total == 0:
            raise ResolveError(f"{op}: mean reduction with zero total weight (every target ignored) is 0/0")
        out[hit] = exactmath.round_fractions([-Fraction(a) * Fraction(b) / total for a, b in zip(wt, gv)], bits)
    else:
        out[hit] = exactmath.rounded_dots(-wt[:, None], gv[:, None], bits)
    return out


# -- pooling ----------------------------------------------------------------------------------------


def _pool_params(kw: dict) -> tuple[tuple, tuple, tuple, bool]:
    kernel = _pair(kw["kernel_size"])
    stride = _pair(kw["stride"]) if len(kw["stride"]) else kernel  # [] means the kernel size
    return kernel, stride, _pair(kw["padding"]), bool(kw["ceil_mode"])


def _pool_out(size: int, k: int, s: int, p: int, ceil: bool) -> int:
    """torch's pooling output size (pooling_output_shape, dilation 1)."""
    out = (size + 2 * p - (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
    if ceil and (out - 1) * s >= size + p:  # the last window must start inside the input or left padding
        out -= 1
    return out


def _windows(o: torch.Tensor, size: int, k: int, s: int, p: int) -> tuple[torch.Tensor, ...]:
    """Per output index o along one axis: (window start incl. padding, padded extent, clipped start, clipped
    end), as torch's avg_pool2d computes them: the extent counts padding but not the ceil_mode overhang."""
    start = o * s - p
    end = torch.clamp(start + k, max=size + p)
    return start, end - start, start.clamp(min=0), end.clamp(max=size)


def _avg_divisor(kw: dict, pad_extent: torch.Tensor, clipped: torch.Tensor) -> torch.Tensor:
    if kw["divisor_override"] is not None:
        return torch.full_like(clipped, int(kw["divisor_override"]))
    return pad_extent if kw["count_include_pad"] else clipped


def _planes(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-2], x.shape[-1])  # (N*C, H, W); also takes unbatched (C, H, W)


def _avg_pool2d(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
    op = aten.avg_pool2d.default
    kw = _bind(op, args, kwargs)
    (k0, k1), (s0, s1), (p0, p1), ceil = _pool_params(kw)
    x = _planes(kw["self"])
    _, h, wd = x.shape
    oh, ow = _pool_out(h, k0, s0, p0, ceil), _pool_out(wd, k1, s1, p1, ceil)

    def part(ps: np.ndarray) -> np.ndarray:
        pl, r, c = _unravel(ps, (x.shape[0], oh, ow))
        hs, hx, hlo, hhi = _windows(r, h, k0, s0, p0)
        ws, wx, wlo, whi = _windows(c, wd, k1, s1, p1)
        hh = hs[:, None] + torch.arange(k0)
        ww = ws[:, None] + torch.arange(k1)
        valid = ((hh >= hlo[:, None]) & (hh < hhi[:, None]))[:, :, None] & \
            ((ww >= wlo[:, None]) & (ww < whi[:, None]))[:, None, :]
        terms = _masked(x, (pl[:, None, None], hh[:, :, None], ww[:, None, :]), valid)
        div = _avg_divisor(kw, hx * wx, (hhi - hlo) * (whi - wlo))
        return _rounded_sums(terms, bits, [int(d) for d in div])

    return _chunked(pos, k0 * k1, part)


def _avg_pool2d_backward(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
    op = aten.avg_pool2d_backward.default
    kw = _bind(op, args, kwargs)
    (k0, k1), (s0, s1), (p0, p1), _ = _pool_params(kw)
    g, x = _planes(kw["grad_output"]), _planes(kw["self"])
    _, h, wd = x.shape
    _, oh, ow = g.shape
    nh, nw = -(-k0 // s0), -(-k1 // s1)  # at most this many windows cover one input row (column)

    def part(ps: np.ndarray) -> np.ndarray:
        pl, y, z = _unravel(ps, tuple(x.shape))
        # grad_input[y, z] = sum over the windows (r, c) whose clipped extent holds (y, z) of g[r, c] / div(r, c)
        r = (y + p0).div(s0, rounding_mode="floor")[:, None] - torch.arange(nh)  # (P, nh) candidates
        c = (z + p1).div(s1, rounding_mode="floor")[:, None] - torch.arange(nw)
        hs, hx, hlo, hhi = _windows(r, h, k0, s0, p0)
        ws, wx, wlo, whi = _windows(c, wd, k1, s1, p1)
        vr = (r >= 0) & (r < oh) & (y[:, None] >= hlo) & (y[:, None] < hhi)
        vc = (c >= 0) & (c < ow) & (z[:, None] >= wlo) & (z[:, None] < whi)
        valid = vr[:, :, None] & vc[:, None, :]
        terms = _masked(g, (pl[:, None, None], r[:, :, None], c[:, None, :]), valid).reshape(len(ps), -1)
        div = _avg_divisor(kw, hx[:, :, None] * wx[:, None, :], ((hhi - hlo)[:, :, None] * (whi - wlo)[:, None, :]))
        div = torch.where(valid, div, torch.ones((), dtype=div.dtype)).reshape(len(ps), -1).numpy()
        if kw["divisor_override"] is not None:
            return _rounded_sums(terms, bits, int(kw["divisor_override"]))
        # sum_k g_k / d_k = (sum_k g_k (L / d_k)) / L with L the row's lcm: one exact dot and one division.
        lcm = np.lcm.reduce(div, axis=1)
        sums = exactmath.exact_dots(_np(terms), (lcm[:, None] // div).astype(np.float64))
        return exactmath.round_fractions([s / int(m) for s, m in zip(sums, lcm)], bits)

    return _chunked(pos, nh * nw, part)


def _scatter_rows(keys: torch.Tensor, wanted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each wanted key: the indices i with keys[i] == key (as a padded (P, width) array) and a mask."""
    kk = keys.reshape(-1).cpu().numpy()
    order = np.argsort(kk, kind="stable")
    sk = kk[order]
    lo, hi = np.searchsorted(sk, wanted, "left"), np.searchsorted(sk, wanted, "right")
    width = max(int((hi - lo).max(initial=0)), 1)
    idx = lo[:, None] + np.arange(width)
    valid = idx < hi[:, None]
    return order[np.minimum(idx, len(order) - 1)] if len(order) else np.zeros_like(idx), valid


def _max_pool2d_backward(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
    op = aten.max_pool2d_with_indices_backward.default
    kw = _bind(op, args, kwargs)
    x, g, ind = kw["self"], kw["grad_output"], kw["indices"].cpu()
    hw = x.shape[-1] * x.shape[-2]
    ohw = g.shape[-1] * g.shape[-2]
    # grad_input[plane, j] = sum of grad over the outputs whose argmax index is j (in the same plane)
    keys = ind.reshape(-1, ohw) + torch.arange(ind.numel() // max(ohw, 1))[:, None] * hw
    src, valid = _scatter_rows(keys, pos)
    terms = np.where(valid, _np(g.reshape(-1)[_t(src)]), 0.0)
    return _rounded_sums(torch.from_numpy(terms), bits)


def _embedding_dense_backward(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
    op = aten.embedding_dense_backward.default
    kw = _bind(op, args, kwargs)
    g, ind = kw["grad_output"], kw["indices"].reshape(-1).cpu()
    d = g.shape[-1]
    g = g.reshape(-1, d)
    row, col = np.divmod(pos, d)
    src, valid = _scatter_rows(ind, row)  # the positions t with indices[t] == row
    valid &= (row != kw["padding_idx"])[:, None]  # padding_idx's row gets no gradient
    terms = np.where(valid, _np(g[_t(src), _t(np.broadcast_to(col[:, None], src.shape))]), 0.0)
    divisor = None
    if kw["scale_grad_by_freq"]:  # every occurrence is scaled by 1/count: the sum over the count
        counts = np.bincount(ind.numpy(), minlength=int(kw["num_weights"]))[row]
        divisor = [max(int(cnt), 1) for cnt in counts]
    return _rounded_sums(torch.from_numpy(terms), bits, divisor)


# -- elementwise functions --------------------------------------------------------------------------


def _function(name: str) -> Resolver:
    def resolve(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
        return exactmath.correctly_rounded(name, bits, _at(args[0], pos))

    return resolve


def _pow(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
    kw = _bind(aten.pow.Tensor_Scalar, args, kwargs)
    return exactmath.correctly_rounded("pow", bits, _at(kw["self"], pos), exponent=float(kw["exponent"]))


def _pows(op: Any) -> Resolver:
    """pow.Tensor_Tensor and pow.Scalar (a number to tensor powers): `_pow` at each position's base and exponent,
    one call per distinct exponent."""
    def resolve(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
        kw = _bind(op, args, kwargs)
        base, exponent = kw["self"], kw["exponent"]
        base = base if isinstance(base, torch.Tensor) else torch.tensor(float(base), dtype=torch.float64)
        x, e = (_at(t.double() if not t.is_floating_point() else t, pos)
                for t in torch.broadcast_tensors(base, exponent))
        out = np.empty(len(pos))
        for value in np.unique(e):
            at = e == value
            out[at] = exactmath.correctly_rounded("pow", bits, x[at], exponent=float(value))
        return out

    return resolve


def _trigamma(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
    # (polygamma(n, x): the registry's bound refuses n != 1 before anything is resolved)
    return exactmath.correctly_rounded("trigamma", bits, _at(args[1], pos))


def _atan2(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
    y, x = torch.broadcast_tensors(args[0], args[1])
    return exactmath.correctly_rounded("atan2", bits, _at(y, pos), _at(x, pos))


def _gelu_name(op: Any, approximate: str, suffix: str = "") -> str:
    if approximate not in ("none", "tanh"):
        raise ResolveError(f"{op}: unknown approximate={approximate!r} (torch knows 'none' and 'tanh')")
    return ("gelu" if approximate == "none" else "gelu_tanh") + suffix


def _gelu(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
    kw = _bind(aten.gelu.default, args, kwargs)
    return exactmath.correctly_rounded(_gelu_name(aten.gelu.default, kw["approximate"]), bits, _at(kw["self"], pos))


def _gelu_backward(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
    op = aten.gelu_backward.default
    kw = _bind(op, args, kwargs)
    g, x = torch.broadcast_tensors(kw["grad_output"], kw["self"])
    return exactmath.correctly_rounded(_gelu_name(op, kw["approximate"], "_backward"), bits, _at(g, pos), _at(x, pos))


RESOLVERS: dict[Any, Resolver] = {
    aten.mm.default: _mm,
    aten.bmm.default: _bmm,
    aten.dot.default: _dot,
    aten.mv.default: _mv,
    aten.addmm.default: _addmm,
    aten.convolution.default: _convolution(aten.convolution.default),
    aten.convolution_backward.default: _convolution(aten.convolution_backward.default),
    aten.sum.default: _reduce(aten.sum.default, mean=False),
    aten.sum.dim_IntList: _reduce(aten.sum.dim_IntList, mean=False),
    aten.mean.default: _reduce(aten.mean.default, mean=True),
    aten.mean.dim: _reduce(aten.mean.dim, mean=True),
    aten.nll_loss_forward.default: _nll_loss_forward,
    aten.nll_loss_backward.default: _nll_loss_backward,
    aten.avg_pool2d.default: _avg_pool2d,
    aten.avg_pool2d_backward.default: _avg_pool2d_backward,
    aten.max_pool2d_with_indices_backward.default: _max_pool2d_backward,
    aten.embedding_dense_backward.default: _embedding_dense_backward,
    # (every function of one argument that vtrain.exactmath knows by the aten op's name)
    **{getattr(aten, name).default: _function(name)
       for name in ("exp", "exp2", "log", "log2", "log10", "tanh", "sigmoid", "expm1", "log1p", "rsqrt", "erf", "erfc",
                    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "lgamma",
                    "digamma", "erfinv")},
    aten.pow.Tensor_Scalar: _pow,
    aten.pow.Tensor_Tensor: _pows(aten.pow.Tensor_Tensor),
    aten.pow.Scalar: _pows(aten.pow.Scalar),
    aten.atan2.default: _atan2,
    aten.polygamma.default: _trigamma,
    aten.gelu.default: _gelu,
    aten.gelu_backward.default: _gelu_backward,
}


# -- certificates -----------------------------------------------------------------------------------
# See the module docstring for the argument. E / gamma_K is computed in floating point (and gamma_K
# itself is), each a few ulps of the work dtype; _MARGIN absorbs that, so the test stays sufficient.

_MARGIN = 1 + 2.0**-16


def lsb(t: torch.Tensor) -> torch.Tensor:
    """Lowest set bit of each element's significand as a float64 power of two; +inf for zeros (a zero term
    is a multiple of anything)."""
    a = t.detach().to(torch.float64).abs()
    bits = a.view(torch.int64)
    # Clearing the lowest set bit of the bit pattern gives the next value below |a| in its binade, so the
    # difference is the lsb, exactly (Sterbenz). A power of two has no significand bit set (the borrow
    # would reach the exponent field): its lsb is itself. Subnormals work the same way.
    cleared = (bits & (bits - 1)).view(torch.float64)
    low = torch.where((bits & ((1 << 52) - 1)) == 0, a, a - cleared)
    return low.masked_fill_(a == 0, math.inf)


def min_lsb(x: torch.Tensor, idx: torch.Tensor, dim: int) -> torch.Tensor:
    """lsb(x[idx]).amin(1) (dim 0: rows idx) or lsb(x[:, idx]).amin(0) (dim 1: columns idx) of a 2-d
    tensor; on CPU in one compiled pass without temporaries (the certificates of large matmuls read thousands
    of rows and columns). The same powers of two as `lsb`, so the same minima; NaN where a line holds a NaN."""
    return torch.from_numpy(_min_lsb(x, idx.cpu().numpy(), dim))


def _min_lsb(x: torch.Tensor, idx: np.ndarray, dim: int) -> np.ndarray:
    """`min_lsb` with numpy indices and result."""
    layout = _lsb_bits(x)
    if layout is None:
        ix = torch.from_numpy(idx).to(x.device)
        return (lsb(x[ix]).amin(1) if dim == 0 else lsb(x[:, ix]).amin(0)).cpu().numpy()
    bits, mant = layout
    out = np.empty(idx.size)
    _min_lsb_lines(bits if dim == 0 else bits.T, idx, mant, out)
    return out


def _slices_min_lsb(t: torch.Tensor, keys: np.ndarray, dim: int = 0) -> np.ndarray:
    """Per key k, the smallest lsb over t.select(dim, k) (all its other dims): `min_lsb` over t's slices
    laid out as lines, one compiled pass instead of ~10 torch calls on a gathered copy (the certificates
    of a small model's op cost more than its arithmetic)."""
    t = t.detach()
    if dim and dim == t.dim() - 1 and t.is_contiguous():
        # slices along the last dim are a matrix's columns, read in place through `_min_lsb`'s blocked copy
        # (a bias gradient's sum over 1024 rows of 768 in GPT-2's step: gathered and moved, two copies, 2.1
        # against 1.3 ms a call)
        return _min_lsb(t.reshape(-1, t.shape[-1]), keys, 1)
    if dim:  # (slices across memory: gather the asked ones only, not a copy of the whole tensor)
        t = t.index_select(dim, torch.from_numpy(keys).to(t.device)).movedim(dim, 0)
        keys = np.arange(len(keys))
    return _min_lsb(t.reshape(t.shape[0], -1), keys, 0)


def _lsb_np(t: torch.Tensor) -> np.ndarray:
    """lsb of every element (flattened), as `_min_lsb` over one-element lines."""
    flat = t.reshape(-1, 1)
    return _min_lsb(flat, np.arange(flat.shape[0]), 0)


_INF_BITS = np.float64(np.inf).view(np.int64)
_ABS_BITS = (1 << 63) - 1
_FRAC_BITS = (1 << 52) - 1


@njit(cache=True, nogil=True, inline="always")
def _lsb_key(b: int, mant: int) -> int:
    # The lsb of a value from its bit pattern (float32's, mant 23, or float64's), as the bits of a float64, in
    # integer operations and one subtraction that LLVM vectorises (as `lsb` does it: clearing the lowest set
    # bit of |x|'s significand leaves the next value below |x| in its binade, so the difference is the lsb,
    # exactly; a power of two has none set and is its own lsb). A float32 is widened first, exactly, with the
    # same lsb. Zeros (a zero term is a multiple of anything) and infinities (they add nothing to a minimum)
    # key inf, NaN -1, below them all; non-negative floats order as their bit patterns, so the minimum of the
    # keys is the key of the minimum. (A table of each exponent's lsb weight, gathered per value, cost 2.9 ns
    # a value on a line of a million against 0.5 for this.)
    if mant != 52:
        b = np.float64(np.int32(b).view(np.float32)).view(np.int64)
    a = b & _ABS_BITS
    cleared = a & (a - 1) & -np.int64((a & _FRAC_BITS) != 0)
    low = np.float64(np.int64(a).view(np.float64) - np.int64(cleared).view(np.float64)).view(np.int64)
    key = _INF_BITS if (a == 0) | (a >= _INF_BITS) else low
    return -1 if a > _INF_BITS else key


_LINES = 64  # lines per chunk of the transposed path: 64 x K values in a buffer


@njit(cache=True, nogil=True)
def _min_lsb_lines(bits: np.ndarray, idx: np.ndarray, mant: int, out: np.ndarray) -> None:
    """out[t] = min over k of the lsb of bits[idx[t], k]; NaN if any is NaN."""
    if bits.strides[1] <= bits.strides[0]:
        for t in range(idx.size):
            out[t] = _line_min_lsb(bits[idx[t]], mant)
        return
    # A transposed operand's lines run across memory. Read one at a time they cost a cache miss a value and
    # do not vectorise (6.8 ns a value on 600 columns of a 2048 x 2048 matrix); copied a chunk of lines at a
    # time into a buffer by exactdot's blocked copy, and then reduced along the buffer's rows, 2.5 ns.
    buf = np.empty((_LINES, bits.shape[1]), np.int64)
    batch = np.zeros(_LINES, np.int64)
    for c0 in range(0, idx.size, _LINES):
        c1 = min(idx.size, c0 + _LINES)
        exactdot.copy_lines(bits[None], batch[:c1 - c0], idx[c0:c1], buf)
        for t in range(c0, c1):
            out[t] = _line_min_lsb(buf[t - c0], mant)


@njit(cache=True, nogil=True, inline="always")
def _line_min_lsb(line: np.ndarray, mant: int) -> float:
    # A branch-free integer minimum of `_lsb_key` along a contiguous line, which LLVM vectorises (3x faster
    # than comparing the lsb's floats one by one).
    low = _INF_BITS
    for k in range(line.size):
        low = min(low, _lsb_key(line[k], mant))
    return _key_lsb(low)


@njit(cache=True, nogil=True, inline="always")
def _key_lsb(key: int) -> float:
    """The lsb a `_lsb_key` stands for (NaN for a NaN's key)."""
    return np.nan if key < 0 else np.int64(key).view(np.float64)


# The certifiers index with numpy: a certificate reads a few lines per call, and each torch call on
# such small tensors costs more than the reading (they ran at ~200 us a call with torch indexing, and a
# small model's trainer makes a few calls a step).

def _coords(pos: np.ndarray, shape: Sequence[int]) -> tuple[np.ndarray, ...]:
    """Row-major coordinates of flat positions (divmod: a third of np.unravel_index's time)."""
    out = []
    for size in reversed(tuple(shape)[1:]):
        pos, rest = np.divmod(pos, size)
        out.append(rest)
    return (pos, *reversed(out))


def _per_key(key: np.ndarray, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """fn over the distinct keys only (one value per key), spread back to every position: the ambiguous
    positions of an op share few rows, columns, images or channels. (A few keys go to fn as they are: the
    deduplication would cost more than the repeats.)"""
    if key.size <= _FEW_KEYS:
        return fn(key)
    uniq, inverse = exactdot.distinct(key, int(key.max()) + 1)
    return fn(uniq)[inverse]


_FEW_KEYS = 32


def _all(pos: torch.Tensor) -> torch.Tensor:
    return torch.ones(len(pos), dtype=torch.bool, device=pos.device)


def _certify(q: np.ndarray | float, e: Bound | None, k: int, out: torch.Tensor, pos: torch.Tensor,
             divisor: int = 1) -> torch.Tensor | None:
    """q: power-of-two grain of every term of each position's sum (or one grain for all); e: the op's bound
    E >= gamma_k * S (S = sum|terms|) of k terms at the positions, for a result divided by `divisor`
    (a power of two). True at the positions where S < 2^p q and q / divisor does not underflow."""
    ok = _certified(q, e, k, out, divisor)
    return None if ok is None else torch.from_numpy(ok).to(pos.device)


def _certified(q: np.ndarray | float, e: Bound | None, k: int, out: torch.Tensor,
               divisor: int = 1) -> np.ndarray | None:
    """`_certify` as a numpy array."""
    bound = _sum_bound(e, k, out, divisor)
    if bound is None:
        return None
    s_upper, p, tiny = bound
    # (q 2^p beyond float64's range, for grains near its top, is rightly infinite: any finite S of such
    # grains counts fewer than 2^p of them)
    with np.errstate(over="ignore"):
        return (s_upper < np.multiply(q, 2.0**p)) & (np.asarray(q) >= tiny * divisor)


def _sum_bound(e: Bound | None, k: int, out: torch.Tensor, divisor: int = 1) -> SumBound | None:
    """(S's upper bound E / gamma_k at the positions, rounded up and times `divisor`, the precision p of out's
    dtype, its smallest subnormal), or None where no certificate applies."""
    if e is None or k <= 0:
        return None
    if out.dtype == torch.float64:
        p, tiny, u = 53, 2.0**-1074, 2.0**-53
    elif out.dtype == torch.float32:
        p, tiny, u = 24, 2.0**-149, 2.0**-24
    else:
        return None
    if k * u >= 0.5:
        return None
    # (E as the engine gathers it, a float64 numpy array, or a CPU float64 tensor, whose numpy view is not
    # `_np`'s copy: ~3 us a call)
    if isinstance(e, np.ndarray):
        values = e
    else:
        values = e.detach().numpy() if e.dtype == torch.float64 and e.is_cpu else _np(e)
    return values * (divisor * _MARGIN * (1 - k * u) / (k * u)), p, tiny


def certify(op: Any, args: tuple, kwargs: dict, outs: Sequence, e: Bound | None, i: int,
            pos: torch.Tensor, held: np.ndarray | None = None) -> torch.Tensor | None:
    """`CERTIFIERS[op]` at flat positions `pos` of output i (None where the op has no certifier), given the output's
    own values there if known (`held`: the device's unrounded v). A matmul's certificate reads them in its own
    compiled pass (`_certify_lines`). A convolution whose values rule a certificate out at every position
    (`_ruled_out`) answers False there without reading its operands, and one whose values and samples of its
    slices do (`_sampled_out`) after reading a few hundred values a position; the answer is the certifier's
    everywhere. (Where some position stays open the certifier takes them all: its cost is per call, ~250 us,
    and asking it for fewer positions saved nothing.)"""
    certifier = CERTIFIERS.get(op)
    if certifier is None:
        return None
    if op in _LINE_CERTIFIED:
        return certifier(args, kwargs, outs, e, i, pos, held)
    terms = _TERMS.get(op)
    if held is not None and terms is not None and e is not None and len(pos):
        k = terms(args, kwargs, i)
        bound = _sum_bound(e, k, outs[i])  # (S's, for both rules)
        ruled = _ruled_out(held, bound)
        if ruled.all() or _sampled_out(op, args, kwargs, bound, outs[i], pos, ruled, i).all():
            # (numpy's zeros on the CPU: torch.zeros cost ~20 us a call in a training step)
            return torch.from_numpy(np.zeros(len(pos), np.bool_)) if pos.is_cpu else \
                torch.zeros(len(pos), dtype=torch.bool, device=pos.device)
    return certifier(args, kwargs, outs, e, i, pos)


# The term count k a convolution's certificate takes at output i (`_conv_terms`), which `_ruled_out` reads: a
# certified value is an exact sum of k products.
_TERMS: dict[Any, Callable[[tuple, dict, int], int]] = {
    op: (lambda args, kwargs, i, op=op: _conv_terms(_bind(op, args, kwargs), i))
    for op in (aten.convolution.default, aten.convolution_backward.default)
}


def _ruled_out(held: np.ndarray, bound: SumBound | None) -> np.ndarray:
    """Where a sum whose computed values are `held` (S's bound there: `bound`, `_sum_bound`'s answer for its E
    and term count) cannot pass a grain certificate, read from the values alone (all False where no certificate
    applies: bound None).

    A certificate holds where every term is a multiple of a power of two q and S < 2^p q: every partial sum is
    then exact, so v is the exact sum, a multiple of q, and a nonzero v's lowest set bit is at least q. So
    where S's bound reaches 2^p lsb(v) no q can pass. A float sum near a rounding boundary has lsb(v) ~ 2^-52
    |v| and S >= |v|, so this rules out most of them (the trainer's matmul and convolution positions: 94 % at
    GPT-2-tiny d_model 256, 95 % at resnet-tiny width 32). An exact tie on a float32 midpoint has lsb(v) ~
    2^-24 |v| and is never ruled out; nor are NaN (no lsb), zeros and infinities (lsb: inf), unless E is
    infinite, where no certificate passes either."""
    ruled = np.zeros(len(held), dtype=bool)
    if bound is not None:
        s_upper, p, _ = bound
        if s_upper.shape != held.shape:  # (the kernel reads both by index, unchecked)
            raise ValueError(f"{len(held)} values for {s_upper.size} bounds")
        bits, mant, _, _ = fused._layout(np.ascontiguousarray(held))
        _below_sums(bits, mant, s_upper, 2.0**p, ruled)
    return ruled


@njit(cache=True, nogil=True)
def _below_sums(bits: np.ndarray, mant: int, s_upper: np.ndarray, top: float, out: np.ndarray) -> None:
    """out[t] = s_upper[t] >= top * lsb(value t) (`_ruled_out`; a NaN's lsb, key -1, rules nothing out; 2^p lsb
    past float64's range is infinite and rules nothing out)."""
    for t in range(bits.size):
        out[t] = _value_refuses(bits[t], mant, s_upper[t], top)


@njit(cache=True, nogil=True, inline="always")
def _value_refuses(bits: int, mant: int, s: float, top: float) -> bool:
    # (a NaN's key, -1, refuses nothing, nor does S's NaN)
    key = _lsb_key(bits, mant)
    return key >= 0 and s >= _key_lsb(key) * top


def _sampled_out(op: Any, args: tuple, kwargs: dict, bound: SumBound | None, out: torch.Tensor, pos: torch.Tensor,
                 ruled: np.ndarray, i: int = 0) -> np.ndarray:
    """`ruled` (`_ruled_out`'s answer at flat positions `pos` of a convolution's output i, `out`, for S's bound
    `bound`), and where a sample of each open position's slices refuses a grain certificate: `_slice_sample`'s
    values of each factor's slice bound its lowest lsb from above, so q_sample >= the certifier's grain, and S's
    bound >= 2^p q_sample fails the certificate. The near misses the values leave (a sum with a few low zero bits
    by chance) mostly fall here: at resnet-tiny width 32 all of a step's ~12 convolution calls, whose certifier
    took ~250 us a call in Python to answer False (session 44). Convolutions on CPU float64/float32 operands whose
    slices hold more than _SAMPLED_SLICES values (the certifier reads smaller ones whole as cheaply); other ops
    and operands as given."""
    if bound is None or op not in _FACTORS:
        return ruled
    if bound[0].shape != (len(pos),):  # (the kernel reads by index, unchecked)
        raise ValueError(f"{len(pos)} positions for {bound[0].size} bounds")
    found = _FACTORS[op](args, kwargs, out.shape, i, pos)
    if found is None or sum(t.numel() for t, _, _ in found[0]) <= _SAMPLED_SLICES:
        return ruled
    open_ = np.flatnonzero(~ruled)
    q = np.ones(open_.size)
    for t, dim, keys in found[0]:
        memory = _strided_bits(t)
        if memory is None:
            return ruled
        _sample_slices(memory[0], memory[1], np.array(t.shape, np.int64), np.array(t.stride(), np.int64), dim,
                       np.ascontiguousarray(keys[open_], dtype=np.int64), q)
    ruled = ruled.copy()
    with np.errstate(over="ignore"):  # (an infinite 2^p q: nothing refused)
        ruled[open_] |= bound[0][open_] >= q * 2.0**bound[1]
    return ruled


@njit(cache=True, nogil=True)
def _sample_slices(bits: np.ndarray, mant: int, shape: np.ndarray, strides: np.ndarray, dim: int, keys: np.ndarray,
                   q: np.ndarray) -> None:
    """q[t] *= the smallest lsb of `_slice_sample`'s values of slice t.select(dim, keys[t]) of a 4-d tensor (its
    memory's bits from its first value, `_lsb_key`'s layouts; element strides): the first _SAMPLE values along
    the last other dim, at every quarter of the two others. inf where a NaN is among them (no bound: nothing
    refused), and for values all zero."""
    other = np.array([d for d in range(4) if d != dim])
    n1, n2, n3 = shape[other[0]], shape[other[1]], shape[other[2]]
    s1, s2, s3 = strides[other[0]], strides[other[1]], strides[other[2]]
    step1, step2 = max(1, n1 // 4), max(1, n2 // 4)
    for t in range(keys.size):
        base, low = keys[t] * strides[dim], _INF_BITS
        for i1 in range(0, n1, step1):
            for i2 in range(0, n2, step2):
                at = base + i1 * s1 + i2 * s2
                for i3 in range(min(n3, _SAMPLE)):
                    low = min(low, _lsb_key(bits[at + i3 * s3], mant))
        q[t] *= np.inf if low < 0 else np.int64(low).view(np.float64)


def _batch_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """A matmul operand's element strides as a batch of matrices (a 2-d one: a batch of one, stride 0)."""
    return (0, *t.stride()) if t.dim() == 2 else t.stride()


def _strided_bits(t: torch.Tensor) -> tuple[np.ndarray, int] | None:
    """(the bits of t's memory from its first value to its last as a flat integer array, mantissa bits) for a
    non-empty float64/float32 CPU tensor, else None: one compiled signature per dtype whatever the layout (a
    transposed operand's too)."""
    if not t.is_cpu or t.dtype not in (torch.float64, torch.float32) or t.numel() == 0:
        return None
    # (a contiguous tensor's memory is its flat view, `fused.flat`: 7 against `fused.memory`'s 9-10 us)
    memory = fused.flat(t) if t.is_contiguous() else fused.memory(t, fused.span(t.shape, t.stride()))
    bits, mant, _, _ = fused._layout(memory)
    return bits, mant


def _cert_matmul(args: tuple, kwargs: dict, outs: Sequence, e: Bound | None, i: int, pos: torch.Tensor,
                 held: np.ndarray | None = None) -> torch.Tensor | None:
    return _certify_lines(args[0], args[1], None, e, outs[0], pos, held)


def _cert_dot(args: tuple, kwargs: dict, outs: Sequence, e: Bound | None, i: int,
              pos: torch.Tensor) -> torch.Tensor | None:
    a, b = args[0], args[1]
    if a.numel() == 0:
        return None
    return _certify(float(lsb(a).amin() * lsb(b).amin()), e, a.numel(), outs[0], pos)


def _cert_mv(args: tuple, kwargs: dict, outs: Sequence, e: Bound | None, i: int,
             pos: torch.Tensor) -> torch.Tensor | None:
    a, x = args[0], args[1]
    if a.shape[1] == 0:
        return None
    q = _per_key(pos.cpu().numpy(), lambda u: _slices_min_lsb(a, u)) * float(lsb(x).amin())
    return _certify(q, e, a.shape[1], outs[0], pos)


def _cert_addmm(args: tuple, kwargs: dict, outs: Sequence, e: Bound | None, i: int, pos: torch.Tensor,
                held: np.ndarray | None = None) -> torch.Tensor | None:
    kw = _bind(aten.addmm.default, args, kwargs)
    bias, a, b = kw["self"], kw["mat1"], kw["mat2"]
    if kw["alpha"] != 1 or kw["beta"] != 1 or a.shape[1] == 0:  # scaled terms are not multiples of q
        return None
    shape = outs[0].shape
    p = pos.cpu().numpy()
    if bias.dim() == 1:  # (a linear layer's bias, one per column)
        addend = _lsb_np(bias.expand(shape[1]))[p % shape[1]]
    else:
        r, c = _coords(p, shape)
        addend = _lsb_np(bias.expand(shape)[_t(r), _t(c)])
    return _certify_lines(a, b, addend, e, outs[0], pos, held)


_SAMPLE = 16  # values per line whose lsb bound the line's grain from above


def _certify_lines(a: torch.Tensor, b: torch.Tensor, addend: np.ndarray | None, e: Bound | None, out: torch.Tensor,
                   pos: torch.Tensor, held: np.ndarray | None) -> torch.Tensor | None:
    """`_certify` for a @ b, (M, K) @ (K, N) or batched (B, M, K) @ (B, K, N), plus an addend of grain `addend` at
    each position, at flat positions `pos` of the output `out`, in one compiled pass (`_line_certificates`): the
    grain min_lsb(a's row) min_lsb(b's column), at most the addend's, each line's sample and whole read at most once,
    in place through the operands' strides (off the CPU, the asked positions' lines gathered first,
    `_position_lines`). Two rules refuse a position before its lines are read in full. Its value (`held`, the
    device's unrounded v there, if given): a certified sum is exact, so its lowest set bit bounds q from above
    (`_ruled_out`'s rule). Then the first _SAMPLE values of its two lines, whose lowest lsb bound the lines' from
    above: the test is monotone in q, so what fails with the samples' grain fails with the true one. The answer
    is the true grains' everywhere. (On float32-grid values of all magnitudes, as in an MLP or GPT-2, almost every
    position is refused: reading 256-value lines whole cost 1.9 ms of GPT-2-tiny d_model 256's step; the rules as
    separate passes, and a bmm's lines gathered as a matmul's, ~35 ms of the GPT-2 scale model's ~110 ms trainer
    step.)"""
    k = a.shape[-1]
    bound = _sum_bound(e, k, out)
    if bound is None:
        return None
    s_upper, p, tiny = bound
    at = pos.cpu().numpy()
    n = at.size
    for name, x in (("bounds", s_upper), ("values", held), ("addend grains", addend)):
        if x is not None and x.shape != (n,):  # (the kernel reads them by index, unchecked)
            raise ValueError(f"{n} positions for {x.size} {name}")
    shape = out.shape if out.dim() == 3 else (1, *out.shape)
    if n and (at.min() < 0 or at.max() >= math.prod(shape)):
        raise ValueError(f"a position outside the {tuple(out.shape)} output")
    a, b = a.detach(), b.detach()
    if not (a.is_cpu and b.is_cpu):
        a, b, at, shape = _position_lines(a, b, at, shape)
    lines = _strided_bits(a), _strided_bits(b)
    if None in lines:
        return None
    values, vm = (_NO_VALUES, 52) if held is None else fused._layout(np.ascontiguousarray(held))[:2]
    (abits, am), (bbits, bm) = lines
    ok = np.empty(n, np.bool_)
    _line_certificates(values, vm, abits, am, *_batch_strides(a), bbits, bm, *_batch_strides(b), at, *shape, k,
                       min(k, _SAMPLE), _NO_GRAINS if addend is None else addend, s_upper, 2.0**p, tiny, ok)
    return torch.from_numpy(ok).to(pos.device)


def _position_lines(a: torch.Tensor, b: torch.Tensor, pos: np.ndarray,
                    shape: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, np.ndarray, tuple[int, int, int]]:
    """(a', b', positions, output shape) of the same certificates over the positions' own lines only, on the CPU:
    row t of a' (1, T, K) and column t of b' (1, K, T) are position t's, asked at (0, t, t). (The whole operands
    copied from a device at every call would cost more than the certificate: GPT-2's output layer is 154 MB.)"""
    i, r, c = (torch.from_numpy(x).to(a.device) for x in _coords(pos, shape))
    a3, b3 = (t if t.dim() == 3 else t[None] for t in (a, b))
    a3, b3 = a3.expand(shape[0], *a3.shape[1:]), b3.expand(shape[0], *b3.shape[1:])  # (a batch of one broadcasts)
    t = np.arange(pos.size)
    return a3[i, r][None].cpu(), b3[i, :, c].T[None].cpu(), t * pos.size + t, (1, pos.size, pos.size)


_NO_VALUES = np.zeros(0, np.int64)
_NO_GRAINS = np.zeros(0)


@njit(cache=True, nogil=True)
def _line_certificates(held_bits: np.ndarray, hm: int, abits: np.ndarray, am: int, an: int, ar: int, ak: int,
                       bbits: np.ndarray, bm: int, bn: int, bk: int, bc: int, pos: np.ndarray, batches: int, m: int,
                       n: int, k: int, sample: int, addend: np.ndarray, s_upper: np.ndarray, top: float, tiny: float,
                       ok: np.ndarray) -> None:
    """ok[t] = s_upper[t] < top q and q >= tiny, q the grain at flat position pos[t] = (i, r, c) of the (batches, m,
    n) output: min lsb of a[i, r, :] times min lsb of b[i, :, c] over k terms, at most addend[t] (no addend: empty).
    a's and b's memory flat (`_lsb_key`'s layouts) with strides (an, ar, ak) and (bn, bk, bc). False without reading
    the lines where held_bits[t] (the value there; empty: none) refuses (`_value_refuses`), or the grain of the
    lines' first `sample` values does (s_upper[t] >= top q_sample); each line's minima kept for the positions that
    share it. A NaN among the values read gives no grain, and no certificate."""
    sample_a, sample_b = np.full(batches * m, _UNREAD, np.int64), np.full(batches * n, _UNREAD, np.int64)
    full_a, full_b = sample_a.copy(), sample_b.copy()
    for t in range(pos.size):
        ok[t] = False
        s = s_upper[t]
        if held_bits.size and _value_refuses(held_bits[t], hm, s, top):
            continue
        i, rc = divmod(pos[t], m * n)
        r, c = divmod(rc, n)
        ka, kb, at, bt = i * m + r, i * n + c, i * an + r * ar, i * bn + c * bc
        extra = addend[t] if addend.size else np.inf
        if sample < k and s >= top * _grain_of(_kept_min_key(sample_a, ka, abits, at, ak, sample, am),
                                               _kept_min_key(sample_b, kb, bbits, bt, bk, sample, bm), extra):
            continue
        q = _grain_of(_kept_min_key(full_a, ka, abits, at, ak, k, am), _kept_min_key(full_b, kb, bbits, bt, bk, k, bm),
                      extra)
        ok[t] = s < q * top and q >= tiny


_UNREAD = -2  # a line's minimum not yet read (no key is: -1 is a NaN's)


@njit(cache=True, nogil=True, inline="always")
def _kept_min_key(kept: np.ndarray, line: int, bits: np.ndarray, start: int, step: int, count: int, mant: int) -> int:
    """`_strided_min_key` of a line, read at its first asking and kept in kept[line]."""
    if kept[line] == _UNREAD:
        kept[line] = _strided_min_key(bits, start, step, count, mant)
    return kept[line]


@njit(cache=True, nogil=True, inline="always")
def _strided_min_key(bits: np.ndarray, start: int, step: int, count: int, mant: int) -> int:
    """The smallest `_lsb_key` of `count` values of bits from `start`, `step` apart (-1 where one is NaN)."""
    low = _INF_BITS
    for j in range(count):
        low = min(low, _lsb_key(bits[start + j * step], mant))
    return low


@njit(cache=True, nogil=True, inline="always")
def _grain_of(key_a: int, key_b: int, addend: float) -> float:
    """The product of two lines' lsb (`_lsb_key`s), at most the addend's grain (NaN where any is NaN)."""
    q = _key_lsb(key_a) * _key_lsb(key_b)
    return np.nan if np.isnan(q) or np.isnan(addend) else min(q, addend)


def _certify_sampled(q: np.ndarray, full: Callable[[np.ndarray], np.ndarray], e: Bound | None, k: int,
                     out: torch.Tensor, pos: torch.Tensor) -> torch.Tensor | None:
    """`_certify` from q, each position's grain bounded from above by a sample of its lines: the test is
    monotone in q, so only the positions q certifies can be certified, and `full(their indices)` gives
    their true grains. The same result as the true grains everywhere."""
    maybe = _certified(q, e, k, out)
    if maybe is None:
        return None
    sel = np.flatnonzero(maybe)
    if sel.size:
        q[sel] = full(sel)
    return _certify(q, e, k, out, pos)


def _lsb_bits(t: torch.Tensor) -> tuple[np.ndarray, int] | None:
    """(t's bit patterns as integers, mantissa bits) for a 2-d float64/float32 CPU tensor, or None (the torch
    path of `_min_lsb` takes it)."""
    if not t.is_cpu or t.dim() != 2 or t.dtype not in (torch.float64, torch.float32):
        return None
    bits, mant, _, _ = fused._layout(t.detach().numpy())
    return bits, mant


def _image_channel(pos: torch.Tensor, shape: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(image, channel) of flat positions in an (N, C, ...) tensor."""
    inner = math.prod(shape[2:])
    p = pos.cpu().numpy()
    return p // (shape[1] * inner), (p // inner) % shape[1]


# Convolutions whose sliced operands hold more values than this (in all) sample the slices first
# (`_certify_slices`); below, the extra pass costs more Python than the reading it saves.
_SAMPLED_SLICES = 1 << 18


def _slice_sample(t: torch.Tensor, dim: int) -> torch.Tensor:
    """(t.shape[dim], ...): values spread over each slice t.select(dim, k), a strided view: the first _SAMPLE
    values of up to 5 lines along each of the slice's other dims. A slice's minimum lsb is at most theirs.
    (The first line's values alone often were all zeros, as ReLU leaves a row, which bound nothing: at
    resnet-tiny width 32 they let 6-41 of a weight gradient's ~100 positions through to reading their
    channels in full, ~7 ms a step, to certify none. Spread, none passed.)"""
    v = t.detach().movedim(dim, 0)
    spread = tuple(slice(None, None, max(1, n // 4)) for n in v.shape[1:-1])
    return v[(slice(None), *spread, slice(0, _SAMPLE))]


def _certify_slices(factors: Sequence[tuple[torch.Tensor, int, np.ndarray]], extra: np.ndarray | None,
                    e: Bound | None, k: int, out: torch.Tensor, pos: torch.Tensor) -> torch.Tensor | None:
    """`_certify` for sums whose terms' grain at each position is the product over `factors` (t, dim, keys) of
    the smallest lsb over t.select(dim, keys[position]), and at most `extra` (per position). As
    `_certify_lines` does for matmuls: on large operands the slices' samples first (an upper bound of the
    grain, and the test is monotone in it), then the slices in full only at the positions that bound
    certifies (on the weight gradients of a 32 x 32 batch of 32 channels, none: reading every asked
    channel cost 6 ms a call). The result is the same."""
    def grain(sel: np.ndarray, sample: bool) -> np.ndarray:
        q = np.ones(sel.size)
        for t, dim, keys in factors:
            src, d = (_slice_sample(t, dim), 0) if sample else (t, dim)
            q *= _per_key(keys[sel], lambda u, src=src, d=d: _slices_min_lsb(src, u, d))
        return q if extra is None else np.minimum(q, extra[sel])

    everything = np.arange(pos.numel())
    if sum(t.numel() for t, _, _ in factors) <= _SAMPLED_SLICES:
        return _certify(grain(everything, False), e, k, out, pos)
    return _certify_sampled(grain(everything, True), lambda sel: grain(sel, False), e, k, out, pos)


# A convolution's certificate grain at each position is the product over its factors (t, dim, keys) of the smallest
# lsb over t.select(dim, keys[position]), at most that of an addend (a bias, indexed by the output channels); with
# the term count k: (factors, (bias, channels) or None, k), or None where no certificate applies. The certifier
# reads the slices (`_certify_slices`), the rule-out of `_sampled_out` samples of them.
Factors = tuple[list[tuple[torch.Tensor, int, np.ndarray]], "tuple[torch.Tensor, np.ndarray] | None", int]


def _convolution_factors(args: tuple, kwargs: dict, shape: Sequence[int], i: int, pos: torch.Tensor) -> Factors | None:
    kw = _bind(aten.convolution.default, args, kwargs)
    try:
        x, w, *_ = _conv_geometry(aten.convolution.default, kw)
    except ResolveError:
        return None
    if x.numel() == 0 or w.numel() == 0:
        return None
    # out[n, co] sums x[n] * w[co] terms (plus bias[co]): grain qin[n] * qw[co]
    n, co = _image_channel(pos, shape)
    return [(x, 0, n), (w, 0, co)], None if kw["bias"] is None else (kw["bias"], co), _conv_terms(kw, 0)


def _conv_terms(kw: dict, i: int) -> int:
    """The term count k a convolution's certificate takes for output i (of aten.convolution: i = 0): the forward's
    channels times taps of one filter; grad_input's output channels of a group times taps; grad_weight's and
    grad_bias's images times output positions."""
    w = kw["weight"].shape  # (from the shapes: indexing a tensor costs ~3 us, a certificate's call makes a few)
    if "grad_output" not in kw:
        return math.prod(w[1:])
    if i == 0:
        return (w[0] // int(kw["groups"])) * math.prod(w[2:])
    g = kw["grad_output"].shape
    return g[0] * math.prod(g[2:])


def _convolution_backward_factors(args: tuple, kwargs: dict, shape: Sequence[int], i: int,
                                  pos: torch.Tensor) -> Factors | None:
    op = aten.convolution_backward.default
    kw = _bind(op, args, kwargs)
    try:
        x, w, *_, groups = _conv_geometry(op, kw)
    except ResolveError:
        return None
    g = kw["grad_output"]
    g = g.unsqueeze(2) if g.dim() == 3 else g
    if x.numel() == 0 or w.numel() == 0 or g.numel() == 0 or i > 2:
        return None
    c_out, c_g = w.shape[:2]
    k = _conv_terms(kw, i)  # grad_input: (co in the group, kernel tap); grad_weight and grad_bias: (n, output position)
    if i == 0:  # grad_input[n, ci]: grad[n] * w[:, ci mod Cg]
        n, ci = _image_channel(pos, shape)
        return [(g, 0, n), (w, 1, ci % c_g)], None, k
    if i == 1:  # grad_weight[co, cl]: grad[:, co] * x[:, group(co) * Cg + cl]
        co, cl = _image_channel(pos, shape)
        return [(g, 1, co), (x, 1, (co // (c_out // groups)) * c_g + cl)], None, k
    return [(g, 1, pos.cpu().numpy())], None, k  # grad_bias: grad[:, co]


_FACTORS: dict[Any, Callable[..., "Factors | None"]] = {
    aten.convolution.default: _convolution_factors,
    aten.convolution_backward.default: _convolution_backward_factors,
}


def _cert_slices(op: Any) -> Certifier:
    def certify(args: tuple, kwargs: dict, outs: Sequence, e: Bound | None, i: int,
                pos: torch.Tensor) -> torch.Tensor | None:
        if i >= len(outs) or outs[i] is None:
            return None
        found = _FACTORS[op](args, kwargs, outs[i].shape, i, pos)
        if found is None:
            return None
        factors, addend, k = found
        extra = None if addend is None else _lsb_np(addend[0])[addend[1]]
        return _certify_slices(factors, extra, e, k, outs[i], pos)

    return certify


def _cert_reduce(op: Any, mean: bool) -> Certifier:
    def certify(args: tuple, kwargs: dict, outs: Sequence, e: Bound | None, i: int,
                pos: torch.Tensor) -> torch.Tensor | None:
        x, keep, red = _reduction(op, args, kwargs)
        n = math.prod(x.shape[d] for d in red)
        # mean: with n = 2^k the division (or the multiplication by 1/n, or dividing each term first) is
        # exact whenever q / n does not underflow, which _certify checks; other n would round.
        if x.numel() == 0 or (mean and n & (n - 1)):
            return None
        if not keep:  # one output: the whole tensor is its slice
            q = float(lsb(x).amin())
        elif len(keep) == 1 and keep[0]:  # (batch norm's channels: the asked slices only, not a permuted copy)
            q = _per_key(pos.cpu().numpy(), lambda u: _slices_min_lsb(x, u, keep[0]))
        else:  # position p reduces line p of x with the kept dims first, the reduced ones flattened
            lines = x.permute(*keep, *red).reshape(-1, n)
            q = _per_key(pos.cpu().numpy(), lambda u: _min_lsb(lines, u, 0))
        return _certify(q, e, n, outs[0], pos, n if mean else 1)

    return certify


def _plane_grain(src: torch.Tensor, out: torch.Tensor, pos: torch.Tensor) -> np.ndarray:
    """Per position of `out` (planes like src's), the smallest lsb over src's plane."""
    planes = _planes(src)
    return _per_key(pos.cpu().numpy() // (out.shape[-2] * out.shape[-1]), lambda u: _slices_min_lsb(planes, u))


def exact_pool_divisor(kw: dict) -> int:
    """An average pooling's divisor where it is one power of two for every window (full windows, or an
    override), so that dividing by it is exact; else 0."""
    kernel, _, padding, ceil = _pool_params(kw)
    div = kw["divisor_override"] or (kernel[0] * kernel[1] if padding == (0, 0) and not ceil else 0)
    return div if div > 0 and not div & (div - 1) else 0


def _cert_avg_pool(op: Any) -> Certifier:
    def certify(args: tuple, kwargs: dict, outs: Sequence, e: Bound | None, i: int,
                pos: torch.Tensor) -> torch.Tensor | None:
        kw = _bind(op, args, kwargs)
        kernel = _pool_params(kw)[0]
        div = exact_pool_divisor(kw)
        src = kw["grad_output"] if op is aten.avg_pool2d_backward.default else kw["self"]
        if not div or src.numel() == 0:
            return None
        # terms are src / div over at most kernel-area windows; the bound is gamma_(area+1) of the op on |src|
        q = _plane_grain(src, outs[0], pos)
        return _certify(q, e, kernel[0] * kernel[1], outs[0], pos, div)

    return certify


def _cert_max_pool2d_backward(args: tuple, kwargs: dict, outs: Sequence, e: Bound | None, i: int,
                              pos: torch.Tensor) -> torch.Tensor | None:
    kw = _bind(aten.max_pool2d_with_indices_backward.default, args, kwargs)
    (k0, k1), (s0, s1), _, _ = _pool_params(kw)
    d0, d1 = _pair(kw["dilation"])
    if s0 > d0 * (k0 - 1) and s1 > d1 * (k1 - 1):
        # windows do not overlap: each input element receives at most one gradient, copied exactly
        return _all(pos)
    g = kw["grad_output"]
    if g.numel() == 0:
        return None
    return _certify(_plane_grain(g, outs[0], pos), e, k0 * k1, outs[0], pos)


def _cert_embedding_dense_backward(args: tuple, kwargs: dict, outs: Sequence, e: Bound | None, i: int,
                                   pos: torch.Tensor) -> torch.Tensor | None:
    kw = _bind(aten.embedding_dense_backward.default, args, kwargs)
    g, ind = kw["grad_output"], kw["indices"].reshape(-1)
    d = outs[0].shape[-1]
    p = pos.cpu().numpy()
    row, col = p // d, p % d
    counts = torch.bincount(ind, minlength=int(kw["num_weights"])).cpu().numpy()[row]
    # a row gathered at most once is a copy (or zero; padding_idx's row is zero): exact, also when scaled
    single = (counts <= 1) | (row == kw["padding_idx"])
    if not (kw["scale_grad_by_freq"] or g.numel() == 0):
        g2 = g.reshape(-1, g.shape[-1])
        cert = _certified(_per_key(col, lambda u: _slices_min_lsb(g2, u, 1)), e, ind.numel(), outs[0])
        single = single if cert is None else single | cert
    return torch.from_numpy(single).to(pos.device)


def _cert_nll_loss_forward(args: tuple, kwargs: dict, outs: Sequence, e: Bound | None, i: int,
                           pos: torch.Tensor) -> torch.Tensor | None:
    kw = _bind(aten.nll_loss_forward.default, args, kwargs)
    if kw["weight"] is not None or (i == 0 and kw["reduction"] != 0):
        return None
    # unweighted: each loss element is -x (a negation), total_weight a count of targets (an integer)
    return _all(pos)


def _cert_nll_loss_backward(args: tuple, kwargs: dict, outs: Sequence, e: Bound | None, i: int,
                            pos: torch.Tensor) -> torch.Tensor | None:
    kw = _bind(aten.nll_loss_backward.default, args, kwargs)
    if kw["weight"] is not None:
        return None
    if kw["reduction"] != 1:  # -g or 0: exact
        return _all(pos)
    g, total = kw["grad_output"].reshape(-1), kw["total_weight"].reshape(-1)
    # mean: -g / total is exact when total is a power of two and the quotient does not underflow
    tiny = 2.0**-1074 if outs[0].dtype == torch.float64 else 2.0**-149
    tot = float(total[0])
    ok = tot > 0 and math.frexp(tot)[0] == 0.5 and float(lsb(g).amin()) / tot >= tiny
    return _all(pos) if ok else torch.zeros(len(pos), dtype=torch.bool, device=pos.device)


CERTIFIERS: dict[Any, Certifier] = {
    aten.mm.default: _cert_matmul,
    aten.bmm.default: _cert_matmul,
    aten.dot.default: _cert_dot,
    aten.mv.default: _cert_mv,
    aten.addmm.default: _cert_addmm,
    aten.convolution.default: _cert_slices(aten.convolution.default),
    aten.convolution_backward.default: _cert_slices(aten.convolution_backward.default),
    aten.sum.default: _cert_reduce(aten.sum.default, mean=False),
    aten.sum.dim_IntList: _cert_reduce(aten.sum.dim_IntList, mean=False),
    aten.mean.default: _cert_reduce(aten.mean.default, mean=True),
    aten.mean.dim: _cert_reduce(aten.mean.dim, mean=True),
    aten.avg_pool2d.default: _cert_avg_pool(aten.avg_pool2d.default),
    aten.avg_pool2d_backward.default: _cert_avg_pool(aten.avg_pool2d_backward.default),
    aten.max_pool2d_with_indices_backward.default: _cert_max_pool2d_backward,
    aten.embedding_dense_backward.default: _cert_embedding_dense_backward,
    aten.nll_loss_forward.default: _cert_nll_loss_forward,
    aten.nll_loss_backward.default: _cert_nll_loss_backward,
}
# The certifiers that read the output's own values in their compiled pass (`certify` hands them `held`)
_LINE_CERTIFIED = frozenset({aten.mm.default, aten.bmm.default, aten.addmm.default})


def resolver_for(op: Any) -> Resolver:
    """The exact resolver of `op` (no positions: an empty result); ResolveError naming the op when there is none."""
    resolver = RESOLVERS.get(op)
    if resolver is None:
        raise ResolveError(f"no exact resolver for {op}: the `exact` policy cannot make its output the correctly "
                           "rounded exact value. Decompose it into resolvable primitives (vtrain.ops) or use "
                           "resolution = \"log\"")

    def resolve(args: tuple, kwargs: dict, i: int, pos: np.ndarray, bits: int) -> np.ndarray:
        return np.zeros(0) if len(pos) == 0 else resolver(args, kwargs, i, np.asarray(pos, dtype=np.int64), bits)

    return resolve
