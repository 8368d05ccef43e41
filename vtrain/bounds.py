"""A-priori error bounds for the device-dependent ops (DESIGN.md §1.3, policy `bound`).

For each class 3 op, `E` bounds |computed - exact| elementwise for *any* summation order on any IEEE
device (with or without FMA), given inputs that are exact (grid values). Standard forward error analysis
with u the unit roundoff of the work dtype (2^-53 for float64, 2^-24 for float32) and
gamma_n = n*u / (1 - n*u):

- sums of n terms: gamma_(n-1) * sum|x_k|; means add one division;
- dot products, matmuls and convolutions of length K: gamma_K * (|A| |B|), computed as the same op on
  absolute values (one extra matmul/conv, in float32 for float64 work, see `abs_bounds`: tighter than the
  Cauchy-Schwarz norm bound, which relu-sparse operands make orders of magnitude looser);
- softmax, log-softmax and their backward, the NLL loss: composed from the sum bound and the
  transcendental bound, written out per op below;
- transcendental functions (exp, exp2, log, log2, log10, tanh, sigmoid, expm1, log1p, pow, rsqrt, erf, sin,
  cos, tan, asin, acos, atan, sinh, cosh, asinh, acosh, atanh, atan2, lgamma): TRANSCENDENTAL_ULPS ulps of the
  work dtype (sigmoid also the dtype's smallest normal, for a device whose exp(-x) overflows); erfc and erfinv
  ERFC_ULPS ulps and as many units of the floor; digamma DIGAMMA_ULPS ulps of its terms' magnitudes
  (`_digamma`); trigamma TRIGAMMA_RELATIVE; GELU and its backward a few of those ulps of (|y| + |x|), see below;
- embedding backward (a scatter-add of up to n gradient rows into one weight row): gamma_n sum|g|.

We assume every libm involved is accurate to 4 ulps; glibc, CUDA and MKL VML all document <= 2 ulps for these
functions in double precision (<= 3 for CUDA's asinh and acosh; sin, cos and tan over their whole range: their
arguments are reduced exactly). erfc is the exception: glibc's table (sysdeps/x86_64/fpu/libm-test-ulps) and
CUDA's list 5 ulps, and in the subnormal range those are units of the smallest subnormal, beyond float32 work's
one-unit floor; hence ERFC_ULPS, twice that as for the others, in both terms. erfinv takes the same: torch computes
it itself on the CPU (within an ulp, measured), CUDA's list gives 5 ulps, and in the subnormal tail it errs by units
too.
(Fused elementwise ops need no bound: vtrain.ops decomposes them into IEEE primitives.)

On a small step E's per-call cost matters more than its arithmetic: the log-softmax bounds run their
elementwise part as one numba pass (vtrain.fused), the reduced NLL loss bound runs in Python floats, each
with the same IEEE operations in the same order as the torch expressions they stand in for (which remain
the path for everything else; tests/numerics/test_num_bounds.py compares the bits). The recording trainer
computes the softmax family's E inside its rounding pass instead (`ROWS`), the softmax backward's row sums
there in the CPU device's own order (any order is within the slack below).

Every E is inflated by (1 + 2*gamma_K + 2^-20) so that computing E itself in floating point (which can
undershoot the exact sum of absolute values by gamma_K relative) still leaves an upper bound, and gets an
absolute floor of K units of `_floor_unit` for underflow (float64's smallest normal, float32's smallest
subnormal). The trainer and the auditor
compute E from identical grid inputs; the slack also absorbs that their E may differ in the last bits.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Sequence

import numpy as np
import torch

from vtrain.errors import UnsupportedOpError

aten = torch.ops.aten

TRANSCENDENTAL_ULPS = 4.0
ERFC_ULPS = 10.0
DIGAMMA_ULPS = 32.0
# torch computes trigamma (polygamma(1, x)) itself, on the CPU and CUDA alike, with an asymptotic series cut short:
# measured within 4.9e-10 of the exact value relative, from 2^-100 to 2^100 and around its worst (x ~ 1.13), far
# beyond a library's few ulps. Its band is this, or TRANSCENDENTAL_ULPS ulps where the work dtype's are wider.
TRIGAMMA_RELATIVE = 2.0**-28

Bound = Callable[[tuple, dict, Sequence["torch.Tensor | None"]], list["torch.Tensor | None"]]


def unit_roundoff(dtype: torch.dtype) -> float:
    if dtype == torch.float64:
        return 2.0**-53
    if dtype == torch.float32:
        return 2.0**-24
    raise TypeError(f"no error bounds for dtype {dtype}")


def _tiny(dtype: torch.dtype) -> float:
    return 2.0**-1074 if dtype == torch.float64 else 2.0**-149


def _floor_unit(dtype: torch.dtype) -> float:
    """E's absolute floor per term (for underflow): float64's smallest normal, 2^-1022, rather than its
    smallest subnormal. Any multiple of the subnormal spacing bounds an underflow, and a subnormal E costs
    a microcode assist in every multiplication that reads it (40x a normal one: relu networks' zero
    sums, whose E is the floor alone, made up a third of a small weight gradient's filter pass). Float32
    work keeps 2^-149: its smallest normal lies too near the small grid values' spacing."""
    return 2.0**-1022 if dtype == torch.float64 else 2.0**-149


def gamma(n: int, u: float) -> float:
    """gamma_n = n u / (1 - n u); infinite once n u >= 1 (no useful bound)."""
    nu = n * u
    return math.inf if nu >= 1 else nu / (1 - nu)


def _finish_factors(n: int, u: float, dtype: torch.dtype) -> tuple[float, float]:
    """(inflation, floor) of `_finish`: E becomes E * inflation + floor."""
    return 1 + 2 * gamma(n, u) + 2.0**-20, max(n, 1) * _floor_unit(dtype)


def _finish(e: Any, n: int, u: float, dtype: torch.dtype) -> Any:
    # In place: every caller hands over a fresh temporary (same operations, same bits, no new buffers), a
    # tensor or a numpy array of `dtype` (a few gathered positions, or a float64 reduction's outputs: numpy
    # rounds c and floor to a float32 array's dtype as torch does).
    c, floor = _finish_factors(n, u, dtype)
    if isinstance(e, np.ndarray):
        e *= c
        e += floor
        return e
    return e.mul_(c).add_(floor)


def _abs(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.abs()
    return abs(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x


def _prod(xs: Any) -> int:
    out = 1
    for v in xs:
        out *= int(v)
    return out


# -- matmul family and convolutions -----------------------------------------------------------------


# Float32 overflows past 2^128: operands whose products summed K times stay below this take the float32 path.
_F32_SAFE = 2.0**120
# Ops with fewer products than this (outputs times their sums' lengths) take the float64 path: float32
# saves on the op's work, not on its operands' size, and below this numba's and the casts' per-call cost
# exceeds the saving. Measured (us, float32 against float64 path): the cnn example's second convolution,
# 2.4 M products, 133 / 261, its backward 319 / 490, the first convolution's backward, 0.16 M, 124 / 64;
# a 32x64 @ 64x64 addmm, 0.14 M, 35 / 19; a 256x10 @ 10x1024 mm, 2.6 M, 200 / 227.
_F32_MIN_WORK = 1 << 20
_F32_MAX_TERMS = 1 << 20


def abs_bounds(func: Any, args: tuple, kwargs: dict, ks: Sequence[int], outs: Sequence[torch.Tensor | None]) -> list:
    """E for every output of `func` (`outs`: the op's outputs, None where not computed), bilinear in its
    tensor operands, output j a sum of at most ks[j] products: gamma_k times `func` on the operands'
    absolute values (an upper bound of each output's exact sum of |terms|), finished as `_finish` does, in
    the work dtype.

    Float64 work computes the absolute sums in float32 (a matmul or convolution ~2.3x faster) and inflates
    them to stay upper bounds: rounding |x| to float32 loses at most 2^-24 of it relative, or 2^-150
    absolute below the normal range; float32 products and sums of non-negative terms undershoot the exact
    sum by at most gamma_k relative plus 2^-150 per subnormal product. So (1 + gamma32_(k+2)) (1 + 2^-21)
    times the float32 result plus (k + 1) 2^-148 (1 + the operands' largest magnitudes) bounds every exact
    sum. Operands whose products could overflow float32 (or that hold inf or NaN) take the float64 path;
    float32 work always does. Each output is finished in one pass: its factors, multiplied out in Python
    (a few roundings of 2^-53), stay inside `_finish`'s 2^-20 of slack.
    """
    from vtrain import fused  # noqa: PLC0415 (numba's import: only processes that round pay it)

    dtype = next(o.dtype for o in outs if o is not None)
    u = unit_roundoff(dtype)
    abskw = {key: _abs(val) for key, val in kwargs.items()} if kwargs else kwargs
    scale, floor = 1.0, 0.0
    out = None
    if dtype is torch.float64 and sum(o.numel() * k for o, k in zip(outs, ks) if o is not None) >= _F32_MIN_WORK:
        prepared = [fused.abs32(a) if isinstance(a, torch.Tensor) else (_abs(a), 0.0) for a in args]
        largest = max(m for _, m in prepared)
        k = max(ks)
        # (sums longer than _F32_MAX_TERMS: float32's gamma would inflate E by more than 7 %, and past 2^24
        # terms make it infinite; vtrain.valuecode also counts on two devices' bounds differing by < 25 %)
        if (k + 1) * max(largest, 1.0) ** 2 < _F32_SAFE and k < _F32_MAX_TERMS:  # also False for inf and NaN
            out = func(*[a for a, _ in prepared], **abskw)
            scale = (1 + gamma(k + 2, 2.0**-24)) * (1 + 2.0**-21)
            tensors = sum(isinstance(a, torch.Tensor) for a in args)
            floor = (k + 1) * 2.0**-148 * (1 + tensors * largest)
    if out is None:
        out = func(*[a.abs() if isinstance(a, torch.Tensor) else _abs(a) for a in args], **abskw)
    if isinstance(out, torch.Tensor):
        k = ks[0]
        g = gamma(k, u)
        if dtype is not torch.float64:
            return [_finish(out.mul_(g), k, u, dtype)]
        c = 1 + 2 * g + 2.0**-20
        return [fused.affine64(out, scale * g * c, floor * g * c + max(k, 1) * _floor_unit(dtype))]
    result = []
    for o, k in zip(out, ks):
        if o is None:
            result.append(None)
            continue
        g = gamma(k, u)
        c = 1 + 2 * g + 2.0**-20
        result.append(fused.affine64(o, scale * g * c, floor * g * c + max(k, 1) * _floor_unit(dtype))
                      if dtype == torch.float64 else _finish(o.mul_(g), k, u, dtype))
    return result


def _bilinear(func: Any, k_of: Callable[[tuple], int], terms: int = 0) -> Bound:
    """The op itself on absolute values, times gamma of the dot length (+ extra roundings)."""

    def bound(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        return abs_bounds(func, args, kwargs, [k_of(args) + terms], outs[:1])

    return bound


# The auditor needs E only at the logged positions: for matmuls, sum_k |a_ik b_kj| gathered at those
# positions costs K per entry instead of a second matmul. (The trainer needs E wherever a value lies near a
# boundary: for large matmuls and convolutions vtrain.prefilter finds those from norms of the operands'
# lines or windows, and gathers E there too.)

# (args, kwargs, outputs, i, flat positions of output i) -> E of output i there
PositionBound = Callable[[tuple, dict, Sequence["torch.Tensor | None"], int, torch.Tensor], torch.Tensor]
_GATHER_ELEMENTS = 1 << 22  # memory cap (elements) of one gathered chunk


def _mm_operands(func: Any, args: tuple, kwargs: dict) -> tuple:
    """(bias or None, beta, alpha, A as (B, M, K), B as (B, K, N), extra roundings)."""
    if func is aten.addmm.default:
        bias, a, b = args[:3]
        return bias, kwargs.get("beta", 1), kwargs.get("alpha", 1), a.unsqueeze(0), b.unsqueeze(0), 3
    if func is aten.bmm.default:
        return None, 1, 1, args[0], args[1], 0
    return None, 1, 1, args[0].unsqueeze(0), args[1].unsqueeze(0), 0


def _matmul_at(func: Any) -> PositionBound:
    def bound_at(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None], i: int,
                 pos: torch.Tensor) -> torch.Tensor:
        v = outs[0]
        bias, beta, alpha, a, b, terms = _mm_operands(func, args, kwargs)
        u, k = unit_roundoff(v.dtype), a.shape[-1] + terms
        m, n = a.shape[1], b.shape[2]
        batch, rem = pos // (m * n), pos % (m * n)
        i, j = rem // n, rem % n
        step = max(1, _GATHER_ELEMENTS // max(a.shape[-1], 1))
        absval = torch.zeros(pos.numel(), dtype=v.dtype, device=v.device)
        if alpha != 0:  # (alpha 0 and beta 0: torch skips that term, inf and NaN included, and so does E)
            absval = torch.cat([(a[batch[s:s + step], i[s:s + step], :].abs()
                                 * b[batch[s:s + step], :, j[s:s + step]].abs()).sum(-1)
                                for s in range(0, pos.numel(), step)]) * abs(alpha)
        if bias is not None and beta != 0:
            absval = absval + abs(beta) * bias.expand(v.shape)[i, j].abs()  # (addmm: v is (m, n))
        return _finish(gamma(k, u) * absval, k, u, v.dtype)

    return bound_at


def _conv_k(args: tuple) -> int:
    """The products an output element of aten.convolution sums at most: (Cin / groups) * kernel taps. A
    transposed convolution's weight is (Cin, Cout / groups, kernel...), so its Cin / groups is
    weight.shape[0] / groups (counting weight.shape[1] there made E too small wherever Cin > Cout)."""
    weight = args[1]
    if len(args) > 6 and args[6]:
        return weight.shape[0] // (args[8] if len(args) > 8 else 1) * _prod(weight.shape[2:])
    return _prod(weight.shape[1:])


def _convolution_backward_ks(args: tuple) -> tuple[int, int, int]:
    """The term counts E takes for grad_input, grad_weight and grad_bias."""
    grad, weight = args[0], args[2]
    kernel = _prod(weight.shape[2:])
    k_weight = grad.shape[0] * _prod(grad.shape[2:])  # N * output positions
    return max(weight.shape[0], weight.shape[1]) * kernel, k_weight, k_weight  # (grad_input: per element)


def _convolution_backward(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
    grad, x, weight = args[0], args[1], args[2]
    absvals = abs_bounds(aten.convolution_backward.default, (grad, x, weight, *args[3:]), {},
                         _convolution_backward_ks(args), outs)
    return [None if o is None else a for o, a in zip(outs, absvals)]


def _convolution_at(func: Any) -> PositionBound:
    def bound_at(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None], i: int,
                 pos: torch.Tensor) -> torch.Tensor:
        """E of output i at flat positions `pos`: its terms gathered as the exact resolution gathers them
        (vtrain.resolve), their absolute values summed in float64, with the full bound's term count (any
        order: see `_finish`). For the auditor's few entries, where the full bound is a second convolution
        over everything; the convolutions whose terms vtrain.resolve.abs_sums does not gather (transposed,
        3-d) take the full bound at `pos`."""
        # (resolve pulls in mpmath: only ops that gather pay)
        from vtrain.resolve import ResolveError, abs_sums  # noqa: PLC0415
        v = outs[i]
        try:
            s = torch.from_numpy(abs_sums(func, args, kwargs, i, pos.cpu().numpy()))
        except ResolveError:
            return BOUNDS[func](args, kwargs, outs)[i].expand(v.shape).reshape(-1)[pos]
        return convolution_e(func, args, i, s, v.dtype).to(v.device)

    return bound_at


def convolution_e(func: Any, args: tuple, i: int, sums: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """E of convolution output i from its positions' float64 sums of |terms| (`sums`, consumed), with the full
    bound's term count (a forward's bias is one more term; any order: see `_finish`)."""
    k = _conv_k(args) + 1 if func is aten.convolution.default else _convolution_backward_ks(args)[i]
    u = unit_roundoff(dtype)
    # (float32 work: rounding the float64 sum to float32 takes 2^-24 of _finish's 2^-20 slack)
    return _finish(sums.mul_(gamma(k, u)).to(dtype), k, u, dtype)


# -- reductions -------------------------------------------------------------------------------------


# Inputs from this size on sum |x| in one compiled pass (vtrain.fused.abs_sum), smaller ones by torch's abs and sum
_FUSED_SUM_ELEMENTS = 1 << 15


def _reduced_count(x: torch.Tensor, dim: Any) -> int:
    if dim is None or len(dim) == 0:
        return x.numel()
    return _prod(x.shape[d] for d in dim)


def _sum(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
    x = args[0]
    v = outs[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    n = _reduced_count(x, dim)
    u = unit_roundoff(v.dtype)
    dims = list(range(x.dim())) if not dim else list(dim)
    from vtrain import fused  # noqa: PLC0415 (numba's import: only processes that round pay it)
    s = fused.take_abs_sums(v)  # (the CPU device's sum computed them: vtrain.devices)
    if s is None and x.numel() >= _FUSED_SUM_ELEMENTS:
        s = fused.abs_sum(x, dims)
    if s is not None and _numpy_work(v):
        return [torch.from_numpy(_finish(s.reshape(-1) * gamma(n, u), n, u, v.dtype).reshape(v.shape))]
    # (float32 work: rounding the sums to float32 takes 2^-24 of _finish's slack)
    s = None if s is None else torch.from_numpy(s).to(v.dtype)
    if s is None:
        xa = x.abs() if x.dtype is v.dtype else x.to(v.dtype).abs_()
        s = xa.sum(dims, keepdim=keepdim) if x.dim() else xa
    return [_finish(s.reshape(v.shape).mul_(gamma(n, u)), n, u, v.dtype)]  # (s: a fresh temporary)


def _mean(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    n = _reduced_count(x, dim)
    (e,) = _sum(args, kwargs, outs)
    v = outs[0]
    u = unit_roundoff(v.dtype)
    if _numpy_work(v) and not e.requires_grad:  # (e records its gradient where x does, outside the dispatch)
        mean = e.numpy().reshape(-1) / max(n, 1)
        mean *= 1 + 2 * u
        mean += u * np.abs(v.numpy().reshape(-1))
        return [torch.from_numpy(mean.reshape(v.shape))]
    return [e / max(n, 1) * (1 + 2 * u) + u * v.abs()]


def _numpy_work(v: torch.Tensor) -> bool:
    """Whether a reduction's E over its few outputs v is worked out in numpy: float64 work on the CPU, where
    numpy's operations are torch's, the same IEEE operations in float64 in the same order (the same bits, NaN
    payloads aside: of two NaN addends numpy keeps the left's, torch the right's), at ~1 us a call against
    torch's ~5-10 us in a training step (docs/benchmarks.md, session 33)."""
    return v.dtype is torch.float64 and v.is_cpu and not v.requires_grad


# -- softmax family and NLL loss --------------------------------------------------------------------


def _t(dtype: torch.dtype, ulps: float = TRANSCENDENTAL_ULPS) -> float:
    return ulps * 2 * unit_roundoff(dtype)  # relative error of exp/log (or of `ulps` ulps) in the work dtype


def _shifted(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x - max, max - min) along dim, with -inf entries (masking) counted as the max: exp(-inf) = 0
    exactly on every device, so masked entries add no error, and must not turn the bound into inf/NaN."""
    mx = x.amax(dim, keepdim=True)
    xs = torch.where(x == float("-inf"), mx, x)
    return xs - mx, mx - xs.amin(dim, keepdim=True)


def _rows(dim: int, *ts: torch.Tensor) -> list | None:
    """(rows, n) numpy views of same-shaped contiguous float64 CPU tensors whose `dim` is the last, for the
    kernels of vtrain.fused; None where they cannot take them (the torch expressions then do)."""
    from vtrain import fused  # noqa: PLC0415 (as in abs_bounds)

    x = ts[0]
    nd = x.dim()
    if not nd or dim % nd != nd - 1 or not x.numel():
        return None
    for t in ts:
        if t.dtype is not torch.float64 or t.shape != x.shape or not fused.usable(t):
            return None
    n = x.shape[-1]
    return [fused.flat(t).reshape(-1, n) for t in ts]


def _softmax_terms(x: torch.Tensor, dim: int, y: torch.Tensor, log: bool) -> tuple[float, float, float, int]:
    """(u, t, g, n) of a softmax's (`log`: a log-softmax's) bound over n terms, as fused.softmax_bound takes them:
    t the exp's relative error (2 t for the softmax: its division's too), g gamma_n (gamma_(n+1))."""
    u, t, n = unit_roundoff(y.dtype), _t(y.dtype), x.shape[dim] if x.dim() else 1
    return (u, t, gamma(n, u), n) if log else (u, 2 * t, gamma(n + 1, u), n)


def _log_softmax(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
    x, dim = args[0], args[1]
    y = outs[0]
    u, t, g, n = _softmax_terms(x, dim, y, True)
    rows = _rows(dim, x, y)
    if rows is not None:  # the expression below in one pass (vtrain.fused.softmax_bound)
        from vtrain import fused  # noqa: PLC0415 (as in abs_bounds)

        e = torch.empty_like(y)
        if fused.softmax_bound(*rows, True, fused.flat(e).reshape(rows[0].shape), u, t, g,
                               *_finish_factors(n, u, y.dtype)):
            return [e]
    s, spread = _shifted(x, dim)  # s <= 0; spread bounds every exp argument's error
    lse = s - y  # log(sum exp(s)) up to rounding, >= 0
    # y = s - log(S): error of s (u|s|), of S (relative gamma_n + t + u*spread from the exp arguments),
    # of log (t |log S| + the relative error of S), and the final subtraction (u |y|).
    e = u * (s.abs() + y.abs() + spread) + g + t * (1 + lse.abs())
    return [_finish(e, n, u, y.dtype)]


def _softmax(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
    x, dim = args[0], args[1]
    p = outs[0]
    u, t2, g, n = _softmax_terms(x, dim, p, False)
    rows = _rows(dim, x, p)
    if rows is not None:  # the expression below in one pass (vtrain.fused.softmax_bound)
        from vtrain import fused  # noqa: PLC0415 (as in abs_bounds)

        e = torch.empty_like(p)
        if fused.softmax_bound(*rows, False, fused.flat(e).reshape(rows[0].shape), u, t2, g,
                               *_finish_factors(n, u, p.dtype)):
            return [e]
    s, spread = _shifted(x, dim)
    # p = exp(s)/S: relative errors of exp(s) (t + u|s|), of S (gamma_n + t + u*spread), the division u.
    rel = u * (s.abs() + spread) + t2 + g
    return [_finish(p.abs() * rel, n, u, p.dtype)]


def _log_softmax_backward(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
    grad, out, dim = args[0], args[1], args[2]
    y = outs[0]
    u, t, n = unit_roundoff(y.dtype), _t(y.dtype), grad.shape[dim] if grad.dim() else 1
    p = torch.exp(out)
    total = grad.sum(dim, keepdim=True)
    sabs = grad.abs().sum(dim, keepdim=True)
    rows = _rows(dim, p, y) if grad.dtype is torch.float64 else None
    if rows is not None:  # the expression below after the sums, in one pass
        from vtrain import fused  # noqa: PLC0415 (as in abs_bounds)

        e = torch.empty_like(y)
        if fused.log_softmax_backward_bound(rows[0], fused.flat(sabs), fused.flat(total), rows[1],
                                            fused.flat(e).reshape(rows[0].shape), u, t + 2 * u, gamma(n, u),
                                            *_finish_factors(n, u, y.dtype)):
            return [e]
    # y = g - exp(out) * sum(g): errors of the sum, of exp (t), of the product and the subtraction.
    e = p * (gamma(n, u) * sabs + (t + 2 * u) * total.abs()) + u * y.abs()
    return [_finish(e, n, u, y.dtype)]


def _softmax_backward(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
    grad, out, dim = args[0], args[1], args[2]
    y = outs[0]
    u, n = unit_roundoff(y.dtype), grad.shape[dim] if grad.dim() else 1
    gp = grad * out
    total = gp.sum(dim, keepdim=True)
    sabs = gp.abs_().sum(dim, keepdim=True)  # (gp is a fresh temporary)
    rows = _rows(dim, grad, out, y)
    if rows is not None:  # the expression below after the sums, in one pass
        from vtrain import fused  # noqa: PLC0415 (as in abs_bounds)

        e = torch.empty_like(y)
        if fused.softmax_backward_bound(rows[0], rows[1], fused.flat(sabs), fused.flat(total), rows[2],
                                        fused.flat(e).reshape(rows[0].shape), u, gamma(n + 1, u),
                                        *_finish_factors(n, u, y.dtype)):
            return [e]
    # y = p (g - sum(g p)): the products and the sum (gamma_(n+1) sum|g p|), the subtraction, the product.
    e = out.abs() * (gamma(n + 1, u) * sabs + u * (grad - total).abs()) + u * y.abs()
    return [_finish(e, n, u, y.dtype)]


def _nll_loss_forward(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
    x, target, weight, reduction, ignore_index = args[:5]
    loss, total = outs[0], outs[1]
    u = unit_roundoff(loss.dtype)
    n = target.numel()
    if reduction == 0:  # none: one product per element
        return [_finish(2 * u * loss.abs(), 1, u, loss.dtype), None]
    # the same reduction over |x|: the mean (or sum) of the picked |x| weighted by |w|
    absloss, abstotal = aten.nll_loss_forward.default(-x.abs(), target, None if weight is None else weight.abs(),
                                                       reduction, ignore_index)
    if loss.dtype is torch.float64 and loss.is_cpu and loss.dim() == 0 and total.dim() == 0:
        return _nll_loss_scalars(n, reduction, absloss.item(), abstotal.item(), loss.item(), total.item())
    return _nll_loss_tensors(n, reduction, absloss, abstotal, loss, total)


def _nll_loss_tensors(n: int, reduction: int, absloss: torch.Tensor, abstotal: torch.Tensor, loss: torch.Tensor,
                      total: torch.Tensor) -> list[torch.Tensor]:
    """E of the reduced NLL loss and of its total weight, from the same reduction over |x| and |w|."""
    u = unit_roundoff(loss.dtype)
    e_total = _finish(gamma(n, u) * abstotal.abs(), n, u, loss.dtype)
    if reduction != 1:  # sum: n weighted terms, gamma_(n+1) covers the products and the sum
        return [_finish(gamma(n + 2, u) * absloss.abs() + 2 * u * loss.abs(), n, u, loss.dtype), e_total]
    # mean L = A / W with A = sum(-w x), W = sum(w), both rounded sums: A'/W' - L = (A' - A)/W + (A'/W')(W - W')/W,
    # |A' - A| <= gamma_(n+1) sum|w x| = gamma_(n+1) absloss * sum|w|, |W - W'| <= gamma_n sum|w| and
    # |W| >= |W'| - gamma_n sum|w| (weights may be negative: W can cancel, then there is no finite bound);
    # plus the division's rounding. (Without weights W is an exact count and the second term is harmless.)
    wsum = abstotal.abs()
    margin = total.abs() - gamma(n, u) * wsum
    num = gamma(n + 1, u) * absloss.abs() * wsum + gamma(n, u) * (1 + 2 * u) * loss.abs() * wsum
    e = torch.where(margin > 0, num / margin.clamp_min(_tiny(loss.dtype)), torch.full_like(num, math.inf))
    return [_finish(e + 2 * u * loss.abs(), n, u, loss.dtype), e_total]


def _nll_loss_scalars(n: int, reduction: int, absloss: float, abstotal: float, loss: float,
                      total: float) -> list[torch.Tensor]:
    """_nll_loss_tensors for 0-d float64 CPU tensors, in Python floats: the same IEEE double operations in
    the same order (a 0-d float64 tensor op is one double operation), at a fraction of the per-call cost.
    (No Python float operation here can raise: the one division is by at least _tiny.)"""
    u, tiny = 2.0**-53, 2.0**-1074
    g = gamma(n, u)
    c, floor = _finish_factors(n, u, torch.float64)
    wsum = abs(abstotal)
    e_total = g * wsum * c + floor
    if reduction != 1:
        e = gamma(n + 2, u) * abs(absloss) + 2 * u * abs(loss)
    else:
        margin = abs(total) - g * wsum
        num = gamma(n + 1, u) * abs(absloss) * wsum + g * (1 + 2 * u) * abs(loss) * wsum
        e = (num / max(margin, tiny) if margin > 0 else math.inf) + 2 * u * abs(loss)
    return [torch.tensor(e * c + floor, dtype=torch.float64), torch.tensor(e_total, dtype=torch.float64)]


def _few_roundings(k: int) -> Bound:
    """Ops computing each element with at most k roundings of magnitude <= |result| (scatter/scale)."""

    def bound(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
        return [None if o is None else _finish(k * unit_roundoff(o.dtype) * o.abs(), 1, unit_roundoff(o.dtype), o.dtype)
                for o in outs]

    return bound


# A transcendental function's E depends on its output y alone: ((k |y|) + a) c + f, with k its ulps of the
# work dtype, a an absolute term and (c, f) `_finish`'s for one term. The rounding pass of float64 work at
# bits = 32 computes it as it goes (vtrain.fused.round_near_relative: no E in memory, the same operations in
# the same order, so the same bits); `BOUNDS` writes it out in torch.
Relative = Callable[[torch.dtype], tuple[float, float, float, float]]


def _relative(absolute: Callable[[torch.dtype], float], ulps: float = TRANSCENDENTAL_ULPS) -> Relative:
    def terms(dtype: torch.dtype) -> tuple[float, float, float, float]:
        return (_t(dtype, ulps), absolute(dtype), *_finish_factors(1, unit_roundoff(dtype), dtype))

    return terms


def _relative_bound(terms: Relative) -> Bound:
    def bound(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
        y = outs[0]
        k, a, c, f = terms(y.dtype)
        e = y.abs().mul_(k)
        return [(e.add_(a) if a else e).mul_(c).add_(f)]

    return bound


_TRANSCENDENTAL = _relative(lambda dtype: 0.0)
# 1 / (1 + exp(-x)), as torch's own CPU kernels compute sigmoid, is 0 where exp(-x) overflows: where sigmoid(x)
# lies below 1 / (the dtype's largest value) < its smallest normal (float32: x < -88.7, true values up to
# 2^-128, which a device computing e^x / (1 + e^x) returns as subnormals). Float64's floor covers this
# already; float32's (one subnormal unit) does not.
_SIGMOID = _relative(lambda dtype: torch.finfo(dtype).tiny)
_ERFC = _relative(lambda dtype: ERFC_ULPS * _floor_unit(dtype), ERFC_ULPS)


def _positive(op: Any, x: torch.Tensor) -> None:
    """lgamma, digamma and trigamma take positive arguments only: near their negative zeros and poles no library is
    accurate to a few ulps (CUDA lists lgamma's error as unbounded on (-23, -2.26)), so no band holds there."""
    if x.numel() and not bool((x > 0).all()):  # (NaN fails too)
        raise UnsupportedOpError(str(op), "an argument <= 0: the registry takes positive arguments only, where "
                                 "every device's function lies within its band (vtrain.bounds)")


_RELATIVE_BOUND = _relative_bound(_TRANSCENDENTAL)


def _lgamma(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
    # glibc's and CUDA's lgamma are within 4 ulps of the result for x > 0, near its zeros 1 and 2 too
    _positive(aten.lgamma.default, args[0])
    return _RELATIVE_BOUND(args, kwargs, outs)


def _digamma(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
    """torch computes digamma itself, on the CPU and CUDA alike: below 10 it subtracts 1/x, 1/(x + 1), ... and then
    adds log(x + n) - 1/(2 (x + n)) and an asymptotic series. Near its root (x ~ 1.4616) those terms cancel, so the
    error is a few ulps of their magnitudes, not of the result: of S = 1/x + 4 + log(x + 10), which bounds them
    (the other reciprocals sum to < 2.83, the half reciprocal and the series to < 1). E is DIGAMMA_ULPS ulps (of 2u)
    of S: measured, torch's float64 and float32 digamma stay within 2.2 and 2.7 such ulps of S of the exact value
    (66,000 arguments around the root, 1 and 2, and from 2^-86 to 2^86)."""
    x, y = args[0], outs[0]
    _positive(aten.digamma.default, x)
    u = unit_roundoff(y.dtype)
    s = torch.log(x + 10).add_(x.reciprocal()).add_(4.0)
    return [_finish(s.mul_(DIGAMMA_ULPS * 2 * u), 1, u, y.dtype)]


def _polygamma(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
    # polygamma(1, x), digamma's derivative (TRIGAMMA_RELATIVE); higher orders are refused
    n, x, y = args[0], args[1], outs[0]
    if n != 1:
        raise UnsupportedOpError(str(aten.polygamma.default), f"n = {n}: the registry has trigamma (n = 1), "
                                 "digamma's derivative, only")
    _positive(aten.polygamma.default, x)
    u = unit_roundoff(y.dtype)
    return [_finish(y.abs().mul_(max(TRIGAMMA_RELATIVE, _t(y.dtype))), 1, u, y.dtype)]


def _gelu(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
    y, x = outs[0], args[0]
    u = unit_roundoff(y.dtype)
    # 0.5 x (1 + erf(x / sqrt 2)) (or the tanh form): 1 + erf cancels for negative x, so the error is
    # a few ulps of |x| as well as of |y|.
    return [_finish(_t(y.dtype) * (y.abs() + x.abs()), 4, u, y.dtype)]


def _gelu_backward(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
    y, grad, x = outs[0], args[0], args[1]
    u = unit_roundoff(y.dtype)
    # g (Phi(x) + x phi(x)): the derivative lies in [-0.17, 1.13], each of its terms within a few ulps
    # of (1 + |x|); then one product with g.
    return [_finish(4 * _t(y.dtype) * grad.abs() * (1 + x.abs()) + 2 * u * y.abs(), 4, u, y.dtype)]


def _embedding_dense_backward(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
    y, grad, indices = outs[0], args[0], args[1]
    u = unit_roundoff(y.dtype)
    n = indices.numel() + 1  # rows summed into one weight row (+ the frequency scaling, if asked)
    absval = aten.embedding_dense_backward.default(grad.abs(), *args[1:], **kwargs)
    return [_finish(absval.mul_(gamma(n, u)), n, u, y.dtype)]  # (absval: a fresh temporary)


# -- pooling ----------------------------------------------------------------------------------------


def _pool(func: Any, kernel_pos: int) -> Bound:
    """Linear pooling ops: the op on |grad or input| bounds sum|terms|; gamma of the window (+1 division)."""

    def bound(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> list:
        y = outs[0]
        u = unit_roundoff(y.dtype)
        kernel = args[kernel_pos]
        k = _prod(kernel if len(kernel) == 2 else (kernel[0], kernel[0])) + 1
        absval = func(args[0].abs(), *args[1:], **kwargs)
        return [_finish(absval.mul_(gamma(k, u)), k, u, y.dtype)]  # (absval: a fresh temporary)

    return bound


def _mm_k(args: tuple) -> int:
    return args[0].shape[-1]


def _addmm_k(args: tuple) -> int:
    return args[1].shape[-1]


# The softmax family's rounding pass with its band computed in it (fused.round_near_softmax and its backward's), the
# kernel given the op's operands: called as k(v, factor, limit, out, cand, held, e_cand, plus) with round_near's
# arguments for the op's one output (outs[0]) and e_cand for E at the candidates; None where the kernels cannot take
# the op (the bound above and `round_near` then do). For float64 work at bits = 32 (`RoundedExecution._fused_near`).
RowBand = Callable[[tuple, dict, Sequence[torch.Tensor | None]], Callable[..., tuple[int, int]] | None]


def _softmax_rows(log: bool) -> RowBand:
    def rows(args: tuple, kwargs: dict, outs: Sequence[torch.Tensor | None]) -> Callable[..., tuple[int, int]] | None:
        x, dim = args[0], args[1]
        y = outs[0]
        views = _rows(dim, x, y)
        if views is None:
            return None
        from vtrain import fused  # noqa: PLC0415 (as in abs_bounds)

        u, t, g, n = _softmax_terms(x, dim, y, log)
        return functools.partial(fused.round_near_softmax, views[0], log, u, t, g, *_finish_factors(n, u, y.dtype))

    return rows


def _softmax_backward_rows(args: tuple, kwargs: dict,
                           outs: Sequence[torch.Tensor | None]) -> Callable[..., tuple[int, int]] | None:
    grad, out, dim = args[0], args[1], args[2]
    y = outs[0]
    views = _rows(dim, grad, out, y)
    if views is None:
        return None
    from vtrain import fused  # noqa: PLC0415 (as in abs_bounds)

    u, n = unit_roundoff(y.dtype), grad.shape[dim]
    return functools.partial(fused.round_near_softmax_backward, views[0], views[1], u, gamma(n + 1, u),
                             *_finish_factors(n, u, y.dtype))


ROWS: dict[Any, RowBand] = {
    aten._softmax.default: _softmax_rows(False),
    aten._log_softmax.default: _softmax_rows(True),
    aten._softmax_backward_data.default: _softmax_backward_rows,
}

RELATIVE: dict[Any, Relative] = {
    **{op: _TRANSCENDENTAL for op in (aten.exp.default, aten.exp2.default, aten.log.default, aten.tanh.default,
                                      aten.expm1.default, aten.log1p.default, aten.rsqrt.default,
                                      aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar,
                                      aten.erf.default, aten.sin.default, aten.cos.default, aten.atan2.default,
                                      aten.log2.default, aten.log10.default, aten.tan.default, aten.asin.default,
                                      aten.acos.default, aten.atan.default, aten.sinh.default, aten.cosh.default,
                                      aten.asinh.default, aten.acosh.default, aten.atanh.default)},
    aten.sigmoid.default: _SIGMOID,
    aten.erfc.default: _ERFC,
    aten.erfinv.default: _ERFC,
}

BOUNDS: dict[Any, Bound] = {
    aten.mm.default: _bilinear(aten.mm.default, _mm_k),
    aten.bmm.default: _bilinear(aten.bmm.default, _mm_k),
    aten.dot.default: _bilinear(aten.dot.default, _mm_k),
    aten.mv.default: _bilinear(aten.mv.default, _mm_k),
    aten.addmm.default: _bilinear(aten.addmm.default, _addmm_k, terms=3),
    aten.convolution.default: _bilinear(aten.convolution.default, _conv_k, terms=1),
    aten.convolution_backward.default: _convolution_backward,
    aten.sum.default: _sum,
    aten.sum.dim_IntList: _sum,
    aten.mean.default: _mean,
    aten.mean.dim: _mean,
    aten._log_softmax.default: _log_softmax,
    aten._softmax.default: _softmax,
    aten._log_softmax_backward_data.default: _log_softmax_backward,
    aten._softmax_backward_data.default: _softmax_backward,
    aten.nll_loss_forward.default: _nll_loss_forward,
    aten.nll_loss_backward.default: _few_roundings(2),
    aten.avg_pool2d.default: _pool(aten.avg_pool2d.default, 1),
    aten.avg_pool2d_backward.default: _pool(aten.avg_pool2d_backward.default, 2),
    aten.max_pool2d_with_indices_backward.default: _pool(aten.max_pool2d_with_indices_backward.default, 2),
    **{op: _relative_bound(terms) for op, terms in RELATIVE.items()},
    aten.gelu.default: _gelu,
    aten.gelu_backward.default: _gelu_backward,
    aten.embedding_dense_backward.default: _embedding_dense_backward,
    aten.lgamma.default: _lgamma,
    aten.digamma.default: _digamma,
    aten.polygamma.default: _polygamma,
}

# op -> BOUNDS[op] evaluated only at given flat positions (same sums, gathered)
BOUNDS_AT: dict[Any, PositionBound] = {
    **{op: _matmul_at(op) for op in (aten.mm.default, aten.bmm.default, aten.addmm.default)},
    **{op: _convolution_at(op) for op in (aten.convolution.default, aten.convolution_backward.default)},
}

