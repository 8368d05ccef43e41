"""vtrain.resolve against independent exact references.

Resolvers: every op of RESOLVERS, all output positions, on small grid inputs (float64 at bits 32 and
float32 at bits 19; random and quantised k/16 data), compared for exact equality with the op's definition
written plainly here (loops or object arrays of Fractions, rounded by a Fraction rounder built on numref);
a second check against torch itself (within one grid step) keeps both sides honest about what the op
means. Adversarial cases: exact ties, cancellation to zero, subnormal results, huge dynamic range.
Transcendental functions against mpmath at 300 bits.

Certifiers (asked for positions, as the engine asks): a certified element equals the exact value and
every emulated device's value; quantised data is mostly certified; asking for a few positions, in any
order, answers as asking for all of them does; terms needing more than 53 bits are refused; and
E / gamma_K really bounds sum|terms| (the coupling to vtrain.bounds that the certificates rely on).
"""

from __future__ import annotations

import itertools
import math
import zlib
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable

import mpmath
import numpy as np
import pytest
import torch

from numref import grid_max, spacing
from vtrain import resolve
from vtrain.bounds import BOUNDS
from vtrain.devices import list_devices
from vtrain.grid import round_to_grid
from vtrain.resolve import CERTIFIERS, RESOLVERS, ResolveError, resolver_for

aten = torch.ops.aten
F = Fraction
GRIDS = [(torch.float64, 32), (torch.float32, 19)]
EMULATED = [d for d in list_devices() if d.emulated]


# -- exact references -------------------------------------------------------------------------------


def ref_round_q(q: Fraction, m: int) -> float:
    """RNE of the rational q on the m-bit grid (numref's rule, for rationals)."""
    a = abs(q)
    step = spacing(a, m)
    res = round(a / step) * step  # Fraction rounding is half-to-even
    assert res <= grid_max(m), "test data must not overflow"
    return math.copysign(float(res), q) if res else 0.0


def is_tie(q: Fraction, m: int) -> bool:
    return (abs(q) / spacing(abs(q), m)).denominator == 2


def fr(t: torch.Tensor) -> np.ndarray:
    """An object array of Fractions with t's shape."""
    return np.array([F(v) for v in t.detach().to(torch.float64).reshape(-1).tolist()], dtype=object).reshape(
        tuple(t.shape))


def flat(a: Any) -> list[Fraction]:
    return [F(v) for v in np.asarray(a, dtype=object).reshape(-1).tolist()]


def zeros(shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(shape, dtype=object)
    out.fill(F(0))
    return out


def ref_mm(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    A, B = fr(a), fr(b)
    out = zeros((a.shape[0], b.shape[1]))
    for i, j, k in itertools.product(range(a.shape[0]), range(b.shape[1]), range(a.shape[1])):
        out[i, j] += A[i, k] * B[k, j]
    return out


def conv_out(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def ref_conv(x, w, b, stride, pad, dil, groups) -> np.ndarray:
    X, W = fr(x), fr(w)
    n_img, _, h, wd = x.shape
    c_out, c_g, kh, kw = w.shape
    oh, ow = conv_out(h, kh, stride[0], pad[0], dil[0]), conv_out(wd, kw, stride[1], pad[1], dil[1])
    out = zeros((n_img, c_out, oh, ow))
    for n, co, r, c in itertools.product(range(n_img), range(c_out), range(oh), range(ow)):
        g = co // (c_out // groups)
        acc = F(0) if b is None else F(float(b[co]))
        for ci, i, j in itertools.product(range(c_g), range(kh), range(kw)):
            y, z = r * stride[0] - pad[0] + i * dil[0], c * stride[1] - pad[1] + j * dil[1]
            if 0 <= y < h and 0 <= z < wd:
                acc += X[n, g * c_g + ci, y, z] * W[co, ci, i, j]
        out[n, co, r, c] = acc
    return out


def ref_conv_backward(gy, x, w, stride, pad, dil, groups) -> tuple:
    """Scatter form: every (output position, tap) pair adds its products where the forward read them."""
    G, X, W = fr(gy), fr(x), fr(w)
    gi, gw, gb = zeros(tuple(x.shape)), zeros(tuple(w.shape)), zeros((w.shape[0],))
    n_img, _, h, wd = x.shape
    c_out, c_g, kh, kw = w.shape
    for n, co, r, c in itertools.product(*(range(s) for s in gy.shape)):
        g = co // (c_out // groups)
        gb[co] += G[n, co, r, c]
        for ci, i, j in itertools.product(range(c_g), range(kh), range(kw)):
            y, z = r * stride[0] - pad[0] + i * dil[0], c * stride[1] - pad[1] + j * dil[1]
            if 0 <= y < h and 0 <= z < wd:
                gi[n, g * c_g + ci, y, z] += G[n, co, r, c] * W[co, ci, i, j]
                gw[co, ci, i, j] += G[n, co, r, c] * X[n, g * c_g + ci, y, z]
    return gi, gw, gb


def ref_avg_windows(x_shape, out_shape, kernel, stride, pad, count_include_pad, divisor_override):
    """(output index, list of input (y, z) in the window, divisor), torch's documented divisor rules."""
    h, wd = x_shape[-2:]
    for r, c in itertools.product(range(out_shape[-2]), range(out_shape[-1])):
        y0, z0 = r * stride[0] - pad[0], c * stride[1] - pad[1]
        y1, z1 = min(y0 + kernel[0], h + pad[0]), min(z0 + kernel[1], wd + pad[1])
        padded = (y1 - y0) * (z1 - z0)
        cells = [(y, z) for y in range(max(y0, 0), min(y1, h)) for z in range(max(z0, 0), min(z1, wd))]
        div = divisor_override or (padded if count_include_pad else len(cells))
        yield (r, c), cells, div


# -- cases ------------------------------------------------------------------------------------------


def grid(shape, gen, dtype, bits, kind, scale=1.0, positive=False) -> torch.Tensor:
    if kind == "quant":  # k/16: exact products and sums, ties after divisions and at small bits
        x = torch.randint(-16, 17, shape, generator=gen).to(torch.float64) / 16
    else:
        x = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
    if positive:
        x = x.abs() + 0.25
    return round_to_grid(x, bits).to(dtype)


@dataclass
class Case:
    name: str
    op: Any
    make: Callable[..., tuple[tuple, dict]]  # (gen, dtype, bits, kind) -> (args, kwargs)
    ref: Callable[[tuple, dict], list]  # -> per output: flat list of exact Fractions, or None


def _conv_args(gen, dtype, bits, kind, one_d=False, stride=(2, 2), pad=(1, 1), dil=(2, 2)):
    if one_d:
        return (grid((2, 3, 9), gen, dtype, bits, kind), grid((4, 3, 3), gen, dtype, bits, kind), None,
                [1], [1], [1], False, [0], 1), {}
    return (grid((2, 4, 7, 7), gen, dtype, bits, kind), grid((6, 2, 3, 3), gen, dtype, bits, kind),
            grid((6,), gen, dtype, bits, kind), list(stride), list(pad), list(dil), False, [0, 0], 2), {}


def _ref_conv(args, kwargs):
    x, w, b, s, p, d, _, _, groups = args
    if x.dim() == 3:
        return [flat(ref_conv(x.unsqueeze(2), w.unsqueeze(2), b, [1, s[0]], [0, p[0]], [1, d[0]], groups))]
    return [flat(ref_conv(x, w, b, s, p, d, groups))]


def _conv_bwd_args(gen, dtype, bits, kind, **geometry):
    (x, w, b, s, p, d, t, op_, g), _ = _conv_args(gen, dtype, bits, kind, **geometry)
    y = aten.convolution.default(x, w, b, s, p, d, t, op_, g)
    return (grid(tuple(y.shape), gen, dtype, bits, kind), x, w, [w.shape[0]], s, p, d, t, op_, g,
            [True, True, True]), {}


def _ref_conv_bwd(args, kwargs):
    gy, x, w, _, s, p, d, _, _, groups, _ = args
    if x.dim() == 3:  # a 1-d convolution is a 2-d one of height 1
        gy, x, w, s, p, d = gy.unsqueeze(2), x.unsqueeze(2), w.unsqueeze(2), [1, s[0]], [0, p[0]], [1, d[0]]
    return [flat(o) for o in ref_conv_backward(gy, x, w, s, p, d, groups)]


def _ref_reduce(mean: bool) -> Callable:
    def ref(args, kwargs):
        x = args[0]
        dim = args[1] if len(args) > 1 else None
        keepdim = args[2] if len(args) > 2 else False
        red = tuple(range(x.dim())) if not dim else tuple(d % x.dim() for d in dim)
        s = fr(x).sum(axis=red, keepdims=keepdim)
        n = math.prod(x.shape[d] for d in red)
        return [[v / n if mean else v for v in flat(s)]]

    return ref


def _nll_args(reduction, weighted):
    def make(gen, dtype, bits, kind):
        x = grid((6, 5), gen, dtype, bits, kind)
        target = torch.tensor([0, 2, 4, 1, 2, 3])  # class 2 is ignored below
        weight = grid((5,), gen, dtype, bits, kind, positive=True) if weighted else None
        return (x, target, weight, reduction, 2), {}

    return make


def _ref_nll_terms(x, target, weight, ignore):
    X = fr(x)
    terms, wts = [], []
    for n, t in enumerate(target.tolist()):
        w = F(0) if t == ignore else (F(1) if weight is None else F(float(weight[t])))
        terms.append(-w * (X[n, t] if t != ignore else 0))
        wts.append(w)
    return terms, wts


def _ref_nll_forward(args, kwargs):
    x, target, weight, reduction, ignore = args
    terms, wts = _ref_nll_terms(x, target, weight, ignore)
    if reduction == 0:
        return [terms, [F(0)]]
    total = sum(wts)
    return [[sum(terms) / total if reduction == 1 else sum(terms)], [total]]


def _nll_bwd_args(reduction, weighted):
    def make(gen, dtype, bits, kind):
        (x, target, weight, _, ignore), _ = _nll_args(reduction, weighted)(gen, dtype, bits, kind)
        _, total = aten.nll_loss_forward.default(x, target, weight, reduction, ignore)
        g = grid((6,) if reduction == 0 else (), gen, dtype, bits, kind)
        return (g, x, target, weight, reduction, ignore, total), {}

    return make


def _ref_nll_backward(args, kwargs):
    g, x, target, weight, reduction, ignore, total = args
    out = zeros(tuple(x.shape))
    for n, t in enumerate(target.tolist()):
        if t == ignore:
            continue
        w = F(1) if weight is None else F(float(weight[t]))
        gv = F(float(g[n])) if reduction == 0 else F(float(g))
        out[n, t] = -w * gv / (F(float(total)) if reduction == 1 else 1)
    return [flat(out)]


def _avg_args(cip, override, kernel=3, stride=2, pad=1, ceil=True):
    def make(gen, dtype, bits, kind):
        return (grid((2, 3, 7, 7), gen, dtype, bits, kind), [kernel] * 2, [stride] * 2, [pad] * 2, ceil, cip,
                override), {}

    return make


def _ref_avg(args, kwargs):
    x, kernel, stride, pad, _, cip, override = args
    y = aten.avg_pool2d.default(*args)  # output shape only: the values come from the definition
    X = fr(x)
    out = zeros(tuple(y.shape))
    for plane in itertools.product(range(x.shape[0]), range(x.shape[1])):
        for (r, c), cells, div in ref_avg_windows(x.shape, y.shape, kernel, stride, pad, cip, override):
            out[plane + (r, c)] = sum((X[plane + cell] for cell in cells), F(0)) / div
    return [flat(out)]


def _avg_bwd_args(cip, override, *geometry):
    def make(gen, dtype, bits, kind):
        (x, *rest), _ = _avg_args(cip, override, *geometry)(gen, dtype, bits, kind)
        y = aten.avg_pool2d.default(x, *rest)
        return (grid(tuple(y.shape), gen, dtype, bits, kind), x, *rest), {}

    return make


def _ref_avg_bwd(args, kwargs):
    gy, x, kernel, stride, pad, _, cip, override = args
    G = fr(gy)
    out = zeros(tuple(x.shape))
    for plane in itertools.product(range(x.shape[0]), range(x.shape[1])):
        for (r, c), cells, div in ref_avg_windows(x.shape, gy.shape, kernel, stride, pad, cip, override):
            for cell in cells:
                out[plane + cell] += G[plane + (r, c)] / div
    return [flat(out)]


def _maxpool_bwd_args(gen, dtype, bits, kind):
    x = grid((2, 2, 7, 7), gen, dtype, bits, kind)
    y, ind = aten.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1], [1, 1], False)
    return (grid(tuple(y.shape), gen, dtype, bits, kind), x, [3, 3], [2, 2], [1, 1], [1, 1], False, ind), {}


def _ref_maxpool_bwd(args, kwargs):
    gy, x, *_, ind = args
    G = fr(gy)
    out = zeros((x.shape[0], x.shape[1], x.shape[2] * x.shape[3]))
    for o in itertools.product(*(range(s) for s in gy.shape)):
        out[o[0], o[1], int(ind[o])] += G[o]
    return [flat(out)]


def _emb_args(scale):
    def make(gen, dtype, bits, kind):
        indices = torch.tensor([[0, 3, 3, 2, 6], [3, 1, 2, 0, 3], [5, 5, 3, 2, 0]])  # repeats, padding 2
        return (grid((3, 5, 4), gen, dtype, bits, kind), indices, 7, 2, scale), {}

    return make


def _ref_emb(args, kwargs):
    g, indices, num, pad, scale = args
    G = fr(g.reshape(-1, g.shape[-1]))
    idx = indices.reshape(-1).tolist()
    out = zeros((num, g.shape[-1]))
    for t, v in enumerate(idx):
        if v != pad:
            for d in range(g.shape[-1]):
                out[v, d] += G[t, d] / (idx.count(v) if scale else 1)
    return [flat(out)]


def _mm_like(shapes, extra_kwargs=None, bias_shape=None):
    def make(gen, dtype, bits, kind):
        ts = [grid(s, gen, dtype, bits, kind) for s in shapes]
        if bias_shape is not None:
            ts = [grid(bias_shape, gen, dtype, bits, kind), *ts]
        return tuple(ts), dict(extra_kwargs or {})

    return make


def _ref_addmm(args, kwargs):
    bias, a, b = args
    beta, alpha = F(kwargs.get("beta", 1)), F(kwargs.get("alpha", 1))
    prod = ref_mm(a, b)
    bb = fr(bias.expand(prod.shape))
    return [flat(alpha * prod + beta * bb)]


CASES = [
    Case("mm", aten.mm.default, _mm_like([(4, 9), (9, 5)]), lambda a, k: [flat(ref_mm(*a))]),
    Case("bmm", aten.bmm.default, _mm_like([(2, 3, 8), (2, 8, 4)]),
         lambda a, k: [flat([ref_mm(a[0][i], a[1][i]) for i in range(2)])]),
    Case("dot", aten.dot.default, _mm_like([(11,), (11,)]),
         lambda a, k: [flat(ref_mm(a[0][None], a[1][:, None]))]),
    Case("mv", aten.mv.default, _mm_like([(5, 9), (9,)]), lambda a, k: [flat(ref_mm(a[0], a[1][:, None]))]),
    Case("addmm", aten.addmm.default, _mm_like([(4, 9), (9, 5)], bias_shape=(5,)), _ref_addmm),
    # lines longer than the certificates' sample (resolve._SAMPLE): the grain needs the whole line
    Case("mm-k40", aten.mm.default, _mm_like([(4, 40), (40, 5)]), lambda a, k: [flat(ref_mm(*a))]),
    Case("addmm-k40", aten.addmm.default, _mm_like([(4, 40), (40, 5)], bias_shape=(5,)), _ref_addmm),
    Case("addmm-bias2d", aten.addmm.default, _mm_like([(4, 9), (9, 5)], bias_shape=(4, 5)), _ref_addmm),
    Case("addmm-scaled", aten.addmm.default, _mm_like([(4, 9), (9, 5)], {"beta": 0.5, "alpha": 3.0}, (4, 5)),
         _ref_addmm),
    Case("conv2d-s2p1d2g2", aten.convolution.default, _conv_args, _ref_conv),
    Case("conv1d", aten.convolution.default, lambda *a: _conv_args(*a, one_d=True), _ref_conv),
    Case("conv-backward", aten.convolution_backward.default, _conv_bwd_args, _ref_conv_bwd),
    # stride 1: grad_input is itself a convolution (resolve._convolution_matmul), with padding on one side
    Case("conv-backward-s1", aten.convolution_backward.default,
         lambda *a: _conv_bwd_args(*a, stride=(1, 1), pad=(1, 2), dil=(1, 2)), _ref_conv_bwd),
    Case("conv1d-backward", aten.convolution_backward.default, lambda *a: _conv_bwd_args(*a, one_d=True),
         _ref_conv_bwd),
    Case("sum", aten.sum.default, _mm_like([(3, 4, 5)]), _ref_reduce(False)),
    Case("sum-dims-keepdim", aten.sum.dim_IntList,
         lambda *a: ((grid((3, 4, 5), *a), [0, -1], True), {}), _ref_reduce(False)),
    Case("sum-dim-empty", aten.sum.dim_IntList, lambda *a: ((grid((3, 4), *a), []), {}), _ref_reduce(False)),
    Case("mean", aten.mean.default, _mm_like([(3, 5)]), _ref_reduce(True)),
    Case("mean-dim", aten.mean.dim, lambda *a: ((grid((3, 4, 6), *a), [2]), {}), _ref_reduce(True)),
    # means over 8 and 16 elements: an exact division (vtrain.grains proves whole ops of these)
    Case("mean-dim-pow2", aten.mean.dim, lambda *a: ((grid((3, 4, 8), *a), [2]), {}), _ref_reduce(True)),
    Case("mean-dims-pow2-keepdim", aten.mean.dim,
         lambda *a: ((grid((4, 3, 4), *a), [0, -1], True), {}), _ref_reduce(True)),
    *[Case(f"nll-forward-r{r}-{'w' if w else 'nw'}", aten.nll_loss_forward.default, _nll_args(r, w), _ref_nll_forward)
      for r in (0, 1, 2) for w in (False, True)],
    *[Case(f"nll-backward-r{r}-{'w' if w else 'nw'}", aten.nll_loss_backward.default, _nll_bwd_args(r, w),
           _ref_nll_backward) for r in (0, 1, 2) for w in (False, True)],
    *[Case(f"avgpool-cip{c}-ov{o}", aten.avg_pool2d.default, _avg_args(c, o), _ref_avg)
      for c, o in ((True, None), (False, None), (False, 5))],
    *[Case(f"avgpool-backward-cip{c}-ov{o}", aten.avg_pool2d_backward.default, _avg_bwd_args(c, o), _ref_avg_bwd)
      for c, o in ((True, None), (False, None), (False, 5))],
    Case("avgpool-k2", aten.avg_pool2d.default, _avg_args(True, None, 2, 2, 0, False), _ref_avg),
    Case("avgpool-k2-backward", aten.avg_pool2d_backward.default, _avg_bwd_args(True, None, 2, 2, 0, False),
         _ref_avg_bwd),
    Case("avgpool-k2s1-backward", aten.avg_pool2d_backward.default, _avg_bwd_args(True, None, 2, 1, 0, False),
         _ref_avg_bwd),
    Case("maxpool-backward", aten.max_pool2d_with_indices_backward.default, _maxpool_bwd_args, _ref_maxpool_bwd),
    *[Case(f"embedding-backward-scale{s}", aten.embedding_dense_backward.default, _emb_args(s), _ref_emb)
      for s in (False, True)],
]


def _upcast(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.is_floating_point():
        return v.to(torch.float64)
    return v


def check_resolver(op: Any, args: tuple, kwargs: dict, expected: list, bits: int) -> None:
    """Resolve every position of every output; exact equality with the reference, and torch agrees to a step."""
    computed = op(*[_upcast(a) for a in args], **kwargs)
    computed = computed if isinstance(computed, tuple) else (computed,)
    for i, exact in enumerate(expected):
        got = resolver_for(op)(args, kwargs, i, np.arange(len(exact), dtype=np.int64), bits)
        want = [ref_round_q(q, bits - 9) for q in exact]
        assert got.dtype == np.float64 and got.tolist() == want, (op, i)
        assert not np.signbit(got[got == 0]).any()  # the grid's zero is +0.0
        v = computed[i].detach().reshape(-1).numpy()
        step = np.array([float(spacing(abs(F(w)), bits - 9)) for w in want])
        assert (np.abs(got - v) <= step + 2.0**-40 * np.abs(v).max()).all(), (op, i, "differs from torch")


@pytest.mark.parametrize("kind", ["normal", "quant"])
@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_resolver_matches_fraction_reference(case: Case, dtype: torch.dtype, bits: int, kind: str) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/{bits}/{kind}".encode()))
    args, kwargs = case.make(gen, dtype, bits, kind)
    check_resolver(case.op, args, kwargs, case.ref(args, kwargs), bits)


def test_every_resolver_has_a_case() -> None:
    tested = {c.op for c in CASES} | set(FUNCTION_OPS)
    assert set(RESOLVERS) == tested
    # every bounded op is resolvable, except the softmax family that the engine decomposes
    softmax = {aten._softmax.default, aten._log_softmax.default, aten._softmax_backward_data.default,
               aten._log_softmax_backward_data.default}
    assert set(BOUNDS) - softmax == set(RESOLVERS)


# -- adversarial linear cases -----------------------------------------------------------------------


def test_exact_ties_are_resolved_to_even() -> None:
    """Quantised data at bits = 10 (two significant bits): sums and means land on midpoints."""
    gen = torch.Generator().manual_seed(7)
    x = round_to_grid(torch.randint(-16, 17, (40, 6), generator=gen).to(torch.float64) / 16, 10)
    exact = [F(v) for v in fr(x).sum(axis=1)]
    assert sum(is_tie(q, 1) for q in exact) >= 5  # the case really holds ties
    check_resolver(aten.sum.dim_IntList, (x, [1]), {}, [exact], 10)
    check_resolver(aten.mean.dim, (x, [1]), {}, [[q / 6 for q in exact]], 10)
    a = round_to_grid(torch.randint(-16, 17, (8, 5), generator=gen).to(torch.float64) / 16, 10)
    check_resolver(aten.mm.default, (a, x[:5]), {}, [flat(ref_mm(a, x[:5]))], 10)


@pytest.mark.parametrize("name", ["conv2d-s2p1d2g2", "conv-backward", "avgpool-k2", "avgpool-backward-cipFalse-ovNone",
                                  "embedding-backward-scaleTrue"])
def test_ties_at_ten_bits(name: str) -> None:
    case = next(c for c in CASES if c.name == name)
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    args, kwargs = case.make(gen, torch.float64, 10, "quant")
    expected = case.ref(args, kwargs)
    assert any(is_tie(q, 1) for out in expected for q in out)  # ties-to-even really decides something
    check_resolver(case.op, args, kwargs, expected, 10)


def test_tie_broken_by_a_far_residual() -> None:
    """1 + 2^-24 (an FP32 midpoint) plus a residual of +-2^-80: fsum-then-round would tie to 1."""
    for sign, want in ((1, 1 + 2.0**-23), (-1, 1.0)):
        x = torch.tensor([[1.0, 2.0**-24, sign * 2.0**-80]], dtype=torch.float64)
        got = resolver_for(aten.sum.dim_IntList)((x, [1]), {}, 0, np.array([0]), 32)
        assert got.tolist() == [want]


def test_cancellation_subnormals_and_dynamic_range() -> None:
    big, tiny = 2.0**100, 2.0**-100
    a = torch.tensor([[big, 1.0, -big, 3 * tiny], [1.0, -1.0, 0.5, -0.5], [2.0**-75, 2.0**-75, 0, 0]],
                     dtype=torch.float64)
    b = torch.tensor([[1.0, 2.0**-140, -0.75, 2.0**-60], [1.0, 2.0**-140, 0.25, 3 * 2.0**-61],
                      [1.0, 1.0, 3.0, 0.0], [1.0, 2.0**-20, 1.0, 0.0]], dtype=torch.float64)
    exact = flat(ref_mm(a, b))
    assert exact[0] == 1 + 3 * F(2) ** -100  # huge dynamic range: the big terms cancel exactly
    assert exact[4] == 0  # cancellation to exactly zero (+0.0 out, checked inside)
    assert exact[11] == 5 * F(2) ** -136  # a subnormal-grid result
    assert exact[9] == F(2) ** -214  # far below the grid: rounds to +0.0
    for bits in (32, 12):
        check_resolver(aten.mm.default, (a, b), {}, [exact], bits)


def test_resolves_only_the_positions_asked_for_and_noncontiguous_inputs() -> None:
    gen = torch.Generator().manual_seed(3)
    a = grid((9, 6), gen, torch.float64, 32, "normal").T  # (6, 9), non-contiguous
    b = grid((9, 7), gen, torch.float64, 32, "normal")
    full = [ref_round_q(q, 23) for q in flat(ref_mm(a, b))]
    pos = np.array([40, 3, 3, 0, 41], dtype=np.int64)
    assert resolver_for(aten.mm.default)((a, b), {}, 0, pos, 32).tolist() == [full[p] for p in pos]


def test_unsupported_configurations_raise_named_errors() -> None:
    x, w = torch.ones(1, 2, 4, 4, 4, 4, dtype=torch.float64), torch.ones(2, 2, 3, 3, 3, 3, dtype=torch.float64)
    with pytest.raises(ResolveError, match=r"1-d, 2-d and 3-d convolutions only, got input \(1, 2, 4, 4, 4, 4\)"):
        resolver_for(aten.convolution.default)((x, w, None, [1] * 4, [0] * 4, [1] * 4, False, [0] * 4, 1), {}, 0,
                                               np.array([0]), 32)
    with pytest.raises(ResolveError, match="aten.cumsum.default"):
        resolver_for(aten.cumsum.default)
    with pytest.raises(ResolveError, match="0/0"):
        x = torch.zeros(2, 3, dtype=torch.float64)
        resolver_for(aten.nll_loss_forward.default)((x, torch.tensor([1, 1]), None, 1, 1), {}, 0, np.array([0]), 32)


def ref_conv_transposed(x, w, b, stride, pad, dil, out_pad, groups) -> np.ndarray:
    """Written as a transposed convolution is defined: every input value, times each tap of its weights, adds
    to the output cell that tap reaches (the output padding widens the output at its far end)."""
    X, W = fr(x), fr(w)
    n_img, c_in, h, wd = x.shape
    _, co_g, kh, kw = w.shape
    size = [(n - 1) * s - 2 * p + d * (k - 1) + o + 1 for n, s, p, d, k, o in
            zip((h, wd), stride, pad, dil, (kh, kw), out_pad)]
    out = zeros((n_img, co_g * groups, *size))
    for n, co, r, c in itertools.product(*(range(k) for k in out.shape)):
        out[n, co, r, c] = F(0) if b is None else F(float(b[co]))
    for n, ci, y, z in itertools.product(range(n_img), range(c_in), range(h), range(wd)):
        for col, i, j in itertools.product(range(co_g), range(kh), range(kw)):
            r, c = y * stride[0] - pad[0] + i * dil[0], z * stride[1] - pad[1] + j * dil[1]
            if 0 <= r < size[0] and 0 <= c < size[1]:
                out[n, (ci // (c_in // groups)) * co_g + col, r, c] += X[n, ci, y, z] * W[ci, col, i, j]
    return out


def ref_conv_transposed_backward(gy, x, w, stride, pad, dil, groups) -> tuple:
    """The gradients of `ref_conv_transposed`: each (input value, tap) pair's product read back from the output
    cell it added to."""
    G, X, W = fr(gy), fr(x), fr(w)
    gi, gw = zeros(tuple(x.shape)), zeros(tuple(w.shape))
    n_img, c_in, h, wd = x.shape
    _, co_g, kh, kw = w.shape
    gb = fr(gy).sum(axis=(0, 2, 3))
    for n, ci, y, z in itertools.product(range(n_img), range(c_in), range(h), range(wd)):
        for col, i, j in itertools.product(range(co_g), range(kh), range(kw)):
            r, c = y * stride[0] - pad[0] + i * dil[0], z * stride[1] - pad[1] + j * dil[1]
            if 0 <= r < gy.shape[2] and 0 <= c < gy.shape[3]:
                co = (ci // (c_in // groups)) * co_g + col
                gi[n, ci, y, z] += G[n, co, r, c] * W[ci, col, i, j]
                gw[ci, col, i, j] += G[n, co, r, c] * X[n, ci, y, z]
    return gi, gw, gb


# (input shape, weight shape, bias, stride, padding, dilation, output padding, groups): grouped, strided and
# dilated; output padding below the stride (rows) and, at stride 1, below the dilation only (columns), where the
# convolution a transposed one is read through has a window more than the transposed one has inputs; 1-d
TRANSPOSED = {"2d": ((2, 4, 4, 3), (4, 3, 3, 2), True, [2, 1], [1, 0], [1, 2], [1, 1], 2),
              "1d": ((2, 3, 5), (3, 2, 3), False, [2], [1], [1], [0], 1)}


@pytest.mark.parametrize("kind", ["normal", "quant"])
@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
@pytest.mark.parametrize("name", TRANSPOSED)
def test_transposed_convolutions_and_their_gradients_resolve_as_the_fractions(name: str, dtype: torch.dtype,
                                                                               bits: int, kind: str) -> None:
    x_shape, w_shape, with_bias, stride, pad, dil, out_pad, groups = TRANSPOSED[name]
    gen = torch.Generator().manual_seed(zlib.crc32(f"transposed/{name}/{bits}/{kind}".encode()))
    x, w = grid(x_shape, gen, dtype, bits, kind), grid(w_shape, gen, dtype, bits, kind)
    bias = grid((w_shape[1] * groups,), gen, dtype, bits, kind) if with_bias else None
    args = (x, w, bias, stride, pad, dil, True, out_pad, groups)
    y = aten.convolution.default(*args)
    gy = grid(tuple(y.shape), gen, dtype, bits, kind)
    geometry = [stride, pad, dil]
    if x.dim() == 3:  # (the references are 2-d: a 1-d convolution is one of height 1)
        x2, w2, gy2, out_pad2 = x.unsqueeze(2), w.unsqueeze(2), gy.unsqueeze(2), [0, *out_pad]
        geometry = [[1, *stride], [0, *pad], [1, *dil]]
    else:
        x2, w2, gy2, out_pad2 = x, w, gy, out_pad
    check_resolver(aten.convolution.default, args, {}, [flat(ref_conv_transposed(x2, w2, bias, *geometry, out_pad2,
                                                                                 groups))], bits)
    backward = (gy, x, w, [w_shape[1] * groups], stride, pad, dil, True, out_pad, groups, [True, True, True])
    check_resolver(aten.convolution_backward.default, backward, {},
                   [flat(o) for o in ref_conv_transposed_backward(gy2, x2, w2, *geometry, groups)], bits)


def ref_conv_volume(x, w, gy, stride, pad, dil, groups, transposed) -> tuple:
    """A 3-d convolution (or transposed convolution) and its backward for the output gradient gy, in scatter
    form: every (input value, output value, tap) triple that meets adds its product to the output, and reads
    its gradients back. (out, grad_input, grad_weight, grad_bias), Fractions."""
    X, W, G = fr(x), fr(w), fr(gy)
    out, gi, gw = zeros(tuple(gy.shape)), zeros(tuple(x.shape)), zeros(tuple(w.shape))
    c_in, kernel = x.shape[1], w.shape[2:]
    per_group = (w.shape[1] if transposed else w.shape[0] // groups)
    for n, ci, *y in itertools.product(*(range(k) for k in x.shape)):
        g = ci // (c_in // groups)
        for col, *k in itertools.product(range(per_group), *(range(k) for k in kernel)):
            if transposed:  # input position y spreads to y * s - p + k d
                o = [y[d] * stride[d] - pad[d] + k[d] * dil[d] for d in range(3)]
                co, wt = g * per_group + col, (ci, col, *k)
            else:  # output position o reads y = o * s - p + k d: y hits o where that divides
                reach = [y[d] + pad[d] - k[d] * dil[d] for d in range(3)]
                if any(r % s for r, s in zip(reach, stride)):
                    continue
                o = [r // s for r, s in zip(reach, stride)]
                co, wt = g * per_group + col, (g * per_group + col, ci % (c_in // groups), *k)
            if all(0 <= o[d] < gy.shape[2 + d] for d in range(3)):
                at = (n, co, *o)
                out[at] += X[(n, ci, *y)] * W[wt]
                gi[(n, ci, *y)] += G[at] * W[wt]
                gw[wt] += G[at] * X[(n, ci, *y)]
    return out, gi, gw, fr(gy).sum(axis=(0, 2, 3, 4))


# (transposed, input shape, weight shape, stride, padding, dilation, output padding, groups)
VOLUMES = {"conv3d": (False, (2, 4, 4, 5, 3), (4, 2, 2, 3, 2), [2, 1, 1], [1, 1, 0], [1, 1, 2], [0, 0, 0], 2),
           "conv3d-transposed": (True, (1, 2, 3, 2, 3), (2, 3, 2, 2, 3), [2, 1, 1], [0, 1, 1], [1, 2, 1], [1, 1, 0],
                                 1)}


@pytest.mark.parametrize("kind", ["normal", "quant"])
@pytest.mark.parametrize("name", VOLUMES)
def test_volume_convolutions_and_their_gradients_resolve_as_the_fractions(name: str, kind: str) -> None:
    transposed, x_shape, w_shape, stride, pad, dil, out_pad, groups = VOLUMES[name]
    gen = torch.Generator().manual_seed(zlib.crc32(f"volume/{name}/{kind}".encode()))
    x, w = grid(x_shape, gen, torch.float64, 32, kind), grid(w_shape, gen, torch.float64, 32, kind)
    args = (x, w, None, stride, pad, dil, transposed, out_pad, groups)
    gy = grid(tuple(aten.convolution.default(*args).shape), gen, torch.float64, 32, kind)
    out, gi, gw, gb = ref_conv_volume(x, w, gy, stride, pad, dil, groups, transposed)
    check_resolver(aten.convolution.default, args, {}, [flat(out)], 32)
    backward = (gy, x, w, [gy.shape[1]], stride, pad, dil, transposed, out_pad, groups, [True, True, True])
    check_resolver(aten.convolution_backward.default, backward, {}, [flat(gi), flat(gw), flat(gb)], 32)


# -- transcendental functions -----------------------------------------------------------------------

# References evaluate at 300 bits (inside mpmath.workprec, never by changing the global precision).
_PREC = 300


def _gelu_tanh(x):
    c = mpmath.mpf("0.044715")
    return x / 2 * (1 + mpmath.tanh(mpmath.sqrt(2 / mpmath.pi) * (x + c * x**3)))


def _gelu_tanh_grad(x):
    c = mpmath.mpf("0.044715")
    t = mpmath.tanh(mpmath.sqrt(2 / mpmath.pi) * (x + c * x**3))
    return (1 + t) / 2 + x / 2 * (1 - t**2) * mpmath.sqrt(2 / mpmath.pi) * (1 + 3 * c * x**2)


def _phi_cdf(x):
    return mpmath.erfc(-x / mpmath.sqrt(2)) / 2


FUNCTION_OPS: dict[Any, tuple[Callable, str]] = {  # op -> (reference, input domain)
    aten.exp.default: (mpmath.exp, "any"),
    aten.exp2.default: (lambda x: mpmath.mpf(2) ** x, "any"),
    aten.sin.default: (mpmath.sin, "any"),
    aten.cos.default: (mpmath.cos, "any"),
    aten.log.default: (mpmath.log, "positive"),
    aten.log2.default: (lambda x: mpmath.log(x, 2), "positive"),
    aten.log10.default: (lambda x: mpmath.log(x, 10), "positive"),
    aten.tan.default: (mpmath.tan, "any"),
    aten.asin.default: (mpmath.asin, "unit"),
    aten.acos.default: (mpmath.acos, "unit"),
    aten.atan.default: (mpmath.atan, "any"),
    aten.sinh.default: (mpmath.sinh, "any"),
    aten.cosh.default: (mpmath.cosh, "any"),
    aten.asinh.default: (mpmath.asinh, "any"),
    aten.acosh.default: (mpmath.acosh, "above 1"),
    aten.atanh.default: (mpmath.atanh, "unit"),
    aten.erfc.default: (mpmath.erfc, "any"),
    aten.lgamma.default: (mpmath.loggamma, "positive"),
    aten.digamma.default: (mpmath.digamma, "positive"),
    aten.erfinv.default: (mpmath.erfinv, "unit"),
    aten.polygamma.default: (lambda x: mpmath.psi(1, x), "positive"),  # (trigamma: polygamma(1, x))
    aten.tanh.default: (mpmath.tanh, "any"),
    aten.sigmoid.default: (lambda x: 1 / (1 + mpmath.exp(-x)), "any"),
    aten.expm1.default: (mpmath.expm1, "any"),
    aten.log1p.default: (mpmath.log1p, "positive"),
    aten.rsqrt.default: (lambda x: 1 / mpmath.sqrt(x), "positive"),
    aten.erf.default: (mpmath.erf, "any"),
    aten.pow.Tensor_Scalar: (lambda x: x**3, "any"),
    aten.pow.Tensor_Tensor: (lambda x, e: x**e, "positive"),  # (x to the powers g below)
    aten.pow.Scalar: (lambda x: mpmath.mpf(10) ** x, "any"),  # (10 to the powers x)
    aten.atan2.default: (mpmath.atan2, "any"),  # (atan2(g, x))
    aten.gelu.default: (lambda x: x * _phi_cdf(x), "any"),
    aten.gelu_backward.default: (lambda g, x: g * (_phi_cdf(x) + x * mpmath.npdf(x)), "any"),
}


def _exact(fn: Callable, *xs: float) -> Fraction:
    """fn at 300 bits on the exact float inputs, as a Fraction."""
    with mpmath.workprec(_PREC):
        sign, man, exp, _ = fn(*(mpmath.mpf(x) for x in xs))._mpf_  # (sign bit, |mantissa|, exponent, bits)
    return (-1) ** sign * F(int(man)) * F(2) ** int(exp)


@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
@pytest.mark.parametrize("op", list(FUNCTION_OPS), ids=[str(op) for op in FUNCTION_OPS])
def test_functions_match_mpmath(op: Any, dtype: torch.dtype, bits: int) -> None:
    fn, domain = FUNCTION_OPS[op]
    gen = torch.Generator().manual_seed(11)
    x = torch.cat([torch.randn(10, generator=gen, dtype=torch.float64) * 3,
                   torch.tensor([0.0, 2.0**-30, -2.0**-30, 9.5, -9.5, -0.75])])
    x = {"positive": x.abs() + 2.0**-20, "unit": x / 16, "above 1": x.abs() + 1}.get(domain, x)
    x = round_to_grid(x, bits).to(dtype)
    assert domain != "unit" or (x.abs() < 1).all()
    if op in (aten.gelu_backward.default, aten.atan2.default, aten.pow.Tensor_Tensor):
        g = round_to_grid(torch.randn(len(x), generator=gen, dtype=torch.float64), bits).to(dtype)
        args = (x, g) if op is aten.pow.Tensor_Tensor else (g, x)
        exact = [_exact(fn, float(a), float(b)) for a, b in zip(*args)]
    else:
        args = {aten.pow.Tensor_Scalar: (x, 3), aten.pow.Scalar: (10.0, x),
                aten.polygamma.default: (1, x)}.get(op, (x,))
        exact = [_exact(fn, float(v)) for v in x]
    check_resolver(op, args, {}, [exact], bits)


def test_exp2_of_whole_numbers_is_the_exact_power_down_to_the_subnormal_grid_and_its_tie() -> None:
    # 2^k exactly, for k from the largest grid value's exponent down past the smallest subnormal (2^-149 at bits =
    # 32): 2^-150 is the tie between 0 and 2^-149 and rounds to even, 0; half-integers are 2^k sqrt(2)
    x = torch.arange(-152, 128, dtype=torch.float64)
    want = [ref_round_q(F(2) ** int(k), 23) for k in x.tolist()]
    assert resolver_for(aten.exp2.default)((x,), {}, 0, np.arange(len(x)), 32).tolist() == want
    assert want[:4] == [0.0, 0.0, 0.0, 2.0**-149]  # (2^-152, 2^-151, the tie 2^-150, then the smallest subnormal)
    halves = x[::7] + 0.5
    exact = [_exact(lambda v: mpmath.mpf(2) ** v, float(v)) for v in halves]
    check_resolver(aten.exp2.default, (halves,), {}, [exact], 32)


@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
def test_gelu_tanh_forms(dtype: torch.dtype, bits: int) -> None:
    gen = torch.Generator().manual_seed(5)
    x = round_to_grid(torch.randn(12, generator=gen, dtype=torch.float64) * 3, bits).to(dtype)
    g = round_to_grid(torch.randn(12, generator=gen, dtype=torch.float64), bits).to(dtype)
    exact = [_exact(_gelu_tanh, float(v)) for v in x]
    check_resolver(aten.gelu.default, (x,), {"approximate": "tanh"}, [exact], bits)
    exact = [_exact(lambda a, b: a * _gelu_tanh_grad(b), float(a), float(b)) for a, b in zip(g, x)]
    check_resolver(aten.gelu_backward.default, (g, x), {"approximate": "tanh"}, [exact], bits)


# -- certificates -----------------------------------------------------------------------------------

CERT_CASES = [c for c in CASES if c.op in CERTIFIERS]


def _e_at(e: torch.Tensor | None, out: torch.Tensor, pos: torch.Tensor) -> torch.Tensor | None:
    """An op's full bound E (broadcastable to its output) at flat positions, as the engine hands it over."""
    return None if e is None else e.expand(out.shape).reshape(-1)[pos]


def _certify(case: Case, args: tuple, kwargs: dict) -> tuple[list, list]:
    """(outputs, per output the certificate asked at every position: a bool array, or None)."""
    outs = case.op(*args, **kwargs)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    floats = [o if isinstance(o, torch.Tensor) and o.is_floating_point() else None for o in outs]
    bounds = BOUNDS[case.op](args, kwargs, floats)
    certs = []
    for i, o in enumerate(floats):
        pos = torch.arange(0 if o is None else o.numel())
        cert = None if o is None else CERTIFIERS[case.op](args, kwargs, floats, _e_at(bounds[i], o, pos), i, pos)
        assert cert is None or (cert.dtype == torch.bool and cert.shape == (o.numel(),)), (case.name, i)
        certs.append(None if cert is None else cert.numpy())
    return outs, certs


@pytest.mark.parametrize("kind", ["normal", "quant"])
@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
@pytest.mark.parametrize("case", CERT_CASES, ids=[c.name for c in CERT_CASES])
def test_certified_elements_are_exact_on_every_device(case: Case, dtype: torch.dtype, bits: int, kind: str) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/{bits}/{kind}/cert".encode()))
    args, kwargs = case.make(gen, dtype, bits, kind)
    check_sound(case, args, kwargs)


def emulated_outputs(case: Case, args: tuple, kwargs: dict) -> list[list]:
    """The op's outputs on each emulated device that emulates its configuration."""
    others = []
    for dev in EMULATED:
        try:
            res = dev.execute(case.op, args, kwargs)
        except Exception:  # an emulated device that does not emulate this configuration (groups > 1)
            continue
        others.append(list(res) if isinstance(res, tuple) else [res])
    return others


SPIKE = 2.0**-4 + 2.0**-27  # a full 24-bit significand among quantised k/16 data


def spiked(args: tuple, j: int, index: int) -> tuple:
    """args with input j's flat element `index` made SPIKE."""
    out = list(args)
    out[j] = args[j].clone()
    out[j].view(-1)[index] = SPIKE
    return tuple(out)


def check_sound(case: Case, args: tuple, kwargs: dict) -> list:
    """Every certified element equals the exact value on every device; the certificates (as _certify)."""
    outs, certs = _certify(case, args, kwargs)
    expected = case.ref(args, kwargs)
    others = emulated_outputs(case, args, kwargs)
    for i, cert in enumerate(certs):
        if cert is None or outs[i] is None:
            continue
        mask = cert
        exact = np.array([float(q) if q.denominator & (q.denominator - 1) == 0 else math.nan
                          for q in expected[i]])  # dyadic exact values only; others must not be certified
        values = [outs[i]] + [o[i] for o in others]
        for v in values:
            v = v.detach().to(torch.float64).reshape(-1).numpy()
            assert (v[mask] == exact[mask]).all(), (case.name, i)
    return certs


# refused by design: scaled terms; means over 15 and 6 elements and windows clipped by padding (divisors
# not one power of two); repeated rows scaled by their frequency. The nll cases are certified structurally
# (weight None), not by data.
REFUSED = {"addmm-scaled", "mean", "mean-dim", "embedding-backward-scaleTrue",
           *(c.name for c in CASES if "-cip" in c.name)}
MOSTLY = [c for c in CERT_CASES if c.name not in REFUSED and not c.name.startswith("nll")]


@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
@pytest.mark.parametrize("case", MOSTLY, ids=[c.name for c in MOSTLY])
def test_quantised_data_is_mostly_certified(case: Case, dtype: torch.dtype, bits: int) -> None:
    gen = torch.Generator().manual_seed(1)
    args, kwargs = case.make(gen, dtype, bits, "quant")
    outs, certs = _certify(case, args, kwargs)
    fractions = [float(c.mean()) for c in certs if c is not None]
    assert fractions and min(fractions) >= 0.9, (case.name, fractions)


# (case, input): every output's grain is taken over that whole input
READ_WHOLE = {("dot", 0), ("dot", 1), ("mv", 1), ("sum", 0), ("sum-dim-empty", 0)}


SPIKE_SEEDS = 6


@pytest.mark.parametrize("seed", range(SPIKE_SEEDS))
@pytest.mark.parametrize("case", MOSTLY, ids=[c.name for c in MOSTLY])
def test_a_spiked_slice_is_refused_where_it_is_read(case: Case, seed: int) -> None:
    # Quantised float32 data with one element of one input made SPIKE (a full 24-bit significand; the
    # certificates do not need grid inputs): sums that read it need more than 24 bits and are
    # rounded, the others stay exact. Certificates read from the wrong row, column, image or channel
    # would certify a rounded sum (check_sound), or refuse everything. Seed s spikes the s-th part of the
    # flat input, so that every image, channel and row block gets one.
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/spike/{seed}".encode()))
    args, kwargs = case.make(gen, torch.float32, 19, "quant")
    plain = case.ref(args, kwargs)
    for j, a in enumerate(args):
        if not (isinstance(a, torch.Tensor) and a.is_floating_point()):
            continue
        lo = seed * a.numel() // SPIKE_SEEDS
        hi = max(lo + 1, (seed + 1) * a.numel() // SPIKE_SEEDS)
        for _ in range(8):  # a spike that some sum reads (a stride may skip elements), where there is one
            spiked_args = spiked(args, j, lo + int(torch.randint(hi - lo, (), generator=gen)))
            changed = [np.array([x != y for x, y in zip(old, new)])
                       for old, new in zip(plain, case.ref(spiked_args, kwargs))]
            if any(ch.any() for ch in changed):
                break
        certs = check_sound(case, spiked_args, kwargs)
        certs = [c for c in certs if c is not None]
        if any(ch.any() for ch in changed):  # read: a grain 2^-27 times finer, too fine for these sums
            assert not all(c.all() for c in certs), (case.name, j)
        if (case.name, j) not in READ_WHOLE:  # other slices hold quantised data only: mostly certified
            assert any(c.any() for c in certs), (case.name, j)


# how the certifiers are made to read whole slices or lines, and to sample them first: (the setting's name in
# resolve, its value for whole readings, for samples). Convolutions sample the slices of large operands only; a
# matmul's certificate samples every line longer than resolve._SAMPLE values.
SAMPLED_FROM = {aten.convolution.default: ("_SAMPLED_SLICES", 1 << 62, 0),
                aten.convolution_backward.default: ("_SAMPLED_SLICES", 1 << 62, 0),
                aten.mm.default: ("_SAMPLE", 1 << 62, 16), aten.addmm.default: ("_SAMPLE", 1 << 62, 16)}
# (lines longer than the sample; addmm-scaled is refused whatever its lines)
SAMPLED_CASES = [c for c in CERT_CASES if c.op in SAMPLED_FROM and c.name not in REFUSED
                 and (c.op not in (aten.mm.default, aten.addmm.default) or "-k40" in c.name)]


@pytest.mark.parametrize("kind", ["normal", "quant", "spiked"])
@pytest.mark.parametrize("case", SAMPLED_CASES, ids=[c.name for c in SAMPLED_CASES])
def test_sampled_slices_certify_as_the_whole_slices(case: Case, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Large convolutions and matmuls bound each slice's or line's grain by its first values before reading it
    # (resolve._certify_slices, _certify_lines): forced here on small ones, the certificates must be those of
    # the whole slices. Quantised data passes the samples, so the slices are then read in full; spiked, a full
    # significand sits after the samples (the last value of every input) and the full reading must refuse
    # what the samples let through.
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/{kind}/sampled".encode()))
    args, kwargs = case.make(gen, torch.float32, 19, "normal" if kind == "normal" else "quant")
    if kind == "spiked":
        for j, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                args = spiked(args, j, a.numel() - 1)
    certs = {}
    setting, whole, sampled = SAMPLED_FROM[case.op]
    for name, value in (("whole", whole), ("sampled", sampled)):
        monkeypatch.setattr(resolve, setting, value)
        certs[name] = _certify(case, args, kwargs)[1]
    for whole, sampled in zip(certs["whole"], certs["sampled"]):
        assert (whole is None) == (sampled is None), case.name
        if whole is not None:
            assert whole.tolist() == sampled.tolist(), case.name
    got = [c for c in certs["sampled"] if c is not None]
    if kind == "quant":  # (the slices were read in full: the samples alone certify nothing)
        assert got and all(c.any() for c in got), case.name
    if kind == "spiked":  # some of them refused after the samples had passed
        assert got and any(c.any() for c in got) and not all(c.all() for c in got), case.name


def test_slice_samples_look_past_a_first_line_of_zeros(monkeypatch: pytest.MonkeyPatch) -> None:
    # A weight gradient whose input rows start with zeros, as ReLU leaves them, over full float32
    # significands: each channel's sample must refuse it, so that no channel is read in full to certify
    # nothing (a first line's samples alone bound nothing there: session 16's resnet-tiny at width 32).
    gen = torch.Generator().manual_seed(16)
    x = round_to_grid(torch.randn(4, 3, 8, 8, generator=gen, dtype=torch.float64), 32)
    x[:, :, 0] = 0
    g = round_to_grid(torch.randn(4, 5, 8, 8, generator=gen, dtype=torch.float64), 32)
    g[:, :, 0] = 0
    w = torch.zeros(5, 3, 3, 3, dtype=torch.float64)
    args = (g, x, w, [5], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False])
    op = aten.convolution_backward.default
    outs = list(op(*args))
    floats = [None, outs[1], None]
    e = BOUNDS[op](args, {}, floats)[1].reshape(-1)
    pos = torch.arange(w.numel())
    whole = CERTIFIERS[op](args, {}, floats, e, 1, pos)
    monkeypatch.setattr(resolve, "_SAMPLED_SLICES", 0)
    read, real = [], resolve._slices_min_lsb
    monkeypatch.setattr(resolve, "_slices_min_lsb", lambda t, keys, dim=0: read.append(t.shape) or real(t, keys, dim))
    sampled = CERTIFIERS[op](args, {}, floats, e, 1, pos)
    assert torch.equal(sampled, whole) and not whole.any()
    assert read and g.shape not in read and x.shape not in read  # (samples only: no full reading)


@pytest.mark.parametrize("kind", ["normal", "quant"])
@pytest.mark.parametrize("case", CERT_CASES, ids=[c.name for c in CERT_CASES])
def test_certificate_at_a_few_positions_is_the_certificate_at_all(case: Case, kind: str) -> None:
    # the certifiers gather per distinct row / column / image / channel of the positions asked: a shuffled
    # subset (with repeated rows and columns) must read each position's own slices
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/{kind}/subset".encode()))
    args, kwargs = case.make(gen, torch.float64, 32, kind)
    outs, full = _certify(case, args, kwargs)
    floats = [o if isinstance(o, torch.Tensor) and o.is_floating_point() else None for o in outs]
    bounds = BOUNDS[case.op](args, kwargs, floats)
    for i, want in enumerate(full):
        if floats[i] is None:
            continue
        n = floats[i].numel()
        pos = torch.randperm(n, generator=gen)[:max(1, n // 3)]
        got = CERTIFIERS[case.op](args, kwargs, floats, _e_at(bounds[i], floats[i], pos), i, pos)
        assert (got is None) == (want is None), (case.name, i)
        if got is not None:
            assert got.shape == pos.shape and got.tolist() == want[pos.numpy()].tolist(), (case.name, i)


PRODUCT_CERT_CASES = [c for c in CERT_CASES if c.op in resolve._TERMS or c.op in resolve._LINE_CERTIFIED]


def _terms(op: Any, args: tuple, kwargs: dict, i: int) -> int:
    """The term count k of a sum of products' certificate: a matmul's line length (addmm's mat1), a
    convolution's `resolve._TERMS`."""
    if op in resolve._LINE_CERTIFIED:
        return args[1 if op is aten.addmm.default else 0].shape[-1]
    return resolve._TERMS[op](args, kwargs, i)


@pytest.mark.parametrize("kind", ["normal", "quant", "spiked"])
@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
@pytest.mark.parametrize("case", PRODUCT_CERT_CASES, ids=[c.name for c in PRODUCT_CERT_CASES])
def test_a_sums_value_rules_out_only_what_its_certificate_refuses(case: Case, dtype: torch.dtype, bits: int,
                                                                 kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Given a matmul's or convolution's output values (as the engine holds them, from each device that computes
    # the op), resolve.certify answers as the certifier at every position: a certified sum is exact, a multiple
    # of the grain, so its lowest set bit never rules it out. On float data the values alone rule out many
    # positions (whose certificates then read nothing); quantised data, all certified, is never ruled out; the
    # spike (a full significand as every input's last value) leaves some positions certified, refuses others.
    monkeypatch.setattr(resolve, "_SAMPLED_SLICES", 0)
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/{bits}/{kind}/ruled".encode()))
    args, kwargs = case.make(gen, dtype, bits, "normal" if kind == "normal" else "quant")
    if kind == "spiked":
        for j, a in enumerate(args):
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                args = spiked(args, j, a.numel() - 1)
    outs, certs = _certify(case, args, kwargs)
    floats = [o if isinstance(o, torch.Tensor) and o.is_floating_point() else None for o in outs]
    bounds = BOUNDS[case.op](args, kwargs, floats)
    devices = [outs] + emulated_outputs(case, args, kwargs)
    for i, want in enumerate(certs):
        if want is None:
            continue
        out = floats[i]
        pos = torch.arange(out.numel())
        e = _e_at(bounds[i], out, pos)
        for values in devices:
            got = resolve.certify(case.op, args, kwargs, floats, e, i, pos, values[i].detach().reshape(-1).numpy())
            assert got is not None and got.tolist() == want.tolist(), (case.name, i)
        k = _terms(case.op, args, kwargs, i)
        bound = resolve._sum_bound(e, k, out)
        ruled = resolve._ruled_out(out.reshape(-1).numpy(), bound)  # (the rule a matmul's pass applies too)
        assert not (ruled & want).any(), (case.name, i)
        # (products of float data, none certified: most ruled out at K = 40, fewer at K = 8 or 9, whose sums keep
        # their products' low zeros; grad_bias sums float32 values, exactly, and is certified)
        if kind == "normal" and not want.any():
            assert ruled.mean() >= (0.5 if "-k40" in case.name else 0.1), (case.name, i, ruled.mean())
        if case.op not in resolve._FACTORS:
            continue
        # and then the samples of a convolution's slices (`_sampled_out`), which read the operands: they never refuse
        # a certified position either, and refuse every float one
        sampled = resolve._sampled_out(case.op, args, kwargs, bound, out, pos, ruled, i)
        assert not (sampled & want).any() and (sampled | ~ruled).all(), (case.name, i)
        if kind == "normal" and not want.any():
            assert sampled.all(), (case.name, i, sampled.mean())
        if kind == "quant":
            assert want.all() and not sampled.any(), (case.name, i)


# t1 per op: E counts the addmm's three roundings of the bias and alpha, beta and a convolution forward's bias
# term on top of the k = 2 products the certificate takes, so their S must stay lower to be certified
_FIRST_TERM = {aten.addmm.default: 2.0**51 + 2.0**49 + 1, aten.convolution.default: 2.0**52 + 1}


def _two_terms(op: Any) -> tuple[tuple, int]:
    """(args, output index) of `op` summing two terms, an odd t1 (`_FIRST_TERM`, else 2^52 + 2^51 + 1) and 2,
    times ones: the exact sum is odd, so its lsb is the grain q = 1, and S = t1 + 2 lies within a factor 2 of the
    largest S a certificate of two terms passes, so that a rule taking k = 1 refuses it."""
    t = torch.tensor([_FIRST_TERM.get(op, 2.0**52 + 2.0**51 + 1), 2.0], dtype=torch.float64)
    ones = torch.ones(2, dtype=torch.float64)
    if op is aten.mm.default:
        return (t[None], ones[:, None]), 0
    if op is aten.bmm.default:
        return (t[None, None], ones[None, :, None]), 0
    if op is aten.addmm.default:
        return (torch.zeros(1, dtype=torch.float64), t[None], ones[:, None]), 0
    if op is aten.convolution.default:  # one image, one channel, two taps of ones over two values
        return (t.view(1, 1, 2), ones.view(1, 1, 2), None, [1], [0], [1], False, [0], 1), 0
    # grad_weight of a 1-tap convolution over two positions: t as the output gradient, ones as the input
    return (t.view(1, 1, 2), ones.view(1, 1, 2), torch.ones(1, 1, 1, dtype=torch.float64), [0], [1], [0], [1],
            False, [0], 1, [False, True, False]), 1


def _quantise_lines(t: torch.Tensor, dim: int, rows: torch.Tensor, count: int) -> torch.Tensor:
    """t (B, M, K) or (B, K, N) with the first `count` values of the lines along `dim` chosen by `rows` quantised
    (k/16): where all of a line is, its grain is coarse; where its first 16 only are, its samples say so and the
    line's other values do not."""
    t = t.clone()
    lines = t[:, :, :count] if dim == 2 else t[:, :count, :].transpose(1, 2)  # (B, lines, count)
    quantised = torch.randint(-16, 17, lines[:, rows].shape, generator=torch.Generator().manual_seed(3)) / 16
    lines[:, rows] = quantised.to(t.dtype)
    return t


def _layouts(a: torch.Tensor, b: torch.Tensor) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, a, b) through other memory: a's rows across memory and b's columns along it (transposed copies), a
    storage offset, and a's rows broadcast (stride 0)."""
    ta, tb = a.mT.contiguous().mT, b.mT.contiguous().mT
    offset = torch.cat([a[:, :1], a], 1)[:, 1:]
    return [("plain", a, b), ("a^T", ta, b), ("b^T", a, tb), ("both", ta, tb), ("offset", offset, tb),
            ("broadcast", a[:, :1].expand(a.shape), b)]


@pytest.mark.parametrize("k", [40, 9])
@pytest.mark.parametrize("op", sorted(resolve._LINE_CERTIFIED, key=str), ids=str)
@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
def test_a_matmul_certificate_reads_each_positions_own_lines_in_any_layout(op: Any, dtype: torch.dtype, bits: int,
                                                                           k: int,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # A matmul's certificate (resolve._certify_lines) reads each position's row of a and column of b through the
    # operands' strides, the first 16 values first: against the grain of lsb's of contiguous copies in torch, in
    # the layouts a linear layer's passes take (x @ W^T, g @ W, g^T @ x), batched, at a storage offset and
    # broadcast, for positions asked twice. Some lines are quantised whole (certified where a row meets such a
    # column), some in their first 16 values only (the samples pass, the line refuses), one column is all zeros
    # (lsb inf), one holds a NaN (no grain), a subnormal sits in a row, and addmm's bias adds its own grain (one
    # column's far finer than its products': refused there). Off the CPU the positions' own lines are gathered
    # first (`_position_lines`): through it, here on the CPU, the same answers.
    gen = torch.Generator().manual_seed(zlib.crc32(f"{op}/{bits}/{k}/lines".encode()))
    nb = 2 if op is aten.bmm.default else 1
    a = _quantise_lines(grid((nb, 6, k), gen, dtype, bits, "normal"), 2, torch.tensor([0, 1, 4]), k)
    b = _quantise_lines(grid((nb, k, 7), gen, dtype, bits, "normal"), 1, torch.tensor([0, 2, 5]), k)
    a, b = _quantise_lines(a, 2, torch.tensor([2, 5]), 16), _quantise_lines(b, 1, torch.tensor([1, 4]), 16)
    b[:, :, 3] = 0
    b[0, 1, 6] = math.nan
    a[:, 1, 5] = 2.0**-1060 if dtype == torch.float64 else 2.0**-140
    bias = _quantise_lines(grid((1, 1, 7), gen, dtype, bits, "normal"), 1, torch.tensor([0, 1, 2, 3, 4, 5]), 1)[0, 0]
    bias[0] = (1 + 2.0 ** -(bits - 9)) * 2.0**-40  # (a grid value whose lsb is 2^-(bits - 9) 2^-40)
    tiny_lsb = 2.0**-1074 if dtype == torch.float64 else 2.0**-149
    for name, la, lb in _layouts(a, b):
        args = (la, lb) if op is aten.bmm.default else (la[0], lb[0])
        if op is aten.addmm.default:
            args = (bias, *args)
        out = op(*args)
        pos = torch.randperm(out.numel(), generator=gen)
        pos = torch.cat([pos, pos[:9]])
        e = _e_at(BOUNDS[op](args, {}, [out])[0], out, pos)
        n, r, c = np.unravel_index(pos.numpy(), (nb, 6, 7))
        ca, cb = la.contiguous(), lb.contiguous()
        grains = {}
        for reading, count in (("products", k), ("whole", k), ("sampled", 16)):
            q = (resolve.lsb(ca[n, r, :count]).amin(1) * resolve.lsb(cb[n, :count, c]).amin(1)).double()
            if op is aten.addmm.default and reading != "products":
                q = torch.minimum(q, resolve.lsb(bias)[c].double())
            grains[reading] = q.numpy()
        s_upper, p, tiny = resolve._sum_bound(e, k, out)
        want = (s_upper < grains["whole"] * 2.0**p) & (grains["whole"] >= tiny)
        without_bias = (s_upper < grains["products"] * 2.0**p) & (grains["products"] >= tiny)
        assert (without_bias & ~want).any() == (op is aten.addmm.default), name
        held = out.reshape(-1)[pos].numpy()
        for values in (None, held, np.zeros_like(held), np.where(c == 6, math.nan, held)):
            got = CERTIFIERS[op](args, {}, [out], e, 0, pos) if values is None else \
                resolve.certify(op, args, {}, [out], e, 0, pos, values)
            assert got.tolist() == want.tolist(), name
        with monkeypatch.context() as m:  # (the lines read whole, no samples first: the same answers)
            m.setattr(resolve, "_SAMPLE", 1 << 62)
            assert CERTIFIERS[op](args, {}, [out], e, 0, pos).tolist() == want.tolist(), name
        a_op, b_op = args[-2:]
        ga, gb, at, shape = resolve._position_lines(a_op, b_op, pos.numpy(), (nb, 6, 7))
        assert torch.equal(ga[0].nan_to_num(7), ca[n, r].nan_to_num(7)) and torch.equal(gb[0].T.nan_to_num(7),
                                                                                      cb[n, :, c].nan_to_num(7))
        addend = resolve.lsb(bias)[c].double().numpy() if op is aten.addmm.default else None
        gathered = resolve._certify_lines(ga, gb, addend, e, torch.empty(shape, dtype=dtype), torch.from_numpy(at),
                                          held)
        assert gathered.tolist() == want.tolist(), name
        # (what the data makes of the positions: certified ones, ones the samples alone would let through where a
        # row quantised in its samples only is not broadcast away, none through the zeros' and the NaN's columns)
        sampled = (s_upper < grains["sampled"] * 2.0**p) & (grains["sampled"] >= tiny)
        assert want.any() and not want.all(), name
        assert (sampled & ~want).any() == (k > 16) or name == "broadcast", name
        assert want[c == 3].all() and not want[(n == 0) & (c == 6)].any(), name
        # Values whose lowest set bit lies far below every S refuse their positions (a certified sum's would not:
        # these are no device's values), whatever their lines say: all of them where S > 0.
        refused = resolve.certify(op, args, {}, [out], e, 0, pos, np.full(len(pos), tiny_lsb, held.dtype))
        assert refused.tolist() == (want & ~(s_upper >= tiny_lsb * 2.0**p)).tolist(), name
        with pytest.raises(ValueError, match="positions for"):
            resolve.certify(op, args, {}, [out], e, 0, pos, held[1:])
        for outside in (-1, out.numel()):  # (the kernel reads its memos by position, unchecked)
            with pytest.raises(ValueError, match="outside"):
                CERTIFIERS[op](args, {}, [out], e[:1], 0, torch.tensor([outside]))


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
def test_slice_samples_read_each_keys_own_slice_in_any_layout(dim: int, dtype: torch.dtype, bits: int) -> None:
    # A convolution's rule-out (`_sampled_out`) bounds the grain of each position's slices by `_slice_sample`'s values
    # of them, read through the tensor's strides by `_sample_slices`: against lsb's of torch's sample, in contiguous,
    # channels-last and transposed memory and at a storage offset, with one slice's sample quantised (a coarser
    # grain), one all zeros and one holding a NaN (both inf: they refuse nothing).
    gen = torch.Generator().manual_seed(zlib.crc32(f"{bits}/{dim}/slices".encode()))
    t = grid((5, 6, 9, 18), gen, dtype, bits, "normal")
    sample = resolve._slice_sample(t, dim)  # (a view: written through into t)
    sample[1] = (torch.randint(-16, 17, sample[1].shape, generator=gen) / 16).to(dtype)
    sample[2] = 0
    sample[3, 0, 0, 0] = math.nan
    want = resolve.lsb(resolve._slice_sample(t, dim)).reshape(t.shape[dim], -1).amin(1).nan_to_num(math.inf, posinf=math.inf)
    keys = np.array([0, 1, 2, 3, 4, 1, 0, 4], dtype=np.int64)
    layouts = {"plain": t, "channels-last": t.contiguous(memory_format=torch.channels_last),
               "transposed": t.transpose(2, 3).contiguous().transpose(2, 3), "offset": torch.cat([t[:1], t])[1:]}
    for name, lt in layouts.items():
        assert torch.equal(lt.nan_to_num(7.0), t.nan_to_num(7.0)), name  # (the same values, the NaN included)
        bits_, mant = resolve._strided_bits(lt)
        q = np.ones(keys.size)
        resolve._sample_slices(bits_, mant, np.array(lt.shape), np.array(lt.stride()), dim, keys, q)
        assert q.tolist() == want.numpy()[keys].tolist(), name
    assert want[1] > want[0] and want[2] == want[3] == math.inf and want[[0, 4]].isfinite().all()


@pytest.mark.parametrize("op", [*resolve._TERMS, *sorted(resolve._LINE_CERTIFIED, key=str)], ids=str)
def test_a_certified_sum_at_the_limit_is_not_ruled_out(op: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # A certified sum whose S's bound sits between 2^52 and 2^53 times its lsb: the term count k the rule takes
    # (a convolution's `_TERMS`; a matmul's certificate applies it with its own k) must be the certifier's, since
    # with k = 1 instead of 2 the rule would refuse it.
    args, i = _two_terms(op)
    outs = op(*args)
    floats = list(outs) if isinstance(outs, tuple) else [outs]
    floats = [o if j == i else None for j, o in enumerate(floats)]
    out = floats[i]
    pos = torch.zeros(1, dtype=torch.int64)
    e = _e_at(BOUNDS[op](args, {}, floats)[i], out, pos)
    held = out.reshape(-1)[:1].numpy()
    k = _terms(op, args, {}, i)
    assert k == 2 and held[0] == _FIRST_TERM.get(op, 2.0**52 + 2.0**51 + 1) + 2  # (exact: 52 bits at most)
    assert CERTIFIERS[op](args, {}, floats, e, i, pos).tolist() == [True]
    assert resolve.certify(op, args, {}, floats, e, i, pos, held).tolist() == [True]
    assert not resolve._ruled_out(held, resolve._sum_bound(e, k, out)).any()
    assert resolve._ruled_out(held, resolve._sum_bound(e, k - 1, out)).all()  # (the limit is this close)
    if op in resolve._LINE_CERTIFIED:  # (a sample of one value a line: the samples' rule at the same limit)
        monkeypatch.setattr(resolve, "_SAMPLE", 1)
        assert CERTIFIERS[op](args, {}, floats, e, i, pos).tolist() == [True]
        assert resolve.certify(op, args, {}, floats, e, i, pos, held).tolist() == [True]


def test_certificate_refused_when_terms_need_more_than_53_bits() -> None:
    a = torch.tensor([[1.0, 2.0**-30]], dtype=torch.float64)
    b = torch.full((2, 1), 1 + 2.0**-23, dtype=torch.float64)  # exact sum 1 + 2^-23 + 2^-30 + 2^-53: 54 bits
    out = a @ b
    pos = torch.zeros(1, dtype=torch.int64)
    (e,) = BOUNDS[aten.mm.default]((a, b), {}, [out])
    cert = CERTIFIERS[aten.mm.default]((a, b), {}, [out], _e_at(e, out, pos), 0, pos)
    assert cert.tolist() == [False]
    assert F(float(out)) != sum(F(x) * F(y) for x, y in zip(a[0].tolist(), b[:, 0].tolist()))  # really inexact
    # one bit fewer (2^-29 instead of 2^-30: 53 bits) is exact and certified
    a[0, 1] = 2.0**-29
    out = a @ b
    (e,) = BOUNDS[aten.mm.default]((a, b), {}, [out])
    cert = CERTIFIERS[aten.mm.default]((a, b), {}, [out], _e_at(e, out, pos), 0, pos)
    assert cert.tolist() == [True]


def test_mean_certified_only_for_power_of_two_counts() -> None:
    x = torch.tensor([[0.5, 0.25, 1.0, 2.0], [1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    for cols, want in ((4, True), (3, False)):
        args = (x[:, :cols], [1])
        outs = [aten.mean.dim(*args)]
        pos = torch.arange(2)
        cert = CERTIFIERS[aten.mean.dim](args, {}, outs, _e_at(BOUNDS[aten.mean.dim](args, {}, outs)[0], outs[0], pos),
                                         0, pos)
        assert (cert is not None and cert.tolist() == [True, True]) == want


def test_lsb() -> None:
    x = torch.tensor([0.0, 1.0, -6.0, 0.375, 2.0**-1000, 3 * 2.0**60, 1 + 2.0**-52], dtype=torch.float64)
    assert resolve.lsb(x).tolist() == [math.inf, 1.0, 2.0, 0.125, 2.0**-1000, 2.0**60, 2.0**-52]
    assert resolve.lsb(x.to(torch.float32)[1:4]).tolist() == [1.0, 2.0, 0.125]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_min_lsb_is_the_minimum_of_lsb_over_each_line(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(31)
    # more lines than a chunk of the transposed path (64) and K not a multiple of its blocks (32)
    x = torch.randn(150, 70, generator=gen, dtype=torch.float64) * 2.0 ** torch.randint(-60, 60, (150, 70), generator=gen)
    x[0] = 0.0  # a line of zeros: inf
    x[1, :5] = torch.tensor([2.0**-1074 * 12, 2.0**-1060, -4.0, 0.0, 1 + 2.0**-52], dtype=torch.float64)  # subnormals
    x[2, 3] = math.inf
    x[5, :3] = torch.tensor([2.0**-149 * 6, 2.0**-140, 8.0])  # float32 subnormals, power of two
    x[3, 7] = math.nan
    x[:, 4] = 0.0
    x = x.to(dtype)
    for a in (x, x.T.contiguous().T):  # row-major and column-major storage
        for dim, lines in ((0, 150), (1, 70)):
            idx = torch.randperm(lines, generator=gen)
            got = resolve.min_lsb(a, idx, dim)
            want = resolve.lsb(a[idx]).amin(1) if dim == 0 else resolve.lsb(a[:, idx]).amin(0)
            assert torch.equal(got.isnan(), want.isnan()), dim
            ok = ~want.isnan()
            assert torch.equal(got[ok], want[ok]), dim


# The certificates read S = sum|terms| off the bound as E / gamma_K, K below: guard that coupling.
TERM_COUNTS: dict[str, Callable[[tuple], list[int]]] = {
    "mm": lambda a: [a[0].shape[1]],
    "bmm": lambda a: [a[0].shape[2]],
    "dot": lambda a: [a[0].numel()],
    "mv": lambda a: [a[0].shape[1]],
    "addmm": lambda a: [a[1].shape[1]],
    "conv2d-s2p1d2g2": lambda a: [a[1][0].numel()],
    "conv1d": lambda a: [a[1][0].numel()],
    "conv-backward": lambda a: [(a[2].shape[0] // a[9]) * a[2][0, 0].numel(),
                                a[0].shape[0] * a[0][0, 0].numel(), a[0].shape[0] * a[0][0, 0].numel()],
    "sum-dims-keepdim": lambda a: [a[0].shape[0] * a[0].shape[2]],
    "mean-dim": lambda a: [a[0].shape[2]],  # E / gamma bounds the mean of |x| (the reference's S / n)
    "avgpool-k2": lambda a: [4],
    "avgpool-k2-backward": lambda a: [4],
    "avgpool-k2s1-backward": lambda a: [4],
    "maxpool-backward": lambda a: [9],
    "embedding-backward-scaleFalse": lambda a: [a[1].numel()],
}


TERM_COUNTS["conv-backward-s1"] = TERM_COUNTS["conv-backward"]


# (case, output) -> whether it resolves as a matmul over im2col columns (resolve._convolution_matmul)
AS_MATMUL = {("conv2d-s2p1d2g2", 0): True, ("conv1d", 0): True, ("conv-backward", 0): False,
             ("conv-backward", 1): True, ("conv-backward", 2): False, ("conv-backward-s1", 0): True,
             ("conv-backward-s1", 1): True, ("conv1d-backward", 0): True, ("conv1d-backward", 1): True}


@pytest.mark.parametrize("dtype,bits", [(torch.float64, 32), (torch.float32, 19)], ids=["f64-b32", "f32-b19"])
@pytest.mark.parametrize("name,i", list(AS_MATMUL), ids=[f"{n}-{i}" for n, i in AS_MATMUL])
def test_convolutions_as_matmuls_round_as_the_gathered_terms(name: str, i: int, dtype: torch.dtype,
                                                              bits: int) -> None:
    case = next(c for c in CASES if c.name == name)
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    args, kwargs = case.make(gen, dtype, bits, "normal")
    out = case.op(*args, **kwargs)
    pos = np.arange((out[i] if isinstance(out, tuple) else out).numel())
    as_matmul = resolve._convolution_matmul(case.op, args, kwargs, i, pos.size)
    assert (as_matmul is not None) == AS_MATMUL[name, i]
    # one position gathers its own terms: fewer values than a copy of every window
    assert resolve._convolution_matmul(case.op, args, kwargs, i, 1) is None
    if as_matmul is None:
        return
    terms = resolve._convolution_terms if case.op is aten.convolution.default else resolve._convolution_backward_terms
    _, part = terms(args, kwargs, i)
    got = resolve._matmul_at(as_matmul, pos, bits)
    assert got.view(np.int64).tolist() == resolve._rounded(part, bits)(pos).view(np.int64).tolist()


@pytest.mark.parametrize("dtype,bits", [(torch.float64, 32), (torch.float32, 19)], ids=["f64-b32", "f32-b19"])
@pytest.mark.parametrize("name", ["conv-backward", "conv-backward-s1", "conv1d-backward"])
def test_weight_gradient_terms_gathered_compiled_as_by_torch(name: str, dtype: torch.dtype, bits: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # a few weight-gradient positions gather their terms (resolve._weight_taps on CPU tensors): the same
    # factors in the same order as torch's indexing, the padding's taps exact zeros
    case = next(c for c in CASES if c.name == name)
    args, kwargs = case.make(torch.Generator().manual_seed(zlib.crc32(name.encode())), dtype, bits, "normal")
    pos = np.array([0, 1, 5, args[2].numel() // 2, args[2].numel() - 1])
    compiled = resolve._convolution_backward_terms(args, kwargs, 1)[1](pos)
    monkeypatch.setattr(resolve, "_views", lambda *ts: None)
    by_torch = resolve._convolution_backward_terms(args, kwargs, 1)[1](pos)
    for got, want in zip(compiled[:2], by_torch[:2]):
        want = want.to(torch.float64).reshape(len(pos), -1)
        assert got.dtype == torch.float64 and torch.equal(got.view(torch.int64), want.contiguous().view(torch.int64))
    assert compiled[2] is None and by_torch[2] is None
    assert bool((compiled[1] == 0).any())  # (the cases pad: some taps read the padding)


def _gathered_case(name: str, i: int, dtype: torch.dtype, bits: int, kind: str) -> tuple:
    """(op, args, kwargs, a few positions of output i) of a convolution case: few enough that the resolver
    gathers each position's terms (resolve._forward_dots, _input_dots, _weight_dots), not a matmul's."""
    case = next(c for c in CASES if c.name == name)
    args, kwargs = case.make(torch.Generator().manual_seed(zlib.crc32(f"{name}/{kind}".encode())), dtype, bits, kind)
    out = case.op(*args, **kwargs)
    size, width = (out[i] if isinstance(out, tuple) else out).numel(), args[1].shape[-1]
    pos = np.array([0, 1, 5, width + 1, 3 * width + 2, size // 2, size - 1])  # (rows 1 and 3: a stride of 2)
    assert resolve._convolution_matmul(case.op, args, kwargs, i, pos.size) is None
    return case, args, kwargs, pos


GATHERED = [("conv2d-s2p1d2g2", 0), ("conv1d", 0), ("conv-backward", 0), ("conv-backward", 1),
            ("conv-backward-s1", 0), ("conv-backward-s1", 1),
            ("conv1d-backward", 0)]  # (its weight gradient has few positions: a matmul over the windows)


@pytest.mark.parametrize("kind", ["normal", "quant"])
@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
@pytest.mark.parametrize("name,i", GATHERED, ids=[f"{n}-{i}" for n, i in GATHERED])
def test_convolution_positions_round_in_the_gathering_kernels_as_the_fractions(
        name: str, i: int, dtype: torch.dtype, bits: int, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # each position's terms summed exactly as they are gathered: on grid data the kernels take every position,
    # so the gathered terms' path (the reference they fall back to) is never asked
    case, args, kwargs, pos = _gathered_case(name, i, dtype, bits, kind)
    want = [ref_round_q(case.ref(args, kwargs)[i][p], bits - 9) for p in pos]
    monkeypatch.setattr(resolve, "_chunked", lambda *a, **k: pytest.fail("fell back to the gathered terms"))
    got = resolver_for(case.op)(args, kwargs, i, pos, bits)
    assert got.dtype == np.float64 and got.tolist() == want


def _record_fallbacks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The positions the convolution kernels hand to the gathered terms' reference (`resolve._chunked`), in order,
    as they are asked."""
    asked: list[int] = []
    chunked = resolve._chunked

    def recorded(ps: np.ndarray, **kw: Any) -> np.ndarray:
        asked.extend(ps.tolist())
        return chunked(ps, **kw)

    monkeypatch.setattr(resolve, "_chunked", recorded)
    return asked


# (a forward convolution, the input gradients of the three backward cases, one weight gradient)
@pytest.mark.parametrize("name,i", GATHERED[::2] + [GATHERED[3]], ids=lambda v: str(v))
def test_convolution_positions_the_kernels_flag_take_the_gathered_reference(name: str, i: int,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # products below 2^-900 are outside TwoProduct's exact range (vtrain.exactdot): image 0's inputs (and
    # gradients) and the weights scaled so that image 0's outputs and every weight-gradient position sum some,
    # the kernels flag those, and the gathered terms' reference (Fractions) gives their values
    case, args, kwargs, pos = _gathered_case(name, i, torch.float64, 32, "normal")
    forward = case.op is aten.convolution.default
    x, w = args[0 if forward else 1].clone(), args[1 if forward else 2] * 2.0**-480
    x[0] *= 2.0**-480
    if forward:
        args = (x, w, *args[2:])
    else:
        g = args[0].clone()
        g[0] *= 2.0**-480
        args = (g, x, w, *args[3:])
    exact = case.ref(args, kwargs)[i]
    want = [ref_round_q(exact[p], 23) for p in pos]
    asked = _record_fallbacks(monkeypatch)
    got = resolver_for(case.op)(args, kwargs, i, pos, 32)
    # (image 0's positions that no tap reaches, in a stride's gaps, sum no terms: exact zeros, not flagged)
    image = len(exact) // x.shape[0]
    flagged = pos.tolist() if (not forward and i == 1) else [p for p in pos.tolist() if p < image and exact[p] != 0]
    assert flagged and asked == flagged and got.tolist() == want


@pytest.mark.parametrize("chunk", [1024, 3])
def test_weight_gradients_flagged_in_their_last_image_take_the_gathered_reference(
        chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # the weight-gradient kernel adds each position's terms image by image (resolve._weight_dots): output channel
    # 0's last-image products leave TwoProduct's range (< 2^-900), so its positions are flagged after their
    # partials took the other images, and the reference gives their values; the other positions, in the same
    # call, are the kernel's, whether all seven positions go at once or three at a time
    monkeypatch.setattr(resolve, "_WEIGHT_CHUNK", chunk)
    case, args, kwargs, pos = _gathered_case("conv-backward", 1, torch.float64, 32, "normal")
    g = args[0].clone()
    g[-1, 0] *= 2.0**-960
    args = (g, *args[1:])
    want = [ref_round_q(case.ref(args, kwargs)[1][p], 23) for p in pos]
    asked = _record_fallbacks(monkeypatch)
    got = resolver_for(case.op)(args, kwargs, 1, pos, 32)
    channel = pos // args[2][0].numel()
    assert 0 < len(asked) < len(pos) and asked == pos[channel == 0].tolist() and got.tolist() == want


def test_weight_gradients_of_float64_factors_keep_their_products_low_parts() -> None:
    # factors off the float32 grid (float32 work's refinement computes in float64): the weight-gradient kernel
    # splits their products (TwoProduct), so a sum near a grid midpoint is decided by a product's low part, and
    # a block is short only where both its factors are. 3 x (1 + 2^-24) / 3 lies just above the midpoint 1 + 2^-24,
    # its float64 product on it. A 3 x 3 filter on a 1 x 1 image, padded: the centre taps of output channel 0 on
    # input channel 0 (the float64 factor in x) and of channel 1 on channel 1 (in the gradient).
    third = (1 + 2.0**-24) / 3
    gy = torch.tensor([[[[3.0]], [[third]]]], dtype=torch.float64)
    x = torch.tensor([[[[third]], [[3.0]]]], dtype=torch.float64)
    w = torch.zeros(2, 2, 3, 3, dtype=torch.float64)
    args = (gy, x, w, [2], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False])
    pos = np.array([4, 31])  # (0, 0, 1, 1) and (1, 1, 1, 1)
    assert resolve._convolution_matmul(aten.convolution_backward.default, args, {}, 1, pos.size) is None
    got = resolver_for(aten.convolution_backward.default)(args, {}, 1, pos, 32)
    want = ref_round_q(F(3) * F(third), 23)
    assert want == 1 + 2.0**-23 and got.tolist() == [want, want]


@pytest.mark.parametrize("name", ["conv-backward", "conv-backward-s1"])
def test_weight_gradient_planes_off_the_short_values_take_two_products_image_by_image(name: str) -> None:
    # resolve._weight_dots multiplies a position's factors as it reads them where both of an image's planes hold
    # short values only (exactdot.short), and splits them (TwoProduct) in the images where one does not: here
    # image 1's input channel 0 and image 0's gradient channel 1 each hold one 53-bit value, and every
    # position, whichever planes it reads, is the Fraction reference's
    case, args, kwargs, _ = _gathered_case(name, 1, torch.float64, 32, "normal")
    g, x = args[0].clone(), args[1].clone()
    x[1, 0, 1, 2], g[0, 1, 0, 1] = 1 / 3, (1 + 2.0**-30) / 7
    args = (g, x, *args[2:])
    per_channel, size = args[2][0].numel(), args[2].numel()  # (output channel 1's positions read g's channel 1)
    pos = np.array([0, 1, 5, per_channel, per_channel + 4, size // 2, size - 1])
    assert resolve._convolution_matmul(case.op, args, kwargs, 1, pos.size) is None
    exact = case.ref(args, kwargs)[1]
    got = resolver_for(case.op)(args, kwargs, 1, pos, 32)
    assert got.tolist() == [ref_round_q(exact[p], 23) for p in pos]


# (images, input channels, height, width, output channels, groups, kernel, stride, padding, dilation, what else)
WEIGHT_GEOMETRIES = {
    "stride3-dilation2-groups3": (2, 3, 9, 8, 3, 3, (2, 3), (3, 2), (1, 2), (2, 1), ""),
    "padding-past-the-kernel": (2, 2, 3, 2, 2, 1, (2, 2), (1, 1), (4, 3), (1, 1), ""),
    "one-row": (3, 2, 1, 11, 2, 1, (1, 3), (1, 2), (0, 1), (1, 1), "1-d"),
    "strided-views": (2, 2, 6, 7, 4, 2, (3, 3), (1, 1), (1, 1), (1, 1), "views"),
    "float32-gradient": (2, 2, 5, 5, 2, 1, (3, 3), (2, 1), (1, 1), (1, 1), "mixed"),
    "unread-53-bit-pixel": (1, 1, 7, 7, 1, 1, (1, 1), (3, 3), (0, 0), (1, 1), "unread"),
    "2304-products-an-image": (1, 1, 48, 48, 1, 1, (3, 3), (1, 1), (1, 1), (1, 1), ""),
}


@pytest.mark.parametrize("name", list(WEIGHT_GEOMETRIES))
def test_weight_gradient_kernel_over_geometries_is_the_exact_sum(name: str) -> None:
    # resolve._weight_dots on every position (called directly: the resolver would take a matmul for this many),
    # grid values of float32 precision at bits 32: every position the kernel's own and the Fraction reference's
    n_img, c_in, h, wd, c_out, groups, k, s, p, d, extra = WEIGHT_GEOMETRIES[name]
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))

    def values(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(torch.float32).to(torch.float64)

    oh, ow = ((size + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i, size in enumerate((h, wd)))
    x, g = values(n_img, c_in, h, wd), values(n_img, c_out, oh, ow)
    if extra == "views":  # every other channel of wider tensors, and a gradient stored transposed
        x = values(n_img, 2 * c_in, h, wd)[:, ::2]
        g = g.transpose(2, 3).contiguous().transpose(2, 3)
    elif extra == "mixed":
        g = g.to(torch.float32)
    elif extra == "unread":  # a stride of 3 reads pixels 0, 3, 6: pixel (1, 1) of the plane is no product's
        x[0, 0, 1, 1] = 1 / 3
    w = torch.zeros(c_out, c_in // groups, *k, dtype=torch.float64)
    args = (g, x, w, [c_out], list(s), list(p), list(d), False, [0, 0], groups, [True, True, True])
    if extra == "1-d":
        args = (g[:, :, 0], x[:, :, 0], w[:, :, 0], [c_out], [s[1]], [p[1]], [d[1]], False, [0], groups,
                [True, True, True])
    pos = np.arange(w.numel())

    def reference(ps: np.ndarray) -> np.ndarray:
        pytest.fail(f"positions {ps.tolist()} flagged on grid data")

    got = resolve._convolution_dots(aten.convolution_backward.default, args, {}, 1, pos, 32, reference)
    exact = _ref_conv_bwd(args, {})[1]
    assert got.tolist() == [ref_round_q(q, 23) for q in exact]


def test_weight_gradients_of_float32_factors_multiply_in_float64() -> None:
    # float32 tensors of 24-bit values (bits 32): a product needs up to 48 bits, so it is exact only in float64
    case, args, kwargs, pos = _gathered_case("conv-backward", 1, torch.float64, 32, "normal")
    args = (args[0].float(), args[1].float(), args[2].float(), *args[3:])
    assert resolve._convolution_matmul(case.op, args, kwargs, 1, pos.size) is None
    exact = case.ref(args, kwargs)[1]
    got = resolver_for(case.op)(args, kwargs, 1, pos, 32)
    assert got.tolist() == [ref_round_q(exact[p], 23) for p in pos]


def test_a_convolution_whose_windows_pass_the_memory_cap_gathers(monkeypatch: pytest.MonkeyPatch) -> None:
    case = next(c for c in CASES if c.name == "conv-backward-s1")
    args, kwargs = case.make(torch.Generator().manual_seed(5), torch.float64, 32, "normal")
    everything = args[2].numel()  # the weight gradient's positions
    assert resolve._convolution_matmul(case.op, args, kwargs, 1, everything) is not None
    monkeypatch.setattr(resolve, "_WINDOWS_MAX", 100)
    assert resolve._convolution_matmul(case.op, args, kwargs, 1, everything) is None


@pytest.mark.parametrize("name", list(TERM_COUNTS))
def test_bound_over_gamma_bounds_the_absolute_sum(name: str) -> None:
    case = next(c for c in CASES if c.name == name)
    gen = torch.Generator().manual_seed(2)
    args, kwargs = case.make(gen, torch.float64, 32, "normal")
    outs = case.op(*args, **kwargs)
    outs = list(outs) if isinstance(outs, tuple) else [outs]
    bounds = BOUNDS[case.op](args, kwargs, outs)
    absargs = tuple(a.abs() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)
    u = 2.0**-53
    for e, s_exact, k in zip(bounds, case.ref(absargs, kwargs), TERM_COUNTS[name](args)):
        s_upper = [F(v) * (1 - k * F(u)) / (k * F(u)) for v in e.reshape(-1).tolist()]
        assert all(su >= s for su, s in zip(s_upper, s_exact)), name
