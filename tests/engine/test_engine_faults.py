"""Dishonest runs (--fault): the honest auditor finds the faulty step; replay-step confirms it."""

from __future__ import annotations

import pytest

from enginekit import cli, emulated_devices, example
from vtrain.audit import audit, replay_step_detail
from vtrain.faults import Fault, FaultError, parse_fault
from vtrain.run import Run

K = 6
SPEC = example("mlp", steps=10)


@pytest.mark.parametrize("kind", ["poison-batch", "skip-step", "perturb-weights"])
def test_fault_is_found_at_its_step(runs, kind):
    run = Run.open(runs.get(SPEC, "cpu", (Fault(K, kind),)))
    for t in range(run.size):
        run.verify_files(t)     # the cheater's run is self-consistent
    report = audit(run, "cpu")
    assert report.divergence is not None and report.divergence.step == K, report.divergence
    assert report.size == run.size and report.root != report.trainer_root
    # the auditor continued honestly: on the trainer's device its root is the honest run's root
    assert report.root == "0x" + Run.open(runs.get(SPEC, "cpu")).root.hex()
    assert not replay_step_detail(run, K).equal
    assert replay_step_detail(run, K - 1).equal


def test_cli_poison_batch(tmp_path):
    out = tmp_path / "bad"
    r = cli("train", "examples/mlp.toml", "--out", str(out), "--steps", "8", "--fault", f"{K}:poison-batch")
    assert r.returncode == 0, r.stderr
    a = cli("audit", str(out), "--out", str(tmp_path / "audit"))
    assert a.returncode == 1 and a.stdout.strip().splitlines()[-1].startswith(f"DIVERGED step={K} ")
    bad = cli("replay-step", str(out), str(K))
    assert bad.returncode == 1 and bad.stdout.startswith("leaf=0x") and "DIFFERENT" in bad.stdout
    good = cli("replay-step", str(out), str(K - 1), "--device", emulated_devices()[0])
    assert good.returncode == 0 and "equal" in good.stdout


def test_parse_fault():
    assert parse_fault("7:skip-step") == Fault(7, "skip-step")
    for bad in ("7", "x:skip-step", "0:skip-step", "7:nap"):
        with pytest.raises(FaultError):
            parse_fault(bad)
