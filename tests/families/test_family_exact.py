"""Resolution "exact" on the model families: gpt2-tiny (softmax decomposed into primitives, GELU and
LayerNorm's rsqrt-free sqrt path, embedding backward) and resnet-tiny (convolutions, batch-norm means)
train to bit-identical states on cpu and an emulated device with no rounding log."""

from __future__ import annotations

import pytest

from familykit import family_spec
from vtrain.audit import audit
from vtrain.devices import list_devices
from vtrain.leaves import ZERO_HASH
from vtrain.run import Run

EMULATED = [d.name for d in list_devices() if d.name.startswith("emu:")]
STEPS = 12


@pytest.mark.parametrize("family", ["gpt2-tiny", pytest.param("resnet-tiny", marks=pytest.mark.slow)])
def test_exact_family_run_matches_on_another_device_without_a_log(family_runs, family_data, family):
    spec = family_spec(family, family_data, steps=STEPS, resolution="exact")
    run = Run.open(family_runs.get(spec, "cpu"))
    assert all(r.log_hash == ZERO_HASH for r in run.records)
    metrics = run.metrics()
    assert sum(m["ambiguous"] for m in metrics) > 0   # there was something to resolve
    report = audit(run, EMULATED[0])
    assert report.divergence is None, report.divergence
    assert report.matched and sum(report.log_bytes) == 0
    other = Run.open(family_runs.get(spec, EMULATED[0]))
    assert [r.state_hash for r in other.records] == [r.state_hash for r in run.records]
