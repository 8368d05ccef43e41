"""vtrain.refine: float32 work's ambiguous matmul and convolution elements settled by the op in float64.

The refinement may only change the cost, never a bit: the outputs equal those of resolving every ambiguous
element exactly, on every device (test_num_canonical.py compares every element with the exact resolver,
including a sum that float64 itself rounds to a midpoint). Here: its decision rule on chosen values, and
that it does the work it is there for."""

from __future__ import annotations

import pytest
import torch

from vtrain import refine
from vtrain.devices import get_device, list_devices
from vtrain.grid import grid_max, neighbours, round_to_grid
from vtrain.rounding import RoundedExecution

aten = torch.ops.aten
DEVICES = [d.name for d in list_devices() if d.name == "cpu" or d.name.startswith("emu:")]
BITS = 19  # 10 mantissa bits: spacing 2^-10 in [1, 2)


def _settle(values, e):
    return refine.settle(torch.tensor(values, dtype=torch.float64), torch.tensor(e, dtype=torch.float32), BITS)


def test_settles_only_values_farther_than_the_float64_bound_from_a_boundary():
    mid = 1 + 2.0**-11  # midpoint of 1 and 1 + 2^-10
    e = 2.0**-20  # E of the float32 op: E * 2^-29 = 2^-49 bounds the float64 value's error
    settled, r = _settle([mid, mid + 2.0**-48, mid - 2.0**-48, mid + 2.0**-50, 1.25, -1.25], [e] * 6)
    assert settled.tolist() == [False, True, True, False, True, True]
    assert r.tolist()[1:3] == [1 + 2.0**-10, 1.0] and r.tolist()[4:] == [1.25, -1.25]


def test_a_wide_bound_settles_nothing_near_a_boundary():
    # E * 2^-29 = 2^-12 here: wider than the distance 2^-13 to the midpoint, so the exact value may be across
    settled, _ = _settle([1 + 2.0**-11 + 2.0**-13], [2.0**17])
    assert not settled.any()


def test_never_settles_the_largest_grid_value_or_a_value_that_is_not_finite():
    big = grid_max(BITS)  # its upper boundary is the overflow threshold, which neighbours() does not give
    settled, _ = _settle([big, -big, float("inf"), float("nan"), 1.5], [2.0**-100] * 5)
    assert settled.tolist() == [False, False, False, False, True]


def _ops():
    g = torch.Generator().manual_seed(7)

    def grid(*shape):
        return round_to_grid(torch.randn(shape, generator=g, dtype=torch.float64), BITS).float()

    img, ker, grad = grid(4, 3, 8, 8), grid(6, 3, 3, 3), grid(4, 6, 8, 8)
    return {
        "mm": (aten.mm.default, (grid(32, 256), grid(256, 24))),
        "bmm": (aten.bmm.default, (grid(3, 16, 128), grid(3, 128, 8))),
        "addmm": (aten.addmm.default, (grid(24), grid(32, 256), grid(256, 24))),
        "conv": (aten.convolution.default, (img, ker, grid(6), [1, 1], [1, 1], [1, 1], False, [0, 0], 1)),
        "conv-backward": (aten.convolution_backward.default,
                          (grad, img, ker, [6], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True])),
    }


def _run(op, args, device, enabled, monkeypatch):
    monkeypatch.setattr(refine, "ENABLED", enabled)
    with RoundedExecution(bits=BITS, device=get_device(device), resolution="exact") as rx:
        out = op(*args)
    return [o for o in (out if isinstance(out, (tuple, list)) else [out]) if o is not None], rx.stats


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(_ops()))
def test_refined_outputs_equal_the_exactly_resolved_ones_bit_for_bit(name, device, monkeypatch):
    op, args = _ops()[name]
    on, st_on = _run(op, args, device, True, monkeypatch)
    off, st_off = _run(op, args, device, False, monkeypatch)
    for a, b in zip(on, off, strict=True):
        assert torch.equal(a, b) and torch.equal(torch.signbit(a), torch.signbit(b))
    assert st_on["ambiguous"] == st_off["ambiguous"] > 0
    assert st_on["refined"] > 0 and st_off["refined"] == 0
    # (float64 settles all but a few: the exact recomputations it saves are the point)
    assert st_on["recomputed"] < st_off["recomputed"]
    for st in (st_on, st_off):
        assert st["ambiguous"] == st["certified"] + st["refined"] + st["recomputed"]


def test_float64_work_is_never_refined():
    x = round_to_grid(torch.randn(32, 64, dtype=torch.float64), 32)
    w = round_to_grid(torch.randn(64, 32, dtype=torch.float64), 32)
    with RoundedExecution(bits=32, device=get_device("cpu"), resolution="exact") as rx:
        aten.mm.default(x, w)
    assert rx.stats["refined"] == 0


def test_the_compiled_rule_equals_the_grid_functions():
    # random values near midpoints, with bounds from far too small to far too wide
    g = torch.Generator().manual_seed(3)
    r0 = round_to_grid(torch.randn(20000, generator=g, dtype=torch.float64) * 2.0 ** torch.randint(
        -140, 120, (20000,), generator=g), BITS)
    lower, upper = neighbours(r0, BITS)
    mid = (r0 + upper) * 0.5
    v = mid + (torch.rand(20000, generator=g, dtype=torch.float64) - 0.5) * (upper - r0) * 2.0**-30
    e = (v.abs() * 2.0 ** torch.randint(-40, 0, (20000,), generator=g)).float()
    settled, r = refine.settle(v, e, BITS)
    ref_r = round_to_grid(v, BITS)
    lo, hi = neighbours(ref_r, BITS)
    dist = torch.minimum(v - (lo + ref_r) * 0.5, (ref_r + hi) * 0.5 - v)
    ref = (dist > e.double() * (2.0**-29 * (1 + 2.0**-50))) & (ref_r.abs() < grid_max(BITS))
    assert torch.equal(r, ref_r) and torch.equal(settled, ref)
    assert 0 < int(settled.sum()) < settled.numel()
