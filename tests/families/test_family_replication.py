"""gpt2-tiny and resnet-tiny at FP64 work on the FP32 grid (bits = 32), 50 steps: every trainer/auditor
pair among cpu and the emulated profiles ends MATCH with identical roots.

Fast: trained on cpu, audited on one emulated profile. Slow: audited on a second emulated profile;
trained on an emulated profile and audited on cpu, and the trainers' states compared step by step.
"""

from __future__ import annotations

import pytest

from familykit import family_spec
from vtrain.audit import audit
from vtrain.devices import list_devices
from vtrain.run import Run

FAMILIES = ("gpt2-tiny", "resnet-tiny")
EMULATED = [d.name for d in list_devices() if d.name.startswith("emu:")]


def _audit_matches(run: Run, auditor: str) -> None:
    report = audit(run, auditor)
    assert report.divergence is None, f"{run.spec.name} -> {auditor}: {report.divergence}"
    assert report.matched and report.root == "0x" + run.root.hex()


@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_trainer_matches_an_emulated_auditor(family_runs, family_data, family):
    spec = family_spec(family, family_data)
    assert (spec.dtype, spec.bits) == ("float64", 32) and spec.steps >= 50
    run = Run.open(family_runs.get(spec, "cpu"))
    assert run.size == spec.steps + 1
    _audit_matches(run, EMULATED[0])


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_cpu_trainer_matches_a_second_emulated_auditor(family_runs, family_data, family):
    _audit_matches(Run.open(family_runs.get(family_spec(family, family_data), "cpu")), EMULATED[-1])


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_emulated_trainer_matches_cpu_auditor(family_runs, family_data, family):
    spec = family_spec(family, family_data)
    run = Run.open(family_runs.get(spec, EMULATED[1]))
    _audit_matches(run, "cpu")
    cpu_states = [r.state_hash for r in Run.open(family_runs.get(spec, "cpu")).records]
    assert [r.state_hash for r in run.records] == cpu_states
