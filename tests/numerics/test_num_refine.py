"""vtrain.refine: float32 work's device-dependent ops computed in float64 under the exact resolution.

Widening may only change the cost, never a bit: the outputs equal those of the float32 op with every
ambiguous element resolved exactly, on every device (test_num_canonical.py compares every element with the
exact resolver, including a sum that float64 itself rounds to a midpoint). Here: that equality, the output
dtypes, and that it does the work it is there for."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vtrain import exactmath, refine
from vtrain.devices import get_device, list_devices
from vtrain.grid import round_to_grid
from vtrain.rounding import RoundedExecution

aten = torch.ops.aten
DEVICES = [d.name for d in list_devices() if d.name == "cpu" or d.name.startswith("emu:")]
BITS = 19  # 10 mantissa bits: spacing 2^-10 in [1, 2)


def _ops():
    g = torch.Generator().manual_seed(7)

    def grid(*shape):
        return round_to_grid(torch.randn(shape, generator=g, dtype=torch.float64), BITS).float()

    img, ker, grad = grid(4, 3, 8, 8), grid(6, 3, 3, 3), grid(4, 6, 8, 8)
    big = grid(64, 300) * 4
    pool = ([2, 2], [2, 2], [0, 0], False, True, None)
    return {
        "mm": (aten.mm.default, (grid(32, 256), grid(256, 24))),
        "bmm": (aten.bmm.default, (grid(3, 16, 128), grid(3, 128, 8))),
        "addmm": (aten.addmm.default, (grid(24), grid(32, 256), grid(256, 24))),
        "conv": (aten.convolution.default, (img, ker, grid(6), [1, 1], [1, 1], [1, 1], False, [0, 0], 1)),
        "conv-backward": (aten.convolution_backward.default,
                          (grad, img, ker, [6], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True])),
        # the other device-dependent ops: reductions, pooling, transcendental functions, the loss
        "sum": (aten.sum.dim_IntList, (big, [1])),
        "mean": (aten.mean.dim, (big, [0], True)),
        "avg-pool": (aten.avg_pool2d.default, (grad, *pool)),
        "avg-pool-backward": (aten.avg_pool2d_backward.default, (grid(4, 6, 4, 4), grad, *pool)),
        "exp": (aten.exp.default, (big,)),
        "tanh": (aten.tanh.default, (big,)),
        "log": (aten.log.default, (big.abs() + 2.0**-10,)),
        "nll-loss": (aten.nll_loss_forward.default, (big, torch.randint(300, (64,), generator=g), None, 1, -100)),
    }


LINEAR = ("mm", "bmm", "addmm", "conv", "conv-backward")


def _run(op, args, device, enabled, monkeypatch):
    monkeypatch.setattr(refine, "ENABLED", enabled)
    with RoundedExecution(bits=BITS, device=get_device(device), resolution="exact") as rx:
        out = op(*args)
    return [o for o in (out if isinstance(out, (tuple, list)) else [out]) if o is not None], rx.stats


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(_ops()))
def test_widened_outputs_equal_the_exactly_resolved_float32_ones_bit_for_bit(name, device, monkeypatch):
    op, args = _ops()[name]
    on, st_on = _run(op, args, device, True, monkeypatch)
    off, st_off = _run(op, args, device, False, monkeypatch)
    for a, b in zip(on, off, strict=True):
        assert a.dtype == b.dtype == torch.float32
        assert torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b))
    assert st_on["refined"] == st_on["checked"] == st_off["checked"] and st_off["refined"] == 0
    # float64 leaves a small fraction of the float32 op's ambiguous elements (the point: fewer to resolve)
    assert st_on["ambiguous"] <= st_off["ambiguous"]
    if name in LINEAR:
        assert st_off["ambiguous"] > 0 and st_on["ambiguous"] * 4 < st_off["ambiguous"]
    for st in (st_on, st_off):
        assert st["ambiguous"] == st["certified"] + st["recomputed"]
        assert sum(t[3] for t in st["by_op"].values()) == st["refined"]


def test_float64_work_and_the_log_policy_are_never_widened():
    x = round_to_grid(torch.randn(32, 64, dtype=torch.float64), 32)
    w = round_to_grid(torch.randn(64, 32, dtype=torch.float64), 32)
    with RoundedExecution(bits=32, device=get_device("cpu"), resolution="exact") as rx:
        aten.mm.default(x, w)
    assert rx.stats["refined"] == 0
    assert not refine.widens((x, w), {}) and refine.widens((x.float(), w.float()), {})
    # the log policy rounds what the device's float32 op computed: a float64 op would change its values
    x32, w32 = x.float(), w.float()
    with RoundedExecution(bits=BITS, device=get_device("cpu")) as rx:
        out = aten.mm.default(x32, w32)
    assert rx.stats.get("refined", 0) == 0
    assert torch.equal(out, round_to_grid(x32 @ w32, BITS))


def test_in_place_ops_are_widened_like_their_functional_forms():
    # pow with an exponent float32 cannot hold (float32's op would use float32(1.7)) and sigmoid below -88.7
    # (float32's exp(-x) overflows to a 0 that lies outside float32's own bound): the float32 op is wrong
    # there, the float64 op resolved is the correctly rounded value, and an in-place call must give the same
    x = round_to_grid(torch.linspace(-104, 6, 2001, dtype=torch.float64), BITS).float()
    cases = [("pow", aten.pow.Tensor_Scalar, aten.pow_.Scalar, (x.abs() * 2.0**20 + 1,), {"exponent": 1.7}),
             ("sigmoid", aten.sigmoid.default, aten.sigmoid_.default, (x,), {}),
             ("exp", aten.exp.default, aten.exp_.default, (x / 64,), {})]
    for name, op, op_, (t,), extra in cases:
        t = round_to_grid(t.double(), BITS).float()
        args = (t, extra["exponent"]) if extra else (t,)
        with RoundedExecution(bits=BITS, device=get_device("cpu"), resolution="exact") as rx:
            out = op(*args)
            inplace = t.clone()
            returned = op_(inplace, *args[1:])
        assert returned is inplace and inplace.dtype == torch.float32, name
        assert torch.equal(out, inplace), name
        assert rx.stats["refined"] == 2 * t.numel(), name
        want = exactmath.correctly_rounded(name, BITS, t.double().numpy(), **extra)
        assert np.array_equal(out.double().numpy(), want), name


def test_a_call_mixing_float32_and_float64_keeps_torchs_error():
    g32 = torch.ones(4, dtype=torch.float32)
    g64 = torch.ones(4, dtype=torch.float64)
    assert not refine.widens((g32, g64), {}) and not refine.widens((g32,), {"dtype": torch.float64})
    with pytest.raises(RuntimeError):
        with RoundedExecution(bits=BITS, device=get_device("cpu"), resolution="exact"):
            aten.dot.default(g32, g64)
