"""Checkpoint interval k > 1: a leaf every k steps and after the last, audited, replayed and resumed.

The run of 10 steps with k = 4 has leaves after steps 0, 4, 8 and 10 (the last interval is short).
Its training is the k = 1 run's step for step, so its states and per-step log hashes must be
exactly those of the k = 1 run of the same spec; only what is committed, and where, differs.
"""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from enginekit import cli, emulated_devices, example
from vtrain.audit import audit, replay_step_detail
from vtrain.faults import Fault
from vtrain.intervals import INTERVAL_BATCH_TAG, INTERVAL_LOG_TAG, Intervals, interval_record
from vtrain.leaves import keccak256
from vtrain.run import Run, RunError, TamperedFileError, decode_step_hashes, encode_leaves, encode_step_hashes
from vtrain.spec import SpecError, to_toml
from vtrain.state import decode_state
from vtrain.train import train

K = 4
STEPS = 10
SPEC = example("scale/mlp", steps=STEPS, checkpoint_interval=K)   # the scale model: logs and corrections every step
FAULT = 6   # inside interval 2 (steps 5..8)


@pytest.fixture(scope="module")
def run_k4(runs):
    return runs.get(SPEC)


@pytest.fixture(scope="module")
def run_k1(runs):
    return runs.get(dataclasses.replace(SPEC, checkpoint_interval=1))


def test_intervals_cover_every_step_once_and_end_at_the_last():
    iv = Intervals(10, 4)
    assert iv.size == 4 and [iv.last_step(i) for i in range(4)] == [0, 4, 8, 10]
    assert [list(iv.steps_of(i)) for i in range(4)] == [[], [1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    assert [iv.leaf_of(t) for t in range(11)] == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3]
    assert [t for t in range(1, 11) if iv.ends_leaf(t)] == [4, 8, 10]
    assert Intervals(8, 4).size == 3 and Intervals(3, 10).size == 2 and Intervals(3, 10).last_step(1) == 3
    assert Intervals(5, 1).size == 6 and [iv.describe(2), Intervals(5, 1).describe(2)] == ["steps 5..8", "step 2"]
    with pytest.raises(ValueError, match="leaf 4 is outside"):
        iv.steps_of(4)
    with pytest.raises(SpecError, match="checkpoint_interval"):
        example("mlp", checkpoint_interval=0)


def test_layout_states_only_at_leaves_and_a_log_per_step(run_k4):
    run = Run.open(run_k4)
    assert (run.size, run.steps) == (4, STEPS)
    assert sorted(p.name for p in (run_k4 / "states").iterdir()) == [f"{t:06d}.vst" for t in (0, 4, 8, 10)]
    assert sorted(p.name for p in (run_k4 / "logs").iterdir()) == [f"{t:06d}.vlog" for t in range(1, 11)]
    assert [decode_state(run.read_state(i))[0] for i in range(4)] == [0, 4, 8, 10]
    assert [m["step"] for m in run.metrics()] == list(range(1, 11))
    c = json.loads((run_k4 / "commitment.json").read_text())
    assert c == {"root": "0x" + run.root.hex(), "size": 4, "spec_hash": "0x" + SPEC.hash.hex()}
    hashes = decode_step_hashes((run_k4 / "steps.bin").read_bytes(), "steps.bin")
    assert len(hashes) == STEPS and hashes == run.step_hashes
    for t in range(1, 11):
        assert keccak256(run.read_log_bytes(t)) == hashes[t - 1][0]
    r2 = run.records[2]   # leaf 2 = steps 5..8: the combined per-step hashes, in step order
    assert r2.log_hash == keccak256(INTERVAL_LOG_TAG + b"".join(h[0] for h in hashes[4:8]))
    assert r2.batch_hash == keccak256(INTERVAL_BATCH_TAG + b"".join(h[1] for h in hashes[4:8]))
    for i in range(4):
        run.verify_files(i)


def test_the_k4_run_is_the_k1_run_committed_every_4_steps(run_k4, run_k1):
    k4, k1 = Run.open(run_k4), Run.open(run_k1)
    assert (k1.size, k4.size) == (STEPS + 1, 4)
    assert [k4.read_state(i) for i in range(4)] == [k1.read_state(t) for t in (0, 4, 8, 10)]
    assert k4.step_hashes == [(r.log_hash, r.batch_hash) for r in k1.records[1:]]
    assert not (run_k1 / "steps.bin").exists()   # k = 1 keeps the layout it always had
    for i, (first, last) in enumerate([(1, 4), (5, 8), (9, 10)], start=1):
        part = k1.records[first:last + 1]
        assert k4.records[i] == interval_record(i, k1.records[last].state_hash, [r.log_hash for r in part],
                                                [r.batch_hash for r in part], K)


@pytest.mark.parametrize("device", ["cpu", emulated_devices()[0]])
def test_audit_matches_per_interval(run_k4, device, tmp_path):
    report = audit(Run.open(run_k4), device, out=tmp_path / "audit")
    assert report.matched, report.divergence
    assert report.root == "0x" + Run.open(run_k4).root.hex() and report.size == 4
    assert len(report.corrections) == STEPS
    if device != "cpu":
        assert sum(report.corrections) > 0   # the log mattered: the emulated device rounds otherwise
    assert (tmp_path / "audit" / "leaves.bin").read_bytes() == (run_k4 / "leaves.bin").read_bytes()


def test_replay_step_replays_one_interval(run_k4):
    run = Run.open(run_k4)
    for leaf, steps in ((2, range(5, 9)), (3, range(9, 11))):
        r = replay_step_detail(run, leaf, emulated_devices()[-1])
        assert r.equal and r.leaf == run.leaves[leaf] and r.steps == steps and r.note is None
    out = cli("replay-step", str(run_k4), "2")
    assert out.returncode == 0 and out.stdout.splitlines() == [
        f"leaf=0x{run.leaves[2].hex()}", "equal to the trainer's leaf 2 (steps 5..8)"]
    assert cli("replay-step", str(run_k4), "4").returncode == 2


def test_a_fault_inside_an_interval_is_its_leaf(runs):
    path = runs.get(SPEC, "cpu", (Fault(FAULT, "poison-batch"),))
    run = Run.open(path)
    report = audit(run, emulated_devices()[0])
    d = report.divergence
    assert d is not None and (d.step, list(d.steps)) == (2, [5, 6, 7, 8])
    # on the scale model the poisoned step's log no longer fits the auditor's values: rejected, and named
    assert str(d).startswith("DIVERGED leaf=2 steps=5..8 log rejected: step 6, ")
    assert not replay_step_detail(run, 2).equal and replay_step_detail(run, 1).equal
    out = cli("audit", str(path))
    assert out.returncode == 1 and out.stdout.strip().splitlines()[-1].startswith("DIVERGED leaf=2 steps=5..8 ")


def _copy(src, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(src, out)
    return out


def test_a_tampered_log_inside_an_interval_is_named_with_its_step(run_k4, tmp_path):
    out = _copy(run_k4, tmp_path)
    path = out / "logs" / "000006.vlog"
    path.write_bytes(path.read_bytes()[:-1] + bytes([path.read_bytes()[-1] ^ 1]))
    run = Run.open(out)
    with pytest.raises(TamperedFileError, match=r"000006.vlog: does not hash to the log hash of step 6 "
                                                r"\(steps.bin, covered by leaf 2\)"):
        run.verify_files(2)
    with pytest.raises(TamperedFileError, match="000006.vlog"):
        audit(run, "cpu")
    with pytest.raises(TamperedFileError, match="000006.vlog"):
        replay_step_detail(run, 2)
    r = cli("audit", str(out))
    assert r.returncode == 2 and "000006.vlog" in r.stderr and "step 6" in r.stderr and "Traceback" not in r.stderr
    # listing the tampered log's hash in steps.bin does not help: the leaf no longer covers it
    hashes = list(run.step_hashes)
    hashes[5] = (keccak256(path.read_bytes()), hashes[5][1])
    (out / "steps.bin").write_bytes(encode_step_hashes(hashes))
    with pytest.raises(TamperedFileError, match=r"steps.bin: the hashes of steps 5..8 do not combine to what leaf 2"):
        Run.open(out)


def test_a_log_the_trainer_committed_in_an_interval_but_cannot_be_replayed(run_k4, tmp_path):
    # a cheater that commits garbage for step 7: steps.bin and the leaf cover it, the replay rejects it
    out = _copy(run_k4, tmp_path)
    run = Run.open(out)
    path = out / "logs" / "000007.vlog"
    path.write_bytes(path.read_bytes()[:5])
    hashes = list(run.step_hashes)
    hashes[6] = (keccak256(path.read_bytes()), hashes[6][1])
    (out / "steps.bin").write_bytes(encode_step_hashes(hashes))
    records = list(run.records)
    records[2] = interval_record(2, records[2].state_hash, [h[0] for h in hashes[4:8]], [h[1] for h in hashes[4:8]], K)
    (out / "leaves.bin").write_bytes(encode_leaves(records))
    report = audit(Run.open(out), "cpu")
    d = report.divergence
    assert d.step == 2 and d.reason.startswith("log rejected") and "000007.vlog" in d.reason


def test_resume_mid_interval_redoes_the_partial_interval(run_k4, tmp_path):
    out = tmp_path / "run"
    first = train(SPEC, out, spec_toml=to_toml(SPEC), steps=6)   # stops inside interval 2
    assert (first.size, first.resumed_from) == (2, -1)
    assert len(Run.open(out).metrics()) == 6 and Run.open(out).steps == 4
    second = train(SPEC, out, spec_toml=to_toml(SPEC))
    assert second.resumed_from == 4 and second.root == "0x" + Run.open(run_k4).root.hex()
    assert [m["step"] for m in Run.open(out).metrics()] == list(range(1, 11))
    assert (out / "steps.bin").read_bytes() == (run_k4 / "steps.bin").read_bytes()


def test_a_crash_between_steps_bin_and_leaves_bin_resumes(run_k4, tmp_path):
    out = _copy(run_k4, tmp_path)
    run = Run.open(out)
    (out / "leaves.bin").write_bytes(encode_leaves(run.records[:3]))   # leaf 3 lost; steps.bin still lists 9, 10
    assert Run.open(out).steps == 8
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 11, "lo')
    result = train(SPEC, out, spec_toml=to_toml(SPEC))
    assert result.resumed_from == 8 and result.root == "0x" + run.root.hex()
    assert [m["step"] for m in Run.open(out).metrics()] == list(range(1, 11))


def test_a_run_missing_steps_bin_or_with_too_many_leaves_is_refused(run_k4, tmp_path):
    out = _copy(run_k4, tmp_path)
    (out / "steps.bin").unlink()
    with pytest.raises(RunError, match="steps.bin: missing"):
        Run.open(out)
    out2 = tmp_path / "run2"
    shutil.copytree(run_k4, out2)
    run = Run.open(out2)
    extra = dataclasses.replace(run.records[-1], step=4)
    (out2 / "leaves.bin").write_bytes(encode_leaves(run.records + [extra]))
    with pytest.raises(RunError, match="holds 5 leaves, a run of this spec has 1..4"):
        Run.open(out2)


def test_cli_inspect_shows_the_interval(run_k4):
    r = cli("inspect", str(run_k4), "--verify")
    assert r.returncode == 0, r.stderr
    assert "interval:   a leaf every 4 steps and after the last (4 of 4 leaves written)" in r.stdout
    assert "steps:      10 of 10" in r.stdout and "size=4" in r.stdout
    assert "verified:   4 states and 10 logs match their leaves" in r.stdout


@pytest.mark.slow
def test_two_processes_train_and_audit_an_interval_run(tmp_path):
    spec = example("mlp", steps=5, shards=2, checkpoint_interval=2)
    result = train(spec, tmp_path / "r2", spec_toml=to_toml(spec), workers=2)
    assert result.size == 4 and result.root == train(spec, tmp_path / "r1", spec_toml=to_toml(spec)).root
    report = audit(Run.open(tmp_path / "r2"), emulated_devices()[0], workers=2)
    assert report.matched and report.size == 4, report.divergence
