"""The exact resolution end to end at the op level: RoundedExecution(resolution="exact") gives, on every
device, exactly the correctly rounded exact value in EVERY element — the band test, the certificates and
the recomputation together equal resolving every position exactly (vtrain.resolve, itself tested against
Fraction/mpmath references in test_num_resolve.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vtrain import refine
from vtrain.devices import get_device, list_devices
from vtrain.errors import UnsupportedOpError
from vtrain.grid import round_to_grid
from vtrain.resolve import resolver_for
from vtrain.rounding import RoundedExecution

aten = torch.ops.aten
DEVICES = [d.name for d in list_devices() if d.name == "cpu" or d.name.startswith("emu:")]


def _grid(shape, bits, seed, dtype=torch.float64, quantised=False):
    g = torch.Generator().manual_seed(seed)
    if quantised:   # k/16 data: sums are often exact, and exact ties on grid midpoints are common
        return torch.randint(-16, 17, shape, generator=g).to(dtype) / 16
    return round_to_grid(torch.randn(shape, generator=g, dtype=torch.float64), bits).to(dtype)


def _near_midpoint(x, w, bits, tiny=41):
    """Row 0 of x @ w (and of x's row sums) = 1 + half a grid spacing + 2^-(m + tiny): the work dtype
    sums it to the midpoint exactly on every device (ties-to-even: 1), the exact value rounds up. With
    tiny = 70 float64 sums it to the midpoint too, so float32 work's matmul computed in float64
    (vtrain.refine) must still leave it to the exact resolver."""
    m = bits - 9
    x[0] = 0
    x[0, :3] = torch.tensor([1.0, 2.0 ** -(m + 1), 2.0 ** -(m + tiny)], dtype=x.dtype)
    w[:3, 0] = 1
    return x, w


def _cases(bits, dtype):
    x, w = _near_midpoint(_grid((6, 40), bits, 1, dtype), _grid((40, 7), bits, 3, dtype), bits)
    x70, w70 = _near_midpoint(_grid((6, 40), bits, 1, dtype), _grid((40, 7), bits, 3, dtype), bits, tiny=70)
    q = _grid((6, 40), bits, 2, dtype, quantised=True)
    bias = _grid((7,), bits, 4, dtype)
    img = _grid((2, 3, 8, 8), bits, 5, dtype, quantised=True)
    ker = _grid((4, 3, 3, 3), bits, 6, dtype)
    grad = _grid((2, 4, 8, 8), bits, 7, dtype)
    return {
        "mm": (aten.mm.default, (x, w)),
        "mm-below-float64": (aten.mm.default, (x70, w70)),
        "mm-quantised": (aten.mm.default, (q, w)),
        "addmm": (aten.addmm.default, (bias, q, w)),
        "conv": (aten.convolution.default, (img, ker, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)),
        "conv-backward": (aten.convolution_backward.default,
                          (grad, img, ker, [4], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True])),
        "sum": (aten.sum.dim_IntList, (x, [1])),
        "sum-quantised": (aten.sum.dim_IntList, (q, [1])),
        "mean": (aten.mean.dim, (img, [0, 2, 3], True)),
        "exp": (aten.exp.default, (x,)),
        "tanh": (aten.tanh.default, (x,)),
        "sin": (aten.sin.default, (x,)),
        "cos": (aten.cos.default, (x,)),
        "tan": (aten.tan.default, (x,)),
        "asin": (aten.asin.default, (x * 2.0**-4,)),
        "atanh": (aten.atanh.default, (x * 2.0**-4,)),
        "sinh": (aten.sinh.default, (x,)),
        "acosh": (aten.acosh.default, (q.abs() + 1,)),
        "log10": (aten.log10.default, (q.abs() + 1,)),
        "erfc": (aten.erfc.default, (x,)),
        "lgamma": (aten.lgamma.default, (q.abs() + 1 / 64,)),
        "digamma": (aten.digamma.default, (q.abs() + 1 / 64,)),
        "trigamma": (aten.polygamma.default, (1, q.abs() + 1 / 64)),
        "atan2": (aten.atan2.default, (x, q)),
        "pow": (aten.pow.Tensor_Tensor, (q.abs() + 1, x)),
        "gelu": (aten.gelu.default, (x,)),
    }


@pytest.mark.parametrize("bits,dtype", [(32, torch.float64), (19, torch.float32)])
@pytest.mark.parametrize("name", list(_cases(32, torch.float64)))
def test_every_element_is_the_correctly_rounded_exact_value_on_every_device(name, bits, dtype):
    op, args = _cases(bits, dtype)[name]
    results = []
    for device in DEVICES:
        with RoundedExecution(bits=bits, device=get_device(device), resolution="exact") as rx:
            out = op(*args)
        outs = [o for o in (out if isinstance(out, (tuple, list)) else [out]) if o is not None]
        results.append([o.clone() for o in outs])
        assert rx.stats["checked"] == sum(o.numel() for o in outs)
    first = results[0]
    for device, other in zip(DEVICES[1:], results[1:]):
        for a, b in zip(first, other):
            assert torch.equal(a, b), f"{name}: cpu and {device} differ"
    resolver = resolver_for(op)
    for i, o in enumerate(first):
        every = resolver(args, {}, i, np.arange(o.numel()), bits)
        assert np.array_equal(o.reshape(-1).double().numpy(), every), f"{name}: output {i} is not RNE(exact)"
    # +0, never -0: the sign of an exact zero depends on the summation order
    for o in first:
        assert not torch.signbit(o[o == 0]).any()


def test_scale_grid_makes_elements_ambiguous_and_float64_settles_them(monkeypatch: pytest.MonkeyPatch):
    # FP32 work on a 10-bit grid: devices differ in the last float32 bits, so many elements are near a
    # boundary; computed in float64 (vtrain.refine) almost none are. The statistics show the resolution at
    # work (the test above shows it is right).
    x, w = _grid((32, 64), 19, 11, torch.float32), _grid((64, 32), 19, 12, torch.float32)
    stats = {}
    for widen in (False, True):
        monkeypatch.setattr(refine, "ENABLED", widen)
        with RoundedExecution(bits=19, device=get_device("cpu"), resolution="exact") as rx:
            aten.mm.default(x, w)
        stats[widen] = rx.stats
    assert stats[False]["ambiguous"] > 0 and stats[False]["refined"] == 0
    assert stats[True]["refined"] == 32 * 32 and stats[True]["ambiguous"] < stats[False]["ambiguous"]
    st = stats[False]
    assert st["checked"] == 32 * 32
    assert st["ambiguous"] == st["certified"] + st["recomputed"]
    assert st["by_op"]["aten.mm.default"] == [st["checked"], st["ambiguous"], st["certified"], st["refined"],
                                              st["recomputed"]]


def test_exact_resolution_has_no_replay_mode():
    with pytest.raises(ValueError, match="no log to replay"):
        RoundedExecution(bits=32, device=get_device("cpu"), resolution="exact", mode="replay")


@pytest.mark.parametrize("bits,dtype", [(32, torch.float64), (19, torch.float32)])
def test_weighted_nll_mean_where_the_sum_and_the_total_weight_round_apart(bits, dtype):
    # L = A / W with both sums rounded: cpu's blocked sums round A up and W down, so its value lands
    # beyond a grid midpoint the exact L is just below; the bound must cover the total weight's error
    from fractions import Fraction

    from vtrain import exactmath
    m, p = bits - 9, (53 if dtype == torch.float64 else 24)
    w_small, d = (1 - 2.0 ** -(m + 1)) * 2.0 ** -(p - 1), 1 + 2.0 ** -m
    n = 16
    target = torch.tensor([1, 0, 0] + [1] * (n - 3))
    x = torch.zeros(n, 2, dtype=dtype)
    x[1, 0], x[2, 0] = -1.0, -(1 + 3 * 2.0 ** -m)
    x[[0, *range(3, n)], 1] = -d
    weight = torch.tensor([1.0, w_small], dtype=dtype)
    terms = [(float(x[b, t]), float(weight[t])) for b, t in enumerate(target.tolist())]
    exact = sum(-Fraction(v) * Fraction(w) for v, w in terms) / sum(Fraction(w) for _, w in terms)
    for device in DEVICES:
        with RoundedExecution(bits=bits, device=get_device(device), resolution="exact"):
            loss = torch.nn.functional.nll_loss(x, target, weight=weight)
        assert float(loss) == exactmath.round_fraction(exact, bits), device


def test_a_device_overflow_with_a_finite_exact_value_is_settled_exactly():
    # float32 partial sums overflow on some summation orders only; the exact sum is 0 on every device.
    # An exact value beyond the grid is still a divergence everywhere.
    from vtrain.rounding import NonFiniteError
    a = 1.5 * 2.0 ** 127
    cancelling = torch.tensor([a, a, -a, -a], dtype=torch.float32)
    for device in DEVICES:
        with RoundedExecution(bits=19, device=get_device(device), resolution="exact"):
            total = cancelling.sum()
        assert float(total) == 0.0, device
        with pytest.raises(NonFiniteError), RoundedExecution(bits=19, device=get_device(device), resolution="exact"):
            torch.tensor([a, a], dtype=torch.float64).sum()


def test_an_overflow_beside_an_ambiguous_value_in_an_output_rounded_in_place():
    # The trainer rounds a fresh output in place (RoundedExecution._fused_near), keeping only its values near
    # a boundary. Where one value is off the grid, the others are settled from the op run again: row 1's sum
    # lands on a float32 midpoint on every device (ties-to-even: 1) while its exact value rounds up, so
    # settling it from the already rounded output would miss it; row 0 overflows on the orders that add
    # the two huge values first, and its exact sum is 0.
    big, half = 2.0**1023, 2.0**-24
    x = torch.tensor([[big, big, -big, -big], [1.0, half, 2.0**-70, 0.0]], dtype=torch.float64)
    up = float(np.nextafter(np.float32(1.0), np.float32(2.0)))
    for device in DEVICES:
        with RoundedExecution(bits=32, device=get_device(device), resolution="exact") as rx:
            total = x.sum(dim=1)
        assert total.tolist() == [0.0, up], device
        assert rx.stats["recomputed"] >= 1
        assert rx.stats["rounded"] == rx.stats["checked"] == 2, device  # (counted once, however computed)


FUNCTIONS = {  # (name, inputs on the grid inside the function's domain)
    "tan": lambda x: x, "asin": lambda x: x / 16, "acos": lambda x: x / 16, "atan": lambda x: x,
    "sinh": lambda x: x, "cosh": lambda x: x, "asinh": lambda x: x, "acosh": lambda x: x.abs() + 1,
    "atanh": lambda x: x / 16, "log2": lambda x: x.abs() + 1 / 64, "log10": lambda x: x.abs() + 1 / 64,
    "erfc": lambda x: x, "erfinv": lambda x: x / 16,
    "lgamma": lambda x: x.abs() + 1 / 64,  # (its backward pass: digamma)
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_functions_train_to_the_same_bits_on_every_device(name):
    # Forward and backward (autograd's formulas: cosh for sinh, rsqrt(1 - x^2) for asin, ...), and the in-place
    # form, under `exact` on every device and under the log, its replay on every device.
    from vtrain.roundlog import StepLog

    x = round_to_grid(FUNCTIONS[name](_grid((64,), 32, 21)), 32)

    def run(mode="record", **kw):
        leaf = x.clone().requires_grad_(True)
        with RoundedExecution(bits=32, mode=mode, **kw) as rx:
            y = getattr(torch, name)(leaf)
            (y * torch.linspace(-1, 1, 64, dtype=torch.float64)).sum().backward()
            inplace = getattr(torch.Tensor, name + "_")(x.clone())
        assert torch.equal(inplace, y.detach())
        return (y.detach(), leaf.grad), rx

    (want, rx) = run(device=get_device("cpu"), resolution="exact")
    assert all(torch.equal(t, round_to_grid(t, 32)) and torch.isfinite(t).all() for t in want)
    # (the op and its in-place form checked; erfinv's backward pass computes erfinv again)
    assert rx.stats["by_op"][f"aten.{name}_.default"][0] == 64
    assert rx.stats["by_op"][f"aten.{name}.default"][0] == (128 if name == "erfinv" else 64)
    for device in DEVICES[1:]:
        got, _ = run(device=get_device(device), resolution="exact")
        assert all(torch.equal(a, b) for a, b in zip(got, want)), device
    logged, rx = run(device=get_device("cpu"))
    log = StepLog.from_bytes(rx.log.to_bytes())
    for device in DEVICES:
        got, _ = run(mode="replay", device=get_device(device), replay_log=log)
        assert all(torch.equal(a, b) for a, b in zip(got, logged)), device


def test_polygamma_beyond_trigamma_is_refused_by_name():
    with pytest.raises(UnsupportedOpError, match=r"aten.polygamma.default.*n = 2"), \
            RoundedExecution(bits=32, device=get_device("cpu")):
        torch.polygamma(2, torch.tensor([3.0, 0.5], dtype=torch.float64))


@pytest.mark.parametrize("name", ["lgamma", "digamma"])
def test_lgamma_and_digamma_of_arguments_at_or_below_zero_are_refused_by_name(name):
    # (no library's function is within a few ulps near their negative zeros and poles: no band holds there)
    x = torch.tensor([3.0, 0.5, -1.5], dtype=torch.float64)
    for resolution in ("log", "exact"):
        with pytest.raises(UnsupportedOpError, match=rf"aten.{name}.default.*an argument <= 0"), \
                RoundedExecution(bits=32, device=get_device("cpu"), resolution=resolution):
            getattr(torch, name)(x)


def test_gamma_and_beta_log_densities_and_their_gradients_are_the_same_bits_on_every_device():
    # torch.distributions' log-densities: lgamma of the parameters, xlogy of the values (one parameter against many
    # values: broadcast), and in the backward pass digamma; a KL divergence between Betas: digamma, and trigamma in
    # the backward pass
    from torch import distributions

    x = round_to_grid(torch.rand(16, generator=torch.Generator().manual_seed(3), dtype=torch.float64) + 0.1, 32)
    results = []
    for device in DEVICES:
        c, r, a = (torch.tensor([v], dtype=torch.float64, requires_grad=True) for v in (2.5, 1.5, 0.75))
        with RoundedExecution(bits=32, device=get_device(device), resolution="exact"):
            total = distributions.Gamma(c, r).log_prob(x).sum() + distributions.Beta(a, c).log_prob(x / 2).sum() \
                + distributions.kl_divergence(distributions.Beta(a, c), distributions.Beta(r, c)).sum()
            total.backward()
        results.append([total.detach(), c.grad, r.grad, a.grad])
    assert all(torch.equal(t, round_to_grid(t, 32)) for t in results[0])
    for device, got in zip(DEVICES[1:], results[1:]):
        assert all(torch.equal(a, b) for a, b in zip(got, results[0])), device
    c, r, a = (torch.tensor([v], dtype=torch.float64, requires_grad=True) for v in (2.5, 1.5, 0.75))
    native = distributions.Gamma(c, r).log_prob(x).sum() + distributions.Beta(a, c).log_prob(x / 2).sum() \
        + distributions.kl_divergence(distributions.Beta(a, c), distributions.Beta(r, c)).sum()
    native.backward()
    for got, want in zip(results[0], [native.detach(), c.grad, r.grad, a.grad]):
        assert (got - want).abs().max() <= 2.0**-18 * want.abs().max()  # (each op rounded to FP32's grid)
