"""vtrain.native_views: the listed view ops skip the dispatch modes while a rounded execution runs, and only then
(tests/families/test_family_native_views.py: the steps compute the same bits either way)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vtrain import native_views
from vtrain.devices import get_device
from vtrain.rounding import RoundedExecution

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
