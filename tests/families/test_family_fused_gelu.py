"""GPT-2-tiny trains bit for bit alike with vtrain.fused_gelu's three passes and with its written-out GELU: the same
logs, losses and states, in both resolutions (tests/numerics/test_num_fused_gelu.py compares one GELU op by op)."""

from __future__ import annotations

import pytest

from familykit import family_spec
from vtrain import fused_gelu
from vtrain.state import state_hash
from vtrain.train import TrainingSession


def _train(spec, on: bool, monkeypatch: pytest.MonkeyPatch) -> tuple:
    monkeypatch.setattr(fused_gelu, "ENABLED", on)
    passes, run = [], fused_gelu._run
    monkeypatch.setattr(fused_gelu, "_run", lambda *a, **k: (out := run(*a, **k), passes.append(out is not None))[0])
    s = TrainingSession(spec, "cpu")
    out = [s.step(t, "record") for t in range(1, 4)]
    stats = [(r.stats["ops"], r.stats["rounded"]) for r in out]
    return [r.log_bytes for r in out], [r.loss for r in out], state_hash(s.state_bytes()), stats, passes


@pytest.mark.parametrize("resolution", ["log", "exact"])
def test_gpt2_trains_alike_with_the_fused_gelu(family_data, resolution: str, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = family_spec("gpt2-tiny", family_data, steps=10, resolution=resolution)
    logs_on, loss_on, state_on, stats_on, passes_on = _train(spec, True, monkeypatch)
    logs_off, loss_off, state_off, stats_off, passes_off = _train(spec, False, monkeypatch)
    # every GELU (a layer's, three steps) ran its three passes fused, and then none ran
    assert passes_on == [True] * (3 * spec.layers * 3) and passes_off == []
    assert logs_on == logs_off and loss_on == loss_off and state_on == state_off
    assert stats_on == stats_off  # (the same ops and rounded values counted: the passes stand for what they fuse)
