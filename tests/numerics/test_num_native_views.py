"""vtrain.native_views: the listed view ops skip the dispatch modes while a rounded execution runs, and only then
(tests/families/test_family_native_views.py: the steps compute the same bits either way)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vtrain import native_views
from vtrain.audit import audit
from vtrain.devices import get_device
from vtrain.rounding import RoundedExecution
from vtrain.run import Run
from vtrain.spec import load_spec, to_toml
from vtrain.train import train

aten = torch.ops.aten


class _Seen(TorchDispatchMode):
    """Records every op dispatched to it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[Any] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.ops.append(func)
        return func(*args, **(kwargs or {}))


def _views(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # view, t (through transpose and as_strided), transpose, expand: the listed ops a linear layer's step makes
    return x.view(4, 6).t().transpose(0, 1) + 1.0, x.view(1, 24).expand(2, 24)


def _dispatched(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    seen: list[Any] = []
    dispatch = RoundedExecution.__torch_dispatch__

    def recorded(self: RoundedExecution, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        seen.append(func)
        return dispatch(self, func, types, args, kwargs)

    monkeypatch.setattr(RoundedExecution, "__torch_dispatch__", recorded)
    return seen


def test_views_skip_the_rounded_execution_and_only_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.arange(24, dtype=torch.float64)
    seen = _dispatched(monkeypatch)
    assert not native_views.active()
    with RoundedExecution(bits=32, device=get_device("cpu")):
        assert native_views.active()
        with RoundedExecution(bits=32, device=get_device("cpu")):  # (nested: they stand until the outer one leaves)
            pass
        assert native_views.active()
        out = _views(x)
    assert not native_views.active()
    assert seen == [aten.add.Tensor]
    assert torch.equal(out[0], x.reshape(4, 6) + 1.0) and torch.equal(out[1], torch.stack([x, x]))
    # outside a rounded execution every mode sees the views again
    with _Seen() as other:
        _views(x)
    assert {aten.view.default, aten.t.default, aten.transpose.int, aten.expand.default} <= set(other.ops)


def test_the_kernels_go_when_the_execution_fails() -> None:
    with pytest.raises(ZeroDivisionError), RoundedExecution(bits=32, device=get_device("cpu")):
        assert native_views.active()
        raise ZeroDivisionError
    assert not native_views.active()


def test_a_held_block_keeps_the_kernels_across_executions(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.arange(24, dtype=torch.float64)
    seen = _dispatched(monkeypatch)
    with native_views.held():
        assert native_views.active()
        for _ in range(2):  # (a run's steps: each execution leaves them standing)
            with RoundedExecution(bits=32, device=get_device("cpu")):
                out = _views(x)
            assert native_views.active()
    assert not native_views.active()
    assert seen == [aten.add.Tensor, aten.add.Tensor]
    assert torch.equal(out[0], x.reshape(4, 6) + 1.0)
    with pytest.raises(ZeroDivisionError), native_views.held():  # (and they go when the block fails)
        raise ZeroDivisionError
    assert not native_views.active()


def test_a_run_and_its_audit_hold_the_kernels(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # registered once for the run's steps and once for the audit's, not once a step
    registered: list[bool] = []  # (whether the kernels stood already, at each acquire)
    acquire = native_views.acquire
    monkeypatch.setattr(native_views, "acquire", lambda: (registered.append(native_views.active()), acquire())[1])
    spec = load_spec(Path(__file__).resolve().parents[2] / "examples" / "logreg.toml")
    train(spec, tmp_path / "run", spec_toml=to_toml(spec), steps=3)
    audit(Run.open(tmp_path / "run"))
    assert registered.count(False) == 2 and len(registered) == 2 + 2 * 3
    assert not native_views.active()
