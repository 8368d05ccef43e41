"""The model families train bit for bit alike with their views past the rounded execution (vtrain.native_views)
and through it: the same logs, losses and states."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from familykit import family_spec
from vtrain import native_views, rounding
from vtrain.state import state_hash
from vtrain.train import TrainingSession


_LISTED = {getattr(torch.ops.aten, name.split(".")[0]) for name in native_views.VIEWS}


def _train(spec, views: tuple, monkeypatch: pytest.MonkeyPatch) -> tuple:
    monkeypatch.setattr(native_views, "VIEWS", views)
    seen: list[Any] = []  # (every op the rounded execution classifies: all that reach it)
    classify = rounding.classify
    monkeypatch.setattr(rounding, "classify", lambda func, *rest: seen.append(func) or classify(func, *rest))
    s = TrainingSession(spec, "cpu")
    out = [s.step(t, "record") for t in range(1, 4)]
    return [r.log_bytes for r in out], [r.loss for r in out], state_hash(s.state_bytes()), \
        sum(func.overloadpacket in _LISTED for func in seen)


@pytest.mark.parametrize("family,resolution", [("gpt2-tiny", "log"), ("resnet-tiny", "log"), ("gpt2-tiny", "exact")])
def test_training_with_native_views_is_bit_identical(family_data, family: str, resolution: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    spec = family_spec(family, family_data, steps=10, resolution=resolution)
    *native, skipped = _train(spec, native_views.VIEWS, monkeypatch)
    monkeypatch.undo()
    *through, dispatched = _train(spec, (), monkeypatch)
    assert native == through
    assert skipped == 0 and dispatched > 20  # (the views did skip the mode, and there were views to skip)
    assert resolution == "exact" or any(native[0])
