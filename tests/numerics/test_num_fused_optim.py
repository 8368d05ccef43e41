"""The fused optimizer updates (vtrain.fused_optim) step for step against torch's updates through the
dispatch mode: bit-identical parameters and optimizer state."""

from __future__ import annotations

import math

import pytest
import torch

from vtrain import fused
from vtrain.devices import get_device
from vtrain.grid import round_to_grid
from vtrain.fused_optim import RoundedAdam, RoundedAdamW, RoundedSGD
from vtrain.rounding import NonFiniteError, RoundedExecution

CONFIGS = {
    "adam": (RoundedAdam, {"lr": 0.002, "betas": (0.9, 0.999), "eps": 1e-8}),
    "adam-l2": (RoundedAdam, {"lr": 0.01, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.01}),
    "adamw": (RoundedAdamW, {"lr": 0.003, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}),
    "sgd": (RoundedSGD, {"lr": 0.1}),
    "sgd-momentum": (RoundedSGD, {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-4}),
    "sgd-dampening": (RoundedSGD, {"lr": 0.05, "momentum": 0.5, "dampening": 0.25}),
}


def _grid_tensor(shape: tuple[int, ...], gen: torch.Generator, bits: int, scale: float = 1.0) -> torch.Tensor:
    x = torch.randn(shape, generator=gen, dtype=torch.float64) * scale
    x.view(-1)[:7] = torch.tensor([0.0, -0.0, 2.0**-140, -(2.0**-130), 1e-30, 3.0, -1.5], dtype=torch.float64)
    return round_to_grid(x, bits)


def _bits_of(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int64)  # exact, -0.0 included


def _train(name: str, bits: int, fused_on: bool, steps: int, monkeypatch: pytest.MonkeyPatch,
           dtype: torch.dtype = torch.float64) -> list[torch.Tensor]:
    monkeypatch.setattr(fused, "ENABLED", fused_on)
    cls, kwargs = CONFIGS[name]
    gen = torch.Generator().manual_seed(bits)
    params = [torch.nn.Parameter(_grid_tensor(shape, gen, bits).to(dtype)) for shape in ((33, 17), (17,), (3, 4, 5))]
    opt = cls(params, foreach=False, fused=False, **kwargs)
    for t in range(1, steps + 1):
        for p in params:  # gradients of every scale, tiny ones included
            scale = 10.0 ** float(torch.randint(-6, 3, (1,), generator=gen))
            p.grad = _grid_tensor(p.shape, gen, bits, scale=scale).to(dtype)
        with RoundedExecution(bits=bits, device=get_device("cpu"), mode="plain", step=t):
            opt.step()
    state = [v for p in params for v in opt.state[p].values() if isinstance(v, torch.Tensor)]
    return [*params, *state]


@pytest.mark.parametrize("bits", [32, 24, 13])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_fused_update_is_bit_identical_to_the_dispatched_one(name: str, bits: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    got = _train(name, bits, True, 4, monkeypatch)
    want = _train(name, bits, False, 4, monkeypatch)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(_bits_of(a), _bits_of(b)) if a.dtype == torch.float64 else torch.equal(a, b)


def test_the_fused_path_is_taken_and_counted_like_the_dispatched_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import vtrain.fused_optim as fo

    runs = []
    real = fo._run
    monkeypatch.setattr(fo, "_run", lambda *a, **k: runs.append(a[2]) or real(*a, **k))
    counts = {}
    for on in (True, False):
        monkeypatch.setattr(fused, "ENABLED", on)
        for cls, kwargs in CONFIGS.values():
            p = torch.nn.Parameter(torch.ones(10, dtype=torch.float64))
            opt = cls([p], foreach=False, fused=False, **kwargs)
            for t in (1, 2):  # SGD's first step creates the momentum buffer, the second updates it
                p.grad = torch.full((10,), 0.5, dtype=torch.float64)
                with RoundedExecution(bits=32, device=get_device("cpu"), mode="plain", step=t) as rx:
                    opt.step()
                counts.setdefault(on, []).append((rx.stats["rounded"], rx.stats["ops"]))
    assert runs.count("adam") == 3 * 2 and runs.count("sgd") == 3 * 2  # only with the kernels on
    assert counts[True] == counts[False]


def test_a_diverging_update_raises_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    for on in (True, False):
        monkeypatch.setattr(fused, "ENABLED", on)
        p = torch.nn.Parameter(torch.full((4,), 3.0e38, dtype=torch.float64))
        p.grad = torch.full((4,), -1.0, dtype=torch.float64)
        opt = RoundedSGD([p], lr=1e38)
        with pytest.raises(NonFiniteError), RoundedExecution(bits=32, device=get_device("cpu"), mode="plain"):
            opt.step()


@pytest.mark.parametrize("bits", [19, 13])
def test_a_float32_update_rounding_up_to_2_to_the_128_raises_on_both_paths(bits: int,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # float32 work: the grid's largest value plus 3/4 of its spacing, a finite float32, rounds up to 2^128 (inf in
    # float32), which the kernels' roundings report as torch's path does
    import vtrain.fused_optim as fo

    runs = []
    real = fo._run
    monkeypatch.setattr(fo, "_run", lambda *a, **k: runs.append(a[2]) or real(*a, **k))
    spacing = 2.0 ** (127 - (bits - 9))
    for on in (True, False):
        monkeypatch.setattr(fused, "ENABLED", on)
        p = torch.nn.Parameter(torch.full((4,), 2.0**128 - spacing, dtype=torch.float32))
        p.grad = torch.full((4,), -1.0, dtype=torch.float32)
        opt = RoundedSGD([p], lr=0.75 * spacing)
        assert torch.isfinite(p.detach() + 0.75 * spacing).all()
        with pytest.raises(NonFiniteError), RoundedExecution(bits=bits, device=get_device("cpu"), mode="plain"):
            opt.step()
        assert len(runs) == 1  # (the kernels' update with them on, torch's without)


def test_outside_rounded_execution_it_is_torchs_optimizer() -> None:
    gen = torch.Generator().manual_seed(3)
    a = torch.nn.Parameter(torch.randn(8, generator=gen, dtype=torch.float64))
    b = torch.nn.Parameter(a.detach().clone())
    a.grad = b.grad = torch.randn(8, generator=gen, dtype=torch.float64)
    RoundedAdam([a], lr=0.1).step()
    torch.optim.Adam([b], lr=0.1, foreach=False).step()
    assert torch.equal(a, b)


def test_only_the_step_counters_go_through_the_dispatch_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    # numpy views of the tensors (a detach each) and reading the step back are exact: not dispatched
    seen = []
    real = RoundedExecution.__torch_dispatch__
    monkeypatch.setattr(RoundedExecution, "__torch_dispatch__",
                        lambda self, func, *a, **k: seen.append(str(func)) or real(self, func, *a, **k))
    for name in ("adam", "sgd-momentum"):
        cls, kwargs = CONFIGS[name]
        params = [torch.nn.Parameter(torch.ones(5, dtype=torch.float64)) for _ in range(3)]
        opt = cls(params, foreach=False, fused=False, **kwargs)
        for t in (1, 2):
            for p in params:
                p.grad = torch.full((5,), 0.5, dtype=torch.float64)
            seen.clear()
            with RoundedExecution(bits=32, device=get_device("cpu"), mode="plain", step=t):
                opt.step()
            ops = [f for f in seen if not f.startswith("profiler.")]
            assert "aten.detach.default" not in ops and "aten._local_scalar_dense.default" not in ops, ops
            if t == 2:  # (the first step creates the state through the mode: torch's code)
                assert ops == (["aten.add_.Tensor"] * 3 if name == "adam" else []), ops


def test_a_state_leaving_the_grid_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    p = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    p.grad = torch.full((4,), 1e30, dtype=torch.float64)  # (1 - beta2) g^2 ~ 1e57: beyond the FP32 grid
    opt = RoundedAdam([p], lr=0.001)
    with pytest.raises(NonFiniteError, match="adam update of parameter 0.*its state left the grid"), \
            RoundedExecution(bits=32, device=get_device("cpu"), mode="plain"):
        opt.step()


@pytest.mark.parametrize("bits", [31, 25, 24, 23, 19, 13])
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_float32_work_fused_update_is_bit_identical_to_the_dispatched_one(name: str, bits: int,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # float32 work (the scale models): the kernels compute every operation in float32, as torch's float32
    # kernels do with a Python coefficient, and round to the grid in float32
    import vtrain.fused_optim as fo

    runs = []
    real = fo._run
    monkeypatch.setattr(fo, "_run", lambda *a, **k: runs.append(a[2]) or real(*a, **k))
    got = _train(name, bits, True, 4, monkeypatch, torch.float32)
    assert runs  # the fused path was taken
    want = _train(name, bits, False, 4, monkeypatch, torch.float32)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.dtype == torch.float32:
            assert torch.equal(a.detach().contiguous().view(torch.int32), b.detach().contiguous().view(torch.int32))
        else:
            assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["adam-l2", "sgd-momentum"])
def test_float32_coefficients_that_vanish_in_float32_take_torchs_path(name: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # A weight decay or momentum of 1e-46 is 0 in float32, where the kernels would skip its term; torch
    # still computes it (a -0 gradient plus p * 0 is +0; a momentum buffer is kept): torch's path runs, and
    # both agree bit for bit.
    import vtrain.fused_optim as fo

    runs = []
    real = fo._run
    monkeypatch.setattr(fo, "_run", lambda *a, **k: runs.append(a[2]) or real(*a, **k))
    cls, kwargs = CONFIGS[name]
    tiny = {**kwargs, "weight_decay": 1e-46, **({"momentum": 1e-46} if "momentum" in kwargs else {})}
    monkeypatch.setitem(CONFIGS, name, (cls, tiny))
    got = _train(name, 19, True, 3, monkeypatch, torch.float32)
    want = _train(name, 19, False, 3, monkeypatch, torch.float32)
    assert not runs
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a.detach().contiguous().view(torch.int32), b.detach().contiguous().view(torch.int32)) \
            if a.dtype == torch.float32 else torch.equal(a, b)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_group_split_across_threads_updates_as_one_pass(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Float64 updates over a group as one pass in parts on torch's threads (vtrain.omp, parts made small here):
    parameters and state bit-identical to the whole passes'; a parameter whose update leaves the grid is named."""
    from vtrain import omp

    monkeypatch.setattr(omp, "MIN_VALUES", 64)
    torch.set_num_threads(2)
    try:
        split = _train(name, 32, True, 4, monkeypatch)
        monkeypatch.setattr(omp, "ENABLED", False)
        whole = _train(name, 32, True, 4, monkeypatch)
        monkeypatch.setattr(omp, "ENABLED", True)
        for a, b in zip(split, whole, strict=True):
            assert torch.equal(_bits_of(a), _bits_of(b)) if a.dtype == torch.float64 else torch.equal(a, b)
        cls, kwargs = CONFIGS[name]
        params = [torch.nn.Parameter(torch.ones(n, dtype=torch.float64)) for n in (300, 200, 100)]
        for p in params:
            p.grad = torch.full_like(p, 0.5)
        params[1].grad[150] = math.inf
        kind = "adam" if name.startswith("adam") else "sgd"
        with pytest.raises(NonFiniteError, match=f"{kind} update of parameter 1.*left the grid"), \
                RoundedExecution(bits=32, device=get_device("cpu"), mode="plain"):
            cls(params, foreach=False, fused=False, **kwargs).step()
        assert omp.parts(600) == 2  # (the group did split)
    finally:
        torch.set_num_threads(1)
