"""The paper's ablation on the scale model (FP32 work, bits = 19), where the log visibly matters.

Plain FP32 training differs across devices; rounding without the log (audit --ignore-log) still
diverges; with the log the audit matches, and it needed corrections to do so.
"""

from __future__ import annotations

import pytest

from enginekit import cli, emulated_devices, example
from vtrain.audit import audit
from vtrain.run import Run
from vtrain.train import TrainingSession

STEPS = 30


def test_plain_float32_training_differs_across_devices():
    # bits = 32 in float32 work: rounding is the identity, so this is plain FP32 training whose
    # device-dependent ops run in each device's own order
    spec = example("scale/mlp", bits=32, steps=5)
    states = {}
    for device in ("cpu", emulated_devices()[0]):
        s = TrainingSession(spec, device)
        for t in range(1, spec.steps + 1):
            s.step(t, "plain")
        states[device] = s.state_bytes()
    a, b = states.values()
    assert a != b


@pytest.mark.parametrize("model", ["mlp", pytest.param("cnn", marks=pytest.mark.slow)])
def test_log_is_needed_and_sufficient(runs, model, tmp_path):
    spec = example(f"scale/{model}", steps=STEPS)
    run = Run.open(runs.get(spec, "cpu"))
    auditor = emulated_devices()[0]
    without = audit(run, auditor, ignore_log=True)
    assert without.divergence is not None and "state" in without.divergence.reason
    with_log = audit(run, auditor)
    assert with_log.matched, with_log.divergence
    assert sum(with_log.corrections) > 0


def test_cli_reports_the_ablation(runs):
    run = runs.get(example("scale/mlp", steps=STEPS), "cpu")
    dev = emulated_devices()[0]
    r = cli("audit", str(run), "--device", dev, "--ignore-log")
    assert r.returncode == 1 and r.stdout.strip().splitlines()[-1].startswith("DIVERGED step=")
    r = cli("audit", str(run), "--device", dev)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1].startswith("MATCH root=0x")
    total = int(r.stdout.split("corrections: total=")[1].split()[0])
    assert total > 0
