"""Resolution "exact": bit-identical training with no rounding log (issue 7, DESIGN.md §1.3b).

Every device computes RNE_grid(exact value) for every op output by itself, so trainer/auditor pairs
across devices and thread counts end MATCH although the run has no log at all. The scale models show
that the resolution is what makes it so: rounding alone (no resolution) diverges there.
"""

from __future__ import annotations

import dataclasses

import pytest

from enginekit import cli, emulated_devices, example
from vtrain.audit import audit, replay_step_detail
from vtrain.leaves import ZERO_HASH
from vtrain.run import Run
from vtrain.spec import to_toml

MODELS = ("logreg", "mlp", "cnn")
SCALE = ("scale/logreg", "scale/mlp", "scale/cnn")
SCALE_STEPS = 20   # enough steps for the ablation to diverge; scale/cnn (the slowest steps) only in the slow matrix


def _exact(example_name: str, **changes):
    return example(example_name, resolution="exact", **changes)


def _check_pair(runs, spec, trainer: str, auditor: str) -> None:
    path = runs.get(spec, trainer)
    run = Run.open(path)
    assert not (path / "logs").exists() or not any((path / "logs").iterdir()), "an exact run wrote a log"
    assert all(r.log_hash == ZERO_HASH for r in run.records)
    report = audit(run, auditor)
    assert report.divergence is None, f"{spec.name}: {trainer} -> {auditor}: {report.divergence}"
    assert report.matched and report.size == spec.steps + 1
    assert sum(report.log_bytes) == 0 and sum(report.corrections) == 0


@pytest.mark.parametrize("model", MODELS)
def test_exact_runs_match_across_devices_without_a_log(runs, model):
    spec = example(f"exact/{model}")
    # examples/exact/ are the examples with the exact resolution, nothing else changed
    assert dataclasses.replace(_exact(model), name=spec.name) == spec
    assert spec.steps >= 100 and (spec.dtype, spec.bits) == ("float64", 32)
    # MATCH compares every leaf, and each leaf commits the whole state: the auditor on the emulated device
    # computed the cpu trainer's states bit for bit at every step (the slow matrix trains on every device)
    _check_pair(runs, spec, "cpu", emulated_devices()[0])


@pytest.mark.parametrize("model", ["scale/logreg", "scale/mlp"])   # scale/cnn: in the slow full matrix
def test_exact_scale_models_match_where_rounding_alone_diverges(runs, model):
    spec = _exact(model, steps=SCALE_STEPS)
    emu = emulated_devices()[0]
    path = runs.get(spec, "cpu")
    metrics = Run.open(path).metrics()
    # every step computes each device-dependent op in float64 (vtrain.refine), whose bands leave almost
    # nothing ambiguous (test_num_refine.py: the same bits as the float32 ops with ~11 % of their elements
    # resolved exactly)
    assert all(m["refined"] == m["checked"] > 0 for m in metrics)
    _check_pair(runs, spec, "cpu", emu)
    if model != "scale/logreg":   # (64-term dot products: rounding alone happens to agree there, as in the log ablation)
        ablation = audit(Run.open(path), emu, ignore_log=True)
        assert ablation.divergence is not None, f"{model}: rounding without the exact resolution did not diverge"


def test_exact_trainer_with_2_threads_auditor_with_1(tmp_path):
    out = tmp_path / "run"
    t = cli("train", "examples/exact/mlp.toml", "--out", str(out), "--steps", "20", threads=2, process=True)
    assert t.returncode == 0, t.stderr
    root_line = t.stdout.strip().splitlines()[-1]
    assert root_line.startswith("root=0x") and root_line.endswith(" size=21")
    a = cli("audit", str(out), "--device", emulated_devices()[-1], threads=1)
    assert a.returncode == 0, a.stdout + a.stderr
    assert a.stdout.strip().splitlines()[-1] == f"MATCH {root_line}"
    assert "log: entries/step=0.0 bytes/step=0 total_bytes=0" in a.stdout
    assert "exact: ambiguous/step=" in a.stdout
    i = cli("inspect", str(out), "--verify")
    assert i.returncode == 0, i.stdout + i.stderr
    assert "exact:      checked=" in i.stdout and "verified:   21 states match their leaves" in i.stdout


def test_replay_step_of_an_exact_run_on_another_device(runs):
    spec = _exact("scale/mlp", steps=12)
    run = Run.open(runs.get(spec, "cpu"))
    for device in emulated_devices():
        r = replay_step_detail(run, 5, device)
        assert r.note is None
        assert r.equal and r.leaf == run.records[5].leaf


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS + SCALE)
def test_exact_full_matrix(runs, model):
    # With no log, an audit on device D recomputes exactly what a trainer on D computes: the matrix of
    # every trainer/auditor pair is the statement that every device's run is the same, leaf for leaf.
    devices = ["cpu", *emulated_devices()]
    # (the fast tests run the float64 examples' full 100 steps on a cpu/emulated pair; 30 here for time)
    spec = _exact(model, steps=12) if model in SCALE else example(f"exact/{model}", steps=30)
    leaves = {d: Run.open(runs.get(spec, d)).leaves for d in devices}
    assert len({tuple(v) for v in leaves.values()}) == 1, f"{model}: trainers on {devices} reached different leaves"
    _check_pair(runs, spec, devices[-1], "cpu")   # and the audit itself says so


@pytest.mark.slow
def test_exact_run_trained_by_2_processes_is_audited_by_1(tmp_path):
    from vtrain.train import train
    spec = _exact("mlp", shards=2, steps=12)
    out = tmp_path / "run"
    train(spec, out, spec_toml=to_toml(spec), workers=2)
    report = audit(Run.open(out), emulated_devices()[0])
    assert report.matched, report.divergence


def test_exact_run_with_a_checkpoint_interval(runs):
    spec = _exact("scale/mlp", steps=11, checkpoint_interval=4)
    path = runs.get(spec, "cpu")
    run = Run.open(path)
    assert run.size == 4 and all(r.log_hash == ZERO_HASH for r in run.records)
    assert not (path / "logs").exists() or not any((path / "logs").iterdir())
    report = audit(run, emulated_devices()[0])
    assert report.matched, report.divergence
    r = replay_step_detail(run, 2, emulated_devices()[-1])
    assert r.equal and r.note is None
