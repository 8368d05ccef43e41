"""Soundness of policy `bound`: any summation order stays within E of the exact value, so two devices
are always within the band 2E of each other (elementwise)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from vtrain.bounds import BOUNDS, abs_bounds, gamma, unit_roundoff
from vtrain.devices import get_device, list_devices
from vtrain.grid import round_to_grid

aten = torch.ops.aten
EMULATED = [d for d in list_devices() if d.emulated]


def _grid(shape: tuple[int, ...], gen: torch.Generator, dtype: torch.dtype, bits: int, scale: float = 1.0) -> torch.Tensor:
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
    # heavy cancellation in some rows: the case where a fixed tau fails
    return round_to_grid(x, bits).to(dtype)


def _random_order_matmul(a: torch.Tensor, b: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A random permutation of K, random chunk sizes, chunks combined sequentially or by a tree."""
    k = a.shape[1]
    perm = torch.randperm(k, generator=gen)
    a, b = a[:, perm], b[perm]
    cuts = sorted(set(torch.randint(1, k, (int(torch.randint(1, 6, (1,), generator=gen)),), generator=gen).tolist()))
    parts = [a[:, i:j] @ b[i:j] for i, j in zip([0, *cuts], [*cuts, k])]
    if torch.rand(1, generator=gen).item() < 0.5:
        out = parts[0]
        for p in parts[1:]:
            out = out + p
        return out
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    return parts[0]


def _random_order_sum(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Row sums in a random order: permuted, then sequential (cumsum) or chunked."""
    x = x[:, torch.randperm(x.shape[1], generator=gen)]
    if torch.rand(1, generator=gen).item() < 0.5:
        return x.cumsum(1)[:, -1]
    return torch.stack([c.sum(1) for c in x.split(int(torch.randint(1, 9, (1,), generator=gen)), 1)], 1).sum(1)


def _exact_dot_rows(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    # products of grid values are exact in float64 (<= 48 bits); fsum is then correctly rounded
    pa, pb = a.double().numpy(), b.double().numpy()
    return np.array([[math.fsum(pa[i] * pb[:, j]) for j in range(pb.shape[1])] for i in range(pa.shape[0])])


@pytest.mark.parametrize("dtype,bits", [(torch.float32, 19), (torch.float64, 32)])
def test_matmul_reorderings_stay_within_the_band(dtype: torch.dtype, bits: int) -> None:
    gen = torch.Generator().manual_seed(7)
    for k in (3, 64, 200):
        a = _grid((24, k), gen, dtype, bits)
        b = _grid((k, 20), gen, dtype, bits)
        a[0] = -a[1]  # exact cancellation rows: the exact result is 0
        a[2, : k // 2] = 1e3 * a[2, : k // 2]
        results = [d.mm(a, b) for d in [get_device("cpu"), *EMULATED]]
        results += [_random_order_matmul(a, b, gen) for _ in range(12)]
        (e,) = BOUNDS[aten.mm.default]((a, b), {}, [results[0]])
        exact = torch.from_numpy(_exact_dot_rows(a, b))
        for r in results:
            assert ((r.double() - exact).abs() <= e.double() + exact.abs() * 2.0**-53).all()
            for s in results:
                assert ((r.double() - s.double()).abs() <= 2 * e.double()).all()


@pytest.mark.parametrize("dtype,bits", [(torch.float32, 19), (torch.float64, 32)])
def test_sum_reorderings_stay_within_the_band(dtype: torch.dtype, bits: int) -> None:
    gen = torch.Generator().manual_seed(8)
    for n in (2, 33, 1000):
        x = _grid((16, n), gen, dtype, bits, scale=1e3)
        x[0] = torch.cat([x[0, : n // 2], -x[0, : n // 2], x[0, n - n % 2 :] * 0])[:n]
        results = [d.sum(x, [1]) for d in [get_device("cpu"), *EMULATED]]
        results += [_random_order_sum(x, gen) for _ in range(12)]
        (e,) = BOUNDS[aten.sum.dim_IntList]((x, [1]), {}, [results[0]])
        for r in results:
            for s in results:
                assert ((r.double() - s.double()).abs() <= 2 * e.double()).all()


def test_a_transposed_convolution_counts_its_input_channels() -> None:
    # weight (Cin, Cout / groups, k...): an output sums Cin / groups products a tap, 64 here, not Cout = 1.
    # float32 sums 1 + 2^-11 then 62 terms of 1.5 u one at a time, each rounding up by u / 2: 22 u above the
    # midpoint 1 + 2^-11, whose exact value lies 8.5 u below it (review of 2026-12-02)
    u = 2.0**-24
    vals = [1.0, 2.0**-11] + [1.5 * u] * 61 + [-100 * u]
    x = torch.tensor(vals, dtype=torch.float32).reshape(1, 64, 1, 1)
    w = torch.ones(64, 1, 1, 1, dtype=torch.float32)
    args = (x, w, None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1)
    v = aten.convolution.default(*args)
    (e,) = BOUNDS[aten.convolution.default](args, {}, [v])
    err = abs(Fraction(v.item()) - sum(Fraction(t) for t in vals))
    assert err > 16 * u and err <= Fraction(e.item())
    # two groups of 32 input channels, one output channel each: at least gamma_32 of each group's sum of |terms|
    args2 = (x, w, None, [1, 1], [0, 0], [1, 1], True, [0, 0], 2)
    v2 = aten.convolution.default(*args2)
    (e2,) = BOUNDS[aten.convolution.default](args2, {}, [v2])
    for group in range(2):
        assert e2[0, group].item() >= gamma(32, u) * float(x[0, 32 * group:32 * (group + 1)].abs().sum())


def test_conv_softmax_and_loss_orders_stay_within_the_band() -> None:
    gen = torch.Generator().manual_seed(9)
    dtype, bits = torch.float32, 19
    x = _grid((4, 3, 9, 9), gen, dtype, bits)
    w = _grid((5, 3, 3, 3), gen, dtype, bits)
    bias = _grid((5,), gen, dtype, bits)
    conv_args = (x, w, bias, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    g = _grid((4, 5, 9, 9), gen, dtype, bits)
    back_args = (g, x, w, [5], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True])
    logits = _grid((16, 10), gen, dtype, bits, scale=4.0)
    cases = [
        (aten.convolution.default, conv_args),
        (aten.convolution_backward.default, back_args),
        (aten._log_softmax.default, (logits, 1, False)),
        (aten._softmax.default, (logits, 1, False)),
        (aten._softmax.default, (logits.masked_fill(torch.ones(16, 10, dtype=torch.bool).triu(1), float("-inf")), 1,
                                 False)),  # causal masking: exp(-inf) = 0 must not make the bound inf or NaN
        (aten._log_softmax_backward_data.default, (g[:, 0, 0, :].contiguous(),
                                                   round_to_grid(torch.log_softmax(logits[:4, :9], 1), bits), 1, dtype)),
        (aten._softmax_backward_data.default, (g[:, 0, 0, :].contiguous(),
                                               round_to_grid(torch.softmax(logits[:4, :9], 1), bits), 1, dtype)),
        (aten.nll_loss_forward.default, (round_to_grid(torch.log_softmax(logits, 1), bits),
                                         torch.arange(16) % 10, None, 1, -100)),
    ]
    devices = [get_device("cpu"), *EMULATED]
    for func, args in cases:
        outs = [d.execute(func, args, {}) for d in devices]
        outs = [o if isinstance(o, tuple) else (o,) for o in outs]
        bounds = BOUNDS[func](args, {}, list(outs[0]))
        for o1 in outs:
            for o2 in outs:
                for a, b, e in zip(o1, o2, bounds):
                    assert torch.isfinite(e).all(), func
                    assert ((a.double() - b.double()).abs() <= 2 * e.double()).all(), func


@pytest.mark.parametrize("dtype,bits", [(torch.float32, 19), (torch.float64, 32)])
def test_matmul_bound_at_positions_agrees_with_the_full_bound(dtype: torch.dtype, bits: int) -> None:
    from vtrain.bounds import BOUNDS_AT

    gen = torch.Generator().manual_seed(11)
    a = _grid((3, 12, 40), gen, dtype, bits)
    b = _grid((3, 40, 7), gen, dtype, bits)
    bias = _grid((7,), gen, dtype, bits)
    cases = [
        (aten.mm.default, (a[0], b[0]), {}),
        (aten.mm.default, (a[1].T.contiguous().T, b[1].T.contiguous().T), {}),  # strided operands
        (aten.bmm.default, (a, b), {}),
        (aten.addmm.default, (bias, a[2], b[2]), {"beta": 0.5, "alpha": -2.0}),
    ]
    for func, args, kwargs in cases:
        out = func(*args, **kwargs)
        (full,) = BOUNDS[func](args, kwargs, [out])
        pos = torch.arange(out.numel())
        at = BOUNDS_AT[func](args, kwargs, [out], 0, pos)
        full = full.reshape(-1)
        if dtype == torch.float32:
            rel = ((at - full).abs() / full).max()
            assert rel < 64 * unit_roundoff(dtype) * 40, func  # the same sums, in another order
        else:  # the full bound sums in float32, inflated to stay above the float64 sums (see abs_bounds)
            assert (at <= full * (1 + 64 * 2.0**-53 * 40)).all(), func
            assert ((full - at) / full).max() < 2 * 45 * 2.0**-24, func


def _exact_abs_sum(a: np.ndarray, b: np.ndarray) -> list[list[Fraction]]:
    return [[sum((abs(Fraction(float(x)) * Fraction(float(y))) for x, y in zip(row, col)), Fraction(0))
             for col in b.T] for row in a]


@pytest.mark.parametrize("scale", [1.0, 2.0**-140, 2.0**-75, 2.0**50])
def test_float32_abs_sums_bound_the_exact_sums(scale: float, monkeypatch: pytest.MonkeyPatch) -> None:
    # abs_bounds runs float64 work's |A||B| in float32: E must still be at least gamma_K times the exact
    # sum of |terms|, also where products fall below float32's normal range (2^-140, 2^-75: every product
    # is subnormal or zero in float32) and for operands off the float32 grid.
    monkeypatch.setattr("vtrain.bounds._F32_MIN_WORK", 0)  # these small operands take float32 too
    gen = torch.Generator().manual_seed(5)
    a = torch.randn(6, 33, generator=gen, dtype=torch.float64) * scale
    b = torch.randn(33, 5, generator=gen, dtype=torch.float64)
    a[0, :5] = 0.0
    bias = torch.randn(5, generator=gen, dtype=torch.float64) * scale
    exact = _exact_abs_sum(a.numpy(), b.numpy())
    out = [a @ b]  # (abs_bounds reads the outputs' dtype and sizes)
    (got,) = abs_bounds(aten.mm.default, (a, b), {}, [33], out)
    (got_addmm,) = abs_bounds(aten.addmm.default, (bias, a, b), {"beta": -0.5, "alpha": 2.0}, [36], out)
    (got_t,) = abs_bounds(aten.mm.default, (a.T.contiguous().T, b), {}, [33], out)  # transposed operand
    assert got.dtype == torch.float64 and torch.equal(got, got_t)
    # at least what the float64 computation of E gives (gamma_K (1 + 2 gamma_K + 2^-20) times the sum, up to
    # float64 rounding): the float32 sums' inflation must cover their own error, not eat _finish's slack
    g33, g36 = (Fraction(gamma(k, 2.0**-53)) * Fraction(1 + 2 * gamma(k, 2.0**-53) + 2.0**-20) * Fraction(1 - 2.0**-40)
                for k in (33, 36))
    for i in range(6):
        for j in range(5):
            assert Fraction(float(got[i, j])) >= g33 * exact[i][j], (i, j)
            with_bias = 2 * exact[i][j] + abs(Fraction(float(bias[j]))) / 2
            assert Fraction(float(got_addmm[i, j])) >= g36 * with_bias, (i, j)
    if scale == 1.0:  # normal range: within float32's gamma of the float64 sums, not just above them
        want = (a.abs() @ b.abs()) * gamma(33, 2.0**-53)
        assert ((got - want) / want).max() < 64 * 2.0**-24
        monkeypatch.setattr("vtrain.bounds._F32_MIN_WORK", 1 << 30)
        (f64,) = abs_bounds(aten.mm.default, (a, b), {}, [33], out)
        assert not torch.equal(got, f64)  # the float32 path was the one tested above


def test_long_sums_keep_the_float64_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # float32's gamma_k inflates E by 1 + gamma32_(k+2): 7 % at 2^20 terms, infinite at 2^24 (and NaN on zero
    # sums); two devices' E must stay within 25 % of each other for vtrain.valuecode
    monkeypatch.setattr("vtrain.bounds._F32_MIN_WORK", 0)
    gen = torch.Generator().manual_seed(7)
    a, b = torch.randn(3, 4, generator=gen, dtype=torch.float64), torch.randn(4, 2, generator=gen, dtype=torch.float64)
    a[0] = 0.0
    for k in (2**20, 2**24):
        (got,) = abs_bounds(aten.mm.default, (a, b), {}, [k], [a @ b])
        g = gamma(k, 2.0**-53)
        assert torch.equal(got, (a.abs() @ b.abs()) * (g * (1 + 2 * g + 2.0**-20)) + k * 2.0**-1022), k


def test_float32_abs_sums_fall_back_to_float64_near_overflow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("vtrain.bounds._F32_MIN_WORK", 0)  # small as it is, the op tries float32 first
    a = torch.full((2, 3), 2.0**70, dtype=torch.float64)
    b = torch.full((3, 2), 2.0**70, dtype=torch.float64)
    (got,) = abs_bounds(aten.mm.default, (a, b), {}, [3], [a @ b])
    g = gamma(3, 2.0**-53)
    # the float64 path: 3 * 2^140 is past float32's range, and float64 holds it exactly
    assert torch.equal(got, (a @ b) * (g * (1 + 2 * g + 2.0**-20)) + 3 * 2.0**-1022)


def test_torchs_float64_trigamma_lies_within_its_band_of_the_exact_value() -> None:
    # torch's own trigamma cuts its series short: 4.9e-10 relative at worst (x ~ 1.13), far beyond an ulp of float64,
    # so its band is TRIGAMMA_RELATIVE there, checked here against mpmath
    import mpmath

    x = torch.cat([torch.linspace(0.5, 3, 2001, dtype=torch.float64),
                   torch.logspace(-30, 30, 601, dtype=torch.float64)]).float().double()
    y = aten.polygamma.default(1, x)
    (e,) = BOUNDS[aten.polygamma.default]((1, x), {}, [y])
    with mpmath.workprec(200):
        exact = torch.tensor([float(mpmath.psi(1, mpmath.mpf(v))) for v in x.tolist()], dtype=torch.float64)
    assert ((y - exact).abs() <= e).all()
    assert ((y - exact).abs() / exact).max() > 2.0**-32  # (the series' own error: 2^-20 ulps of float64, not a few)


def test_transcendental_bounds_cover_float32_against_float64() -> None:
    # libm-style ops: the float32 result must lie within E of the (much more accurate) float64 one
    # (and out to where float32's exp under- and overflows: torch's float32 sigmoid is 0 below -88.7, where the
    # true value is a float32 subnormal that a device computing e^x / (1 + e^x) returns)
    x = round_to_grid(torch.cat([torch.linspace(-12, 12, 20001, dtype=torch.float64),
                                 torch.linspace(-110, 110, 20001, dtype=torch.float64)]), 31).float()
    g = round_to_grid(torch.randn(x.numel(), generator=torch.Generator().manual_seed(4), dtype=torch.float64),
                      31).float()
    cases = [
        (aten.gelu.default, (x,), {}),
        (aten.gelu.default, (x,), {"approximate": "tanh"}),
        (aten.gelu_backward.default, (g, x), {}),
        (aten.gelu_backward.default, (g, x), {"approximate": "tanh"}),
        (aten.erf.default, (x,), {}),
        (aten.exp.default, (x,), {}),
        (aten.exp2.default, (x,), {}),
        (aten.sin.default, (x,), {}),
        (aten.cos.default, (x,), {}),
        (aten.tan.default, (x,), {}),
        (aten.atan.default, (x,), {}),
        (aten.sinh.default, (x,), {}),
        (aten.cosh.default, (x,), {}),
        (aten.asinh.default, (x,), {}),
        (aten.erfc.default, (x,), {}),
        (aten.asin.default, (x / 128,), {}),
        (aten.acos.default, (x / 128,), {}),
        (aten.atanh.default, (x / 128,), {}),
        (aten.erfinv.default, (x / 128,), {}),
        # (erfinv across (-1, 1), where torch's float32 erfinv errs by up to an ulp, near +-1, of subnormals)
        (aten.erfinv.default, (torch.cat([torch.linspace(-0.99, 0.99, 200001, dtype=torch.float64),
                                          1 - torch.logspace(-7, -1, 2001, dtype=torch.float64),
                                          torch.logspace(-45, -37, 2001, dtype=torch.float64)]).float(),), {}),
        (aten.acosh.default, (x.abs() + 1,), {}),
        (aten.log2.default, (x.abs() + 2.0**-20,), {}),
        (aten.log10.default, (x.abs() + 2.0**-20,), {}),
        (aten.lgamma.default, (x.abs() + 2.0**-20,), {}),
        (aten.digamma.default, (x.abs() + 2.0**-20,), {}),
        (aten.polygamma.default, (1, x.abs() + 2.0**-20), {}),
        # (around digamma's root 1.4616..., where the result cancels, at small arguments, where torch's float32
        # digamma errs most: 2.4 ulps of its terms, and around lgamma's zeros 1 and 2)
        (aten.digamma.default, (torch.linspace(1.46, 1.4632, 20001, dtype=torch.float64).float(),), {}),
        (aten.digamma.default, (torch.linspace(0.01, 0.1, 20001, dtype=torch.float64).float(),), {}),
        (aten.lgamma.default, (torch.linspace(0.999, 1.001, 20001, dtype=torch.float64).float(),), {}),
        (aten.lgamma.default, (torch.linspace(1.999, 2.001, 20001, dtype=torch.float64).float(),), {}),
        (aten.atan2.default, (g, x), {}),
        (aten.pow.Tensor_Tensor, (x.abs() / 16 + 0.5, g), {}),
        (aten.tanh.default, (x,), {}),
        (aten.sigmoid.default, (x,), {}),
    ]
    for func, args, kwargs in cases:
        y32 = func(*args, **kwargs)
        y64 = func(*[a.double() if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
        (e,) = BOUNDS[func](args, kwargs, [y32])
        assert ((y32.double() - y64).abs() <= e.double()).all(), (func, kwargs)



# -- the fast paths compute the very bits of the torch expressions (vtrain.fused kernels, Python floats) ----


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int64) if t.dtype == torch.float64 else t.contiguous().view(torch.int32)


def _softmax_inputs() -> list[tuple[torch.Tensor, int]]:
    gen = torch.Generator().manual_seed(12)
    cases = []
    for shape, dim in (((32, 10), 1), ((32, 10), -1), ((3, 1), 1), ((4, 5, 33), 2), ((2, 700), 1), ((6, 9), 0)):
        for scale in (1.0, 1e-3, 40.0, 2.0**-1060, 1e300):
            cases.append((_grid(shape, gen, torch.float64, 32, scale=scale) if 2.0**-120 <= scale <= 1e30
                          else torch.randn(shape, generator=gen, dtype=torch.float64) * scale, dim))  # (off the grid)
    x = _grid((8, 8), gen, torch.float64, 32)
    cases.append((x.masked_fill(torch.ones(8, 8, dtype=torch.bool).triu(1), float("-inf")), 1))  # causal masking
    special = x.clone()
    special[0, :3] = torch.tensor([0.0, -0.0, 0.0])
    special[1] = -0.0
    special[2, 4] = float("-inf")
    special[3] = float("-inf")  # a fully masked row: NaN from the torch expression, so the kernel declines
    special[4, 1] = float("inf")
    special[5, 2] = float("nan")
    cases.append((special, 1))
    return cases


SOFTMAX_KERNELS = {  # family: (forward op, its kernel, backward op, its kernel)
    "log_softmax": (aten._log_softmax.default, "softmax_bound", aten._log_softmax_backward_data.default,
                    "log_softmax_backward_bound"),
    "softmax": (aten._softmax.default, "softmax_bound", aten._softmax_backward_data.default, "softmax_backward_bound"),
}


@pytest.mark.parametrize("family", list(SOFTMAX_KERNELS))
def test_softmax_kernels_give_the_torch_expressions_bits(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from vtrain import fused

    forward, fwd_kernel, backward, bwd_kernel = SOFTMAX_KERNELS[family]
    taken = []
    for name in (fwd_kernel, bwd_kernel):
        real = getattr(fused, name)
        monkeypatch.setattr(fused, name, lambda *a, real=real, name=name: taken.append(name) or real(*a))
    gen = torch.Generator().manual_seed(13)
    n_cases = 0
    for x, dim in _softmax_inputs():
        y = forward(x, dim, False)
        grad = _grid(x.shape, gen, torch.float64, 32)
        fwd = (forward, (x, dim, False), [y])
        bwd = (backward, (grad, y, dim, torch.float64), [backward(grad, y, dim, torch.float64)])
        for func, args, outs in (fwd, bwd):
            monkeypatch.setattr(fused, "ENABLED", True)
            (fast,) = BOUNDS[func](args, {}, outs)
            monkeypatch.setattr(fused, "ENABLED", False)
            (want,) = BOUNDS[func](args, {}, outs)
            assert fast.dtype == want.dtype and fast.shape == want.shape, func
            assert torch.equal(_bits(fast), _bits(want)), (func, x.shape, dim)
            n_cases += 1
    # every case with the softmax dim last went through a kernel (declined ones included)
    last = sum(dim % x.dim() == x.dim() - 1 for x, dim in _softmax_inputs())
    assert taken.count(fwd_kernel) == taken.count(bwd_kernel) == last
    assert n_cases == 2 * len(_softmax_inputs())


def _rows_near(run, v: torch.Tensor, factor: float, out_is_v: bool) -> tuple:
    """A rounding pass `run` (round_near's arguments, then e_cand, plus) over v's values: (count, first bad, the
    rounded values, the candidates, v's values and E there)."""
    from vtrain.grid import grid_max

    fv = v.numpy().reshape(-1).copy()
    fo = fv if out_is_v else np.empty_like(fv)
    cand, held, e_cand = np.full(fv.size, -7, np.int64), np.full(fv.size, -7.0), np.full(fv.size, -7.0)
    count, bad = run(fv, factor, grid_max(32), fo, cand, held, e_cand, -0.0)
    return count, bad, fo.copy(), cand[:count].copy(), held[:count].copy(), e_cand[:count].copy()


def _band_then_round(e: torch.Tensor) -> object:
    """The two passes the row kernels replace: E in memory, then fused.round_near against it (E gathered at the
    candidates)."""
    from vtrain import fused

    fe = e.contiguous().numpy().reshape(-1)

    def run(fv, factor, limit, fo, cand, held, e_cand, plus):  # noqa: ANN001, ANN202
        count, bad = fused.round_near(fv, fe, factor, 23, limit, fo, cand, held, plus)
        e_cand[:count] = fe[cand[:count]]
        return count, bad

    return run


def _same_bits(a: tuple, b: tuple) -> bool:
    return all(np.array_equal(x.view(np.uint8), y.view(np.uint8)) if isinstance(x, np.ndarray) else x == y
               for x, y in zip(a, b))


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("family", list(SOFTMAX_KERNELS))
def test_softmax_rounding_passes_give_the_band_then_round_bits(family: str, parts: int,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """bounds.ROWS: E computed row by row inside the rounding pass (fused.round_near_softmax and its backward's),
    whole or in parts of whole rows (vtrain.omp), gives the rounding, the candidates, v's values and E there of the
    two passes it replaces, bit for bit: the forward's E the bound's own (the fused kernel's, or the torch
    expression's where that kernel declines), the backward's from the row sums as fused.sums_with_abs adds them."""
    from vtrain import fused, omp
    from vtrain.bounds import ROWS, _finish_factors

    monkeypatch.setattr(omp, "parts", lambda size: parts)
    forward, _, backward, _ = SOFTMAX_KERNELS[family]
    gen = torch.Generator().manual_seed(17)
    n_cases = 0
    for x, dim in _softmax_inputs():
        if dim % x.dim() != x.dim() - 1:
            assert ROWS[forward]((x, dim, False), {}, [forward(x, dim, False)]) is None  # (only the last dim)
            continue
        y = forward(x, dim, False)
        grad = _grid(x.shape, gen, torch.float64, 32, scale=float(torch.rand(1, generator=gen)) * 8)
        gy = backward(grad, y, dim, torch.float64)
        cases = [(ROWS[forward]((x, dim, False), {}, [y]), BOUNDS[forward]((x, dim, False), {}, [y])[0], y)]
        if backward in ROWS:  # (the log-softmax's backward keeps its E in memory)
            # the backward's E from its row sums in fused.sums_with_abs's order (of the products grad p as lines), by
            # softmax_backward_bound's operations written out in numpy (that kernel declines rows with a NaN E)
            n = x.shape[-1]
            total, sabs = fused.sums_with_abs(np.ascontiguousarray((grad * y).reshape(1, -1, n).numpy()), False, 1.0)
            g, p, out = (t.reshape(-1, n).numpy() for t in (grad, y, gy))
            u = unit_roundoff(torch.float64)
            c, floor = _finish_factors(n, u, torch.float64)
            with np.errstate(invalid="ignore", over="ignore"):
                e = (np.abs(p) * ((gamma(n + 1, u) * sabs)[:, None] + u * np.abs(g - total[:, None])) + u * np.abs(out)
                     ) * c + floor
                kernel_e = np.empty_like(e)
                if fused.softmax_backward_bound(g, p, sabs, total, out, kernel_e, u, gamma(n + 1, u), c, floor):
                    assert np.array_equal(kernel_e.view(np.uint8), e.view(np.uint8))
            cases.append((ROWS[backward]((grad, y, dim, torch.float64), {}, [gy]), torch.from_numpy(e), gy))
        for kernel, e, v in cases:
            for factor in (2.0, 2.0**30):  # (2^30: most values candidates)
                for out_is_v in (False, True):
                    want = _rows_near(_band_then_round(e), v, factor, out_is_v)
                    got = _rows_near(kernel, v, factor, out_is_v)
                    assert _same_bits(got, want), (x.shape, factor, out_is_v)
            n_cases += 1
    assert n_cases > 20


def test_nll_loss_scalar_bound_gives_the_tensor_expressions_bits() -> None:
    from vtrain.bounds import _nll_loss_scalars, _nll_loss_tensors

    gen = torch.Generator().manual_seed(14)
    values = [0.0, -0.0, 1.0, 2.0**-1074, 2.0**-1000, 1e-300, 0.1, 3.0, 1e300, 1.7e308, float("inf"), float("nan")]
    values += (torch.randn(12, generator=gen, dtype=torch.float64) * 10.0 ** torch.randint(-5, 5, (12,), generator=gen)
               ).tolist()
    rows = torch.tensor(values, dtype=torch.float64)[torch.randint(len(values), (400, 4), generator=gen)]
    rows[:40, 3] = rows[:40, 1] * (1 + 2.0**-52)  # total close to abstotal: margins near zero, both signs
    rows[40:80, 3] = -rows[40:80, 1]  # negative weights cancelling
    for n in (1, 32, 4096, 2**52):
        for reduction in (1, 2):
            for absloss, abstotal, loss, total in rows.tolist():
                t = [torch.tensor(v, dtype=torch.float64) for v in (absloss, abstotal, loss, total)]
                got = _nll_loss_scalars(n, reduction, absloss, abstotal, loss, total)
                want = _nll_loss_tensors(n, reduction, *t)
                for a, b in zip(got, want):
                    assert a.dtype == b.dtype and a.shape == b.shape == ()
                    same = torch.equal(_bits(a), _bits(b)) or (a.isnan() and b.isnan())  # (no NaN payload promises)
                    assert same, (n, reduction, absloss, abstotal, loss, total, a, b)


def test_nll_loss_bound_takes_the_scalar_path_for_float64_reductions() -> None:
    gen = torch.Generator().manual_seed(15)
    x = torch.log_softmax(_grid((32, 10), gen, torch.float64, 32, scale=3.0), 1)
    target = torch.randint(10, (32,), generator=gen)
    target[:3] = -100
    weight = _grid((10,), gen, torch.float64, 32)  # negative weights too
    for w in (None, weight, weight.abs()):
        for reduction in (1, 2):
            args = (x, target, w, reduction, -100)
            outs = list(aten.nll_loss_forward.default(*args))
            got = BOUNDS[aten.nll_loss_forward.default](args, {}, outs)
            absloss, abstotal = aten.nll_loss_forward.default(-x.abs(), target, None if w is None else w.abs(),
                                                               reduction, -100)
            from vtrain.bounds import _nll_loss_tensors

            want = _nll_loss_tensors(32, reduction, absloss, abstotal, *outs)
            for a, b in zip(got, want):
                assert torch.equal(_bits(a), _bits(b))


def test_sums_pools_and_matmuls_keep_the_previous_formulas_bits() -> None:
    # the previous formulas, written out: gamma times the op on absolute values, then _finish's two steps
    from vtrain.bounds import _finish

    gen = torch.Generator().manual_seed(16)
    for dtype, bits in ((torch.float64, 32), (torch.float32, 19)):
        u = unit_roundoff(dtype)
        x = _grid((6, 7, 5), gen, dtype, bits, scale=100.0)
        for dim, keepdim in (([1], False), ([0, 2], True), ([], False)):
            v = aten.sum.dim_IntList(x, dim, keepdim)
            n = x.numel() if not dim else math.prod(x.shape[d] for d in dim)
            want = _finish(gamma(n, u) * x.abs().sum(dim or [0, 1, 2], keepdim=keepdim).reshape(v.shape), n, u, dtype)
            (got,) = BOUNDS[aten.sum.dim_IntList]((x, dim, keepdim), {}, [v])
            assert torch.equal(_bits(got), _bits(want))
        x32 = _grid((9, 4), gen, torch.float32, bits)  # a float32 input summed into float64
        v = aten.sum.dim_IntList(x32, [0], False, dtype=torch.float64)
        want = _finish(gamma(9, 2.0**-53) * x32.double().abs().sum([0]), 9, 2.0**-53, torch.float64)
        (got,) = BOUNDS[aten.sum.dim_IntList]((x32, [0], False), {"dtype": torch.float64}, [v])
        assert torch.equal(_bits(got), _bits(want))
        img = _grid((2, 3, 6, 6), gen, dtype, bits)
        pooled = aten.avg_pool2d.default(img, [2, 2])
        want = _finish(gamma(5, u) * aten.avg_pool2d.default(img.abs(), [2, 2]), 5, u, dtype)
        (got,) = BOUNDS[aten.avg_pool2d.default]((img, [2, 2]), {}, [pooled])
        assert torch.equal(_bits(got), _bits(want))
        a, b, bias = _grid((5, 33), gen, dtype, bits), _grid((33, 4), gen, dtype, bits), _grid((4,), gen, dtype, bits)
        for func, args, kwargs, k in ((aten.mm.default, (a, b), {}, 33),
                                      (aten.addmm.default, (bias, a, b), {"beta": 0.5, "alpha": -2.0}, 36)):
            absargs = [t.abs() for t in args]
            abskw = {key: abs(val) for key, val in kwargs.items()}
            g, c = gamma(k, u), 1 + 2 * gamma(k, u) + 2.0**-20
            absval = func(*absargs, **abskw)  # float64: one factor for gamma and _finish's inflation
            want = absval * (g * c) + k * 2.0**-1022 if dtype == torch.float64 else _finish(g * absval, k, u, dtype)
            (got,) = BOUNDS[func](args, kwargs, [func(*args, **kwargs)])
            assert torch.equal(_bits(got), _bits(want)), func


@pytest.mark.parametrize("op", [aten.sum.dim_IntList, aten.mean.dim])
def test_float64_reduction_bounds_in_numpy_give_the_torch_expressions_bits(op: object,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Float64 work's sums and means finish E in numpy on their few outputs (bounds._numpy_work): the same IEEE
    # operations as the torch expressions, in the same order. Each sum of |x| source: the CPU device's (kept
    # from its sum), the compiled pass's, torch's; outputs of every rank, zeros, subnormal-scale values, infinity.
    from vtrain import bounds, fused

    monkeypatch.setattr(fused, "BLOCK_SUM_ELEMENTS", 1)  # (the device's sums for these small tensors too)
    gen = torch.Generator().manual_seed(22)
    x = _grid((6, 8, 5, 7), gen, torch.float64, 32, scale=1e3)
    x[0, 0] = 0.0
    x[1, :, :2] *= 2.0**-1000
    x[2, 3, 1, 1] = 0.5 * (x[2, 3, 1, 0] + x[2, 3, 1, 2])  # (any value: v's |v| is in the mean's E)
    big = x.clone()
    big[3, 1, 2, 2] = math.inf
    cpu = get_device("cpu")
    cases = [(t, dim, keep) for t in (x, big) for dim, keep in
             (([0, 2, 3], False), ([0, 2, 3], True), ([3], True), ([2, 3], False), ([0], False), ([0, 1], True),
              ([1], False), ([0, 1, 2, 3], False), ([-1], False))]
    seen = set()
    for t, dim, keep in cases:
        for through_device, fused_sums in ((True, 1 << 15), (False, 1), (False, 1 << 15)):
            monkeypatch.setattr(bounds, "_FUSED_SUM_ELEMENTS", fused_sums)
            got = []
            for numpy_path in (True, False):
                monkeypatch.setattr(bounds, "_numpy_work", lambda v, on=numpy_path: on)
                v = cpu.execute(op, (t, dim, keep), {}) if through_device else op(t, dim, keep)
                kept = fused.take_abs_sums(v)
                if kept is not None:  # (looked at, and handed back for the bound)
                    fused.remember_abs_sums(v, kept)
                seen.add(("device kept its sums", kept is not None) if through_device else ("fused", fused_sums))
                got.append(BOUNDS[op]((t, dim, keep), {}, [v])[0])
            assert got[0].shape == got[1].shape == v.shape, (dim, keep)
            assert torch.equal(_bits(got[0]), _bits(got[1])), (dim, keep, through_device, fused_sums)
    # (the device kept its sums for some layouts, not for others; the compiled pass and torch's sums both ran)
    assert seen == {("device kept its sums", True), ("device kept its sums", False), ("fused", 1), ("fused", 1 << 15)}
    full = {aten.sum.dim_IntList: aten.sum.default, aten.mean.dim: aten.mean.default}[op]
    got = []
    for numpy_path in (True, False):
        monkeypatch.setattr(bounds, "_numpy_work", lambda v, on=numpy_path: on)
        got.append(BOUNDS[full]((x,), {}, [cpu.execute(full, (x,), {})])[0])
    assert got[0].shape == () and torch.equal(_bits(got[0]), _bits(got[1]))
    # which work takes numpy: float64 on the CPU only, never float32 work (its E is float32) nor a tensor that
    # records its gradient (numpy cannot read it)
    monkeypatch.undo()
    assert bounds._numpy_work(x) and not bounds._numpy_work(x.float())
    assert not bounds._numpy_work(x.clone().requires_grad_())
    x32 = x.float()
    (e32,) = BOUNDS[op]((x32, [0, 2, 3], False), {}, [op(x32, [0, 2, 3], False)])
    assert e32.dtype == torch.float32
    with torch.enable_grad():  # E of a mean whose sums record their gradient: torch's expressions
        xg = x.clone().requires_grad_()
        (eg,) = BOUNDS[op]((xg, [0, 2, 3], False), {}, [op(x, [0, 2, 3], False)])
    (e,) = BOUNDS[op]((x, [0, 2, 3], False), {}, [op(x, [0, 2, 3], False)])
    assert torch.equal(_bits(eg.detach()), _bits(e))


@pytest.mark.parametrize("dtype,bits", [(torch.float64, 32), (torch.float32, 19)])
def test_large_sums_bound_the_exact_sums_in_one_pass(dtype: torch.dtype, bits: int) -> None:
    # From vtrain.bounds._FUSED_SUM_ELEMENTS on, sum|x| over all dims but one block of consecutive ones comes
    # from one compiled pass in its own order (vtrain.fused.abs_sum): E must still be at least gamma_n times
    # the exact sum of |x|, and as tight as torch's formula up to the order of the additions.
    from vtrain import fused
    from vtrain.bounds import _finish

    gen = torch.Generator().manual_seed(21)
    x = _grid((8, 64, 80), gen, dtype, bits, scale=1e3)
    x[0, 0] = 0.0
    x[1, :, :40] *= 2.0**-60  # a huge dynamic range in some lines
    u = unit_roundoff(dtype)
    for dim in ([0], [0, 1], [2], [1, 2], [0, 1, 2], [0, 2], [1]):
        v = aten.sum.dim_IntList(x, dim, False)
        n = math.prod(x.shape[d] for d in dim)
        (got,) = BOUNDS[aten.sum.dim_IntList]((x, dim), {}, [v])
        fused_path = fused.abs_sum(x, dim) is not None
        assert fused_path == (dim != [1])  # (which keeps dims 0 and 2: two blocks)
        kept = [d for d in range(3) if d not in dim]
        lines = x.double().abs().permute(*kept, *dim).reshape(v.numel(), n).numpy()
        g = Fraction(gamma(n, u))
        for i, line in enumerate(lines):
            assert Fraction(float(got.reshape(-1)[i])) >= g * Fraction(math.fsum(line)), (dim, i)
        want = _finish(x.abs().sum(dim).mul_(gamma(n, u)), n, u, dtype)  # torch's formula
        assert ((got.double() - want.double()).abs() <= 4 * gamma(n, u) * want.double()).all(), dim
