"""The paper's ablation on the scale models of both families (FP32 work, bits = 20): plain FP32
training diverges across devices, rounding without the log diverges, rounding with the log matches."""

from __future__ import annotations

import pytest

from familykit import family_spec
from vtrain.audit import audit
from vtrain.run import Run
from vtrain.train import TrainingSession

STEPS = 8


@pytest.mark.parametrize("family", ["gpt2-tiny", pytest.param("resnet-tiny", marks=pytest.mark.slow)])
def test_plain_float32_training_diverges_across_devices(family_data, family):
    # float32 work at bits = 32 with rounding "plain": rounding is the identity, so this is plain FP32
    # training whose device-dependent ops run in each device's own order
    spec = family_spec(f"scale/{family}", family_data, bits=32, steps=6)
    states = []
    for device in ("cpu", "emu:splitk8-tree"):
        s = TrainingSession(spec, device)
        for t in range(1, spec.steps + 1):
            s.step(t, "plain")
        states.append(s.state_bytes())
    assert states[0] != states[1]


@pytest.mark.parametrize("family", ["gpt2-tiny", pytest.param("resnet-tiny", marks=pytest.mark.slow)])
def test_log_is_needed_and_sufficient(family_runs, family_data, family):
    spec = family_spec(f"scale/{family}", family_data, steps=STEPS)
    run = Run.open(family_runs.get(spec, "cpu"))
    without = audit(run, "emu:splitk8-tree", ignore_log=True)
    assert without.divergence is not None and "state" in without.divergence.reason
    with_log = audit(run, "emu:lanes8-butterfly")
    assert with_log.matched, with_log.divergence
    assert sum(with_log.corrections) > 0
