"""vtrain.grains: whole ops proven exact before any band.

Against the exact references of test_num_resolve (Fractions), on its cases: wherever the whole-op test
says yes, every element of that output is the exact value on every device, and the element certificate
of vtrain.resolve certifies every one of them (so the logs are those the engine wrote without this
test). Quantised data passes it; one value with a full significand in a slice that a sum reads fails it;
the 2^(p-1) limit is strict; infinities, NaN and grains near underflow fail it. In the engine: the same
values and log bytes with and without it, and the schedule of the tests it skips.
"""

from __future__ import annotations

import dataclasses
import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from numkit import without_grains
from test_num_resolve import CASES, GRIDS, Case, _certify, emulated_outputs, spiked
from vtrain import grains, ops
from vtrain.bounds import BOUNDS
from vtrain.devices import get_device
from vtrain.resolve import CERTIFIERS
from vtrain.rounding import RoundedExecution

aten = torch.ops.aten
GRAIN_CASES = [c for c in CASES if c.op in grains.EXACT_ALL]
# whole-op tests that quantised data passes: the others scale their terms (alpha, beta), divide means or
# windows by counts that are no power of two, or add a bias per element (not one per column)
PASSING = [c for c in GRAIN_CASES if c.name in {
    "mm", "addmm", "mm-k40", "addmm-k40", "conv2d-s2p1d2g2", "conv1d", "conv-backward", "conv-backward-s1",
    "conv1d-backward", "sum", "sum-dims-keepdim", "sum-dim-empty", "mean-dim-pow2", "mean-dims-pow2-keepdim",
    "avgpool-k2", "avgpool-k2-backward", "avgpool-k2s1-backward"}]


def check_whole(case: Case, args: tuple, kwargs: dict) -> list[bool | None]:
    """Per output, the whole-op test (None for an output that is not floating); where it passes, every
    element is exact on every device and certified."""
    outs, certs = _certify(case, args, kwargs)
    floats = [o if isinstance(o, torch.Tensor) and o.is_floating_point() else None for o in outs]
    expected = case.ref(args, kwargs)
    others = emulated_outputs(case, args, kwargs)
    passed = []
    for i, o in enumerate(floats):
        ok = None if o is None else grains.EXACT_ALL[case.op](args, kwargs, floats, i)
        passed.append(ok)
        if not ok:
            continue
        exact = [float(q) for q in expected[i]]
        assert all(float(q) == q for q in expected[i]), (case.name, i, "an exact value off float64")
        for v in [o] + [res[i] for res in others]:
            assert v.detach().to(torch.float64).reshape(-1).tolist() == exact, (case.name, i)
        assert certs[i] is not None and certs[i].all(), (case.name, i, "whole op passed, an element not certified")
    return passed


@pytest.mark.parametrize("kind", ["normal", "quant"])
@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
@pytest.mark.parametrize("case", GRAIN_CASES, ids=[c.name for c in GRAIN_CASES])
def test_a_whole_op_that_passes_is_exact_everywhere(case: Case, dtype: torch.dtype, bits: int, kind: str) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/{bits}/{kind}/grains".encode()))
    args, kwargs = case.make(gen, dtype, bits, kind)
    passed = check_whole(case, args, kwargs)
    if kind == "quant" and case in PASSING:
        assert all(ok for ok in passed if ok is not None), case.name
    if case not in PASSING:
        assert not any(passed), case.name


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("case", PASSING, ids=[c.name for c in PASSING])
def test_one_full_significand_in_a_read_slice_fails_it(case: Case, seed: int) -> None:
    # Quantised float32 work (bits 19) with one value made SPIKE: the sums that read it need more than 24
    # bits. An output that one of them belongs to must fail; check_whole proves the others exact.
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/grain-spike/{seed}".encode()))
    args, kwargs = case.make(gen, torch.float32, 19, "quant")
    for j, a in enumerate(args):
        if not (isinstance(a, torch.Tensor) and a.is_floating_point()):
            continue
        spiked_args = spiked(args, j, int(torch.randint(a.numel(), (), generator=gen)))
        passed = check_whole(case, spiked_args, kwargs)
        for i, exact in enumerate(case.ref(spiked_args, kwargs)):
            if exact is not None and any(float(q) != q for q in exact):  # some sum of output i is not a float32
                assert not passed[i], (case.name, j, i)


def _mm_whole(a: list, b: list) -> bool:
    a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return grains.EXACT_ALL[aten.mm.default]((a, b), {}, [a @ b], 0)


def test_the_limit_is_half_the_element_certificates() -> None:
    # a = [1, 2^-k], b = [1 + 2^-23, 1 + 2^-23]: grain 2^-(k + 23), S just above 1 + 2^-23.
    b = [[1 + 2.0**-23], [1 + 2.0**-23]]
    assert not _mm_whole([[1.0, 2.0**-30]], b)  # S / q ~ 2^53: inexact (test_num_resolve shows the 54 bits)
    assert not _mm_whole([[1.0, 2.0**-29]], b)  # ~ 2^52: exact, certified element by element, not here
    assert _mm_whole([[1.0, 2.0**-28]], b)  # ~ 2^51: under the limit
    # the bound on S is min(L1a max|b|, max|a| L1b): here max|a| L1b
    assert _mm_whole([[1.0, 2.0**-28, 0.0, 0.0]], [[1.0], [1.0], [2.0**20], [2.0**20]])


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan"), 2.0**-1030, 2.0**-1000 * 3])
def test_infinities_nan_and_grains_near_underflow_fail_it(bad: float) -> None:
    a = [[1.0, 0.5], [0.25, bad]]
    assert not _mm_whole(a, [[1.0, 2.0], [0.5, 0.0]])
    assert not _mm_whole([[1.0, 0.5]], [[bad], [1.0]])
    x = torch.tensor([[1.0, bad], [2.0, 3.0]], dtype=torch.float64)
    assert not grains.EXACT_ALL[aten.sum.dim_IntList]((x, [0]), {}, [x.sum(0)], 0)


def test_a_grain_near_underflow_fails_it() -> None:
    # Exact sums all, but near underflow E's absolute floor (k 2^-1022) outgrows 2^53 q and the element
    # certificate refuses them (2^-1070): the whole-op test stops well before (QMIN = 2^-1000), so it
    # never passes what an element certificate would refuse, and the log stays what it was.
    b = torch.ones(2, 1, dtype=torch.float64)
    pos = torch.zeros(1, dtype=torch.int64)
    for grain, whole, element in ((2.0**-1070, False, False), (2.0**-1010, False, True), (2.0**-990, True, True)):
        a = torch.full((1, 2), grain, dtype=torch.float64)
        out = a @ b
        (e,) = BOUNDS[aten.mm.default]((a, b), {}, [out])
        assert _mm_whole(a.tolist(), b.tolist()) == whole
        assert CERTIFIERS[aten.mm.default]((a, b), {}, [out], e.reshape(-1)[pos], 0, pos).tolist() == [element]
    # pooling: the grain after the division by the window's 4
    x = torch.full((1, 1, 2, 2), 2.0**-999, dtype=torch.float64)
    for scale, want in ((1.0, False), (2.0, True)):
        args = (x * scale, [2, 2], [2, 2], [0, 0], False, True, None)
        assert grains.EXACT_ALL[aten.avg_pool2d.default](args, {}, [aten.avg_pool2d.default(*args)], 0) == want


def test_a_mean_of_one_element_fails_it() -> None:
    # (n = 1 would leave the element certificate no room for the division's rounding in the mean's E)
    x = torch.full((3, 1), 0.5, dtype=torch.float64)
    assert grains.EXACT_ALL[aten.mean.dim]((x, [1]), {}, [x.mean(1)], 0) is False
    assert grains.EXACT_ALL[aten.mean.dim]((x.expand(3, 2).contiguous(), [1]), {}, [x.mean(1)], 0) is True


def test_zero_lines_and_a_zero_grained_bias_pass_it() -> None:
    a = torch.tensor([[0.0, 0.0], [0.5, 0.25]], dtype=torch.float64)
    b = torch.tensor([[0.0, 1.0], [0.0, 2.0]], dtype=torch.float64)
    for bias in ([0.0, 0.0], [3.0, 0.125]):
        c = torch.tensor(bias, dtype=torch.float64)
        assert grains.EXACT_ALL[aten.addmm.default]((c, a, b), {}, [torch.addmm(c, a, b)], 0)
    # a bias far finer than its column's sum (1 + 2^-60: 61 bits) fails it; added to a column of zero
    # products it is the exact sum
    for bias, want in (([0.0, 2.0**-60], False), ([2.0**-60, 0.0], True)):
        c = torch.tensor(bias, dtype=torch.float64)
        assert grains.EXACT_ALL[aten.addmm.default]((c, a, b), {}, [torch.addmm(c, a, b)], 0) == want


# -- in the engine ----------------------------------------------------------------------------------


def _quantised_layer() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    x = (torch.randint(0, 17, (64, 48), generator=gen) / 16).double()
    w = torch.randn(32, 48, generator=gen, dtype=torch.float64).float().double()
    b = torch.randn(32, generator=gen, dtype=torch.float64).float().double()
    g = torch.randn(64, 32, generator=gen, dtype=torch.float64).float().double()
    return x, w, b, g


def _record_layer(resolution: str) -> tuple[list[torch.Tensor], RoundedExecution]:
    x, w, b, g = _quantised_layer()
    with RoundedExecution(bits=32, device=get_device("cpu"), resolution=resolution) as rx:
        outs = [torch.addmm(b, x, w.T), g.T @ x, g.sum(0)]
    return outs, rx


@pytest.mark.parametrize("resolution", ["log", "exact"])
def test_the_engine_writes_the_same_values_and_log_without_the_band(resolution: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    outs, rx = _record_layer(resolution)
    assert rx.stats["exact_sums"] == sum(o.numel() for o in outs)  # every op passed: no band at all
    assert rx.stats["certified"] == 0 and rx.stats["ambiguous"] == 0
    without_grains(monkeypatch)
    plain_outs, plain = _record_layer(resolution)
    assert plain.stats["exact_sums"] == 0
    assert plain.stats["certified"] > 0  # the quantised sums' ties, certified one by one
    assert all(torch.equal(o, p) for o, p in zip(outs, plain_outs))
    assert rx.log.to_bytes() == plain.log.to_bytes()


def test_failed_tests_are_skipped_on_a_doubling_schedule() -> None:
    calls: list[int] = []

    def exact_all(args: tuple, kwargs: dict, outs: list, i: int) -> bool:
        calls.append(rx.step)
        return rx.step == 32  # the op passes at step 32 only

    spec = dataclasses.replace(ops.classify(aten.mm.default, (), {}), exact_all=exact_all)
    hints: dict = {}
    for t in range(1, 60):
        rx = RoundedExecution(bits=32, device=get_device("cpu"), step=t, grain_hints=hints)
        assert rx._exact_all(spec, (), {}, [], 0) == (t == 32)
    # after f failures running, next tested 2^(f-1) steps after the last (at most 16); a pass starts over
    assert calls == [1, 2, 4, 8, 16, 32, 33, 34, 36, 40, 48]
    calls.clear()
    rx = RoundedExecution(bits=32, device=get_device("cpu"), step=1)  # no hints: tested every time
    for _ in range(3):
        rx._exact_all(spec, (), {}, [], 0)
    assert calls == [1, 1, 1]


def test_nll_loss_without_reduction_records_and_replays() -> None:
    # its total weight is an exact count, with no band at all
    x = torch.randn(6, 5, dtype=torch.float64).float().double()
    y = torch.tensor([0, 1, 2, 3, 4, 0])
    with RoundedExecution(bits=32, device=get_device("cpu"), mode="record") as rx:
        loss = F.nll_loss(x, y, reduction="none")
    with RoundedExecution(bits=32, device=get_device("emu:splitk8-tree"), mode="replay", replay_log=rx.log):
        again = F.nll_loss(x, y, reduction="none")
    assert torch.equal(loss, again) and torch.equal(loss, -x[torch.arange(6), y])
