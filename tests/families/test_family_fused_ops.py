"""GPT-2-tiny and resnet-tiny train bit for bit alike with vtrain.fused_gelu's and vtrain.fused_norms' passes and
with the written-out forms they fuse: the same logs, losses, states (running statistics included) and counts, in
both resolutions (tests/numerics/test_num_fused_gelu.py and test_num_fused_norms.py compare one op's values one by
one)."""

from __future__ import annotations

import dataclasses

import pytest

from familykit import family_spec
from vtrain import fused, fused_gelu, fused_norms, ops
from vtrain.models.norms import BatchNorm2d, LayerNorm
from vtrain.state import state_hash
from vtrain.train import TrainingSession

MODULES = {"gelu": (fused_gelu, "_run"), "norms": (fused_norms, "_fused")}  # (each one's pass runner)


def _record(spec) -> tuple:
    """Three recording steps: (the session, their results, their logs, losses and the final state's hash)."""
    s = TrainingSession(spec, "cpu")
    out = [s.step(t, "record") for t in range(1, 4)]
    return s, out, [r.log_bytes for r in out], [r.loss for r in out], state_hash(s.state_bytes())


def _train(spec, fused: str, on: bool, monkeypatch: pytest.MonkeyPatch) -> tuple:
    module, runner = MODULES[fused]
    monkeypatch.setattr(module, "ENABLED", on)
    passes, run = [], getattr(module, runner)
    monkeypatch.setattr(module, runner, lambda *a, **k: (out := run(*a, **k), passes.append(out is not None))[0])
    s, out, logs, losses, state = _record(spec)
    stats = [(r.stats["ops"], r.stats["rounded"]) for r in out]
    norms = sum(isinstance(m, (LayerNorm, BatchNorm2d)) for m in s.model.modules())
    return logs, losses, state, stats, passes, norms


@pytest.mark.parametrize("resolution", ["log", "exact"])
@pytest.mark.parametrize("family,fused", [("gpt2-tiny", "gelu"), ("gpt2-tiny", "norms"), ("resnet-tiny", "norms")])
def test_the_families_train_alike_with_the_fused_ops(family_data, family: str, fused: str, resolution: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    spec = family_spec(family, family_data, steps=10, resolution=resolution)
    logs_on, loss_on, state_on, stats_on, passes_on, norms = _train(spec, fused, True, monkeypatch)
    monkeypatch.undo()
    logs_off, loss_off, state_off, stats_off, passes_off, _ = _train(spec, fused, False, monkeypatch)
    # every GELU (one a layer) made its three passes, every layer norm (two a layer and the last) or batch norm (two a
    # block, a projection's and the stem's) its six, fused, in each of three steps; and then none
    per_step = 3 * spec.layers if fused == "gelu" else 6 * norms
    assert norms == (2 * spec.layers + 1 if family == "gpt2-tiny" else 2 * spec.stages * spec.blocks + spec.stages)
    assert passes_on == [True] * (3 * per_step) and passes_off == []
    assert logs_on == logs_off and loss_on == loss_off and state_on == state_off
    assert stats_on == stats_off  # (the same ops and rounded values counted: the passes stand for what they fuse)


def _train_rows(spec, on: bool, monkeypatch: pytest.MonkeyPatch) -> tuple:
    """Three recording steps with the softmax family's band in its rounding pass (bounds.ROWS) or, off, in memory as
    before it (the ops table's entries without `bound_rows`); the passes that took the ops."""
    table = {op: spec_ if on else dataclasses.replace(spec_, bound_rows=None) for op, spec_ in ops._TABLE.items()}
    monkeypatch.setattr(ops, "_TABLE", table)
    passes = []
    for name in ("round_near_softmax", "round_near_softmax_backward"):
        run = getattr(fused, name)
        monkeypatch.setattr(fused, name, lambda *a, run=run, name=name: (passes.append(name), run(*a))[1])
    return (*_record(spec)[2:], passes)


def test_gpt2_trains_alike_with_the_softmax_band_in_its_rounding_pass(family_data,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows' kernels round as `round_near` does (so the states and losses are the same) and, at this size and
    seed, find the same log entries (the softmax's E is the bound's own, bit for bit; the backward's differs from
    torch's sums in the last bits only: tests/numerics/test_num_bounds.py compares the passes value by value)."""
    spec = family_spec("gpt2-tiny", family_data, steps=10)
    logs_on, loss_on, state_on, passes_on = _train_rows(spec, True, monkeypatch)
    monkeypatch.undo()
    logs_off, loss_off, state_off, passes_off = _train_rows(spec, False, monkeypatch)
    # each layer's attention softmax and its backward, the head's log-softmax, in each of three steps; then none
    assert sorted(passes_on) == sorted(["round_near_softmax"] * 3 * (spec.layers + 1)
                                       + ["round_near_softmax_backward"] * 3 * spec.layers)
    assert passes_off == []
    assert loss_on == loss_off and state_on == state_off and logs_on == logs_off
