"""Run directories: resume after an interruption, tampered and corrupt files named, CLI exit codes."""

from __future__ import annotations

import json
import shutil

import pytest

from enginekit import cli, example
from vtrain.audit import audit, replay_step_detail
from vtrain.leaves import LeafRecord, keccak256
from vtrain.merkle import verify_proof
from vtrain.run import Run, RunError, TamperedFileError, encode_leaves
from vtrain.spec import to_toml
from vtrain.train import train

SPEC = example("mlp", steps=12)


@pytest.fixture(scope="module")
def run12(tmp_path_factory):
    out = tmp_path_factory.mktemp("r") / "run"
    train(SPEC, out, spec_toml=to_toml(SPEC))
    return out


def test_layout_and_commitment(run12):
    run = Run.open(run12)
    assert run.size == 13 and run.steps == 12
    c = json.loads((run12 / "commitment.json").read_text())
    assert c == {"root": "0x" + run.root.hex(), "size": 13, "spec_hash": "0x" + SPEC.hash.hex()}
    assert (run12 / "spec.json").read_text() == SPEC.to_json()
    for t in range(13):
        run.verify_files(t)
        assert run.read_state(t)[:8] == b"VTSTATE\0"
    assert len(run.metrics()) == 12 and [m["step"] for m in run.metrics()] == list(range(1, 13))
    assert not list(run12.rglob("*.tmp*"))


def test_cli_inspect(run12):
    r = cli("inspect", str(run12), "--verify")
    run = Run.open(run12)
    assert r.returncode == 0, r.stderr
    assert f"root:       0x{run.root.hex()}  size=13" in r.stdout and "steps:      12 of 12" in r.stdout
    assert "verified:   13 states and 12 logs match their leaves" in r.stdout and "log bytes:" in r.stdout
    # the digits' quantised sums: exact whole ops (vtrain.grains), with no band and no log entry
    exact_sums = sum(m["exact_sums"] for m in run.metrics())
    certified = sum(m["certified"] for m in run.metrics())
    assert exact_sums > 0 and f" certified={certified} exact_sums={exact_sums} " in r.stdout


def test_inclusion_proofs_of_every_leaf(run12):
    run = Run.open(run12)
    for t, leaf in enumerate(run.leaves):
        proof = run.tree.proof(t)
        assert verify_proof(leaf, t, run.size, proof, run.root)
        assert not verify_proof(leaf, (t + 1) % run.size, run.size, proof, run.root)


def test_stop_and_resume_gives_the_same_root(run12, tmp_path):
    out = tmp_path / "run"
    first = train(SPEC, out, spec_toml=to_toml(SPEC), steps=5)
    assert first.size == 6 and first.resumed_from == -1
    second = train(SPEC, out, spec_toml=to_toml(SPEC))
    assert second.resumed_from == 5 and second.root == "0x" + Run.open(run12).root.hex()


def test_interrupted_run_resumes_from_the_last_complete_step(run12, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run12, out)
    # a crash while writing step 8: leaves.bin ends at step 7, step 8's state is half written,
    # a temp file and a torn metrics line are left behind
    run = Run.open(out)
    (out / "leaves.bin").write_bytes(encode_leaves(run.records[:8]))
    (out / "states" / "000008.vst").write_bytes(b"VTSTATE\0\x00")
    (out / "states" / "000009.vst.tmp").write_bytes(b"junk")
    with open(out / "metrics.jsonl", "a") as f:
        f.write('{"step": 13, "lo')
    result = train(SPEC, out, spec_toml=to_toml(SPEC))
    assert result.resumed_from == 7 and result.root == "0x" + run.root.hex()
    assert [m["step"] for m in Run.open(out).metrics()] == list(range(1, 13))


def test_another_spec_or_a_non_run_directory_is_refused(run12, tmp_path):
    other = example("mlp", steps=12, seed=99)
    with pytest.raises(RunError, match="another spec"):
        train(other, run12, spec_toml=to_toml(other))
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunError, match="not empty"):
        train(SPEC, tmp_path, spec_toml=to_toml(SPEC))


def _copy(run12, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run12, out)
    return out


def test_tampered_state_file_is_named(run12, tmp_path):
    out = _copy(run12, tmp_path)
    path = out / "states" / "000005.vst"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    run = Run.open(out)
    with pytest.raises(TamperedFileError, match="000005.vst"):
        run.verify_files(5)
    with pytest.raises(TamperedFileError, match="000005.vst"):
        replay_step_detail(run, 6)
    r = cli("inspect", str(out), "--verify")
    assert r.returncode == 2 and "000005.vst" in r.stderr and "Traceback" not in r.stderr
    r = cli("replay-step", str(out), "6")
    assert r.returncode == 2 and "000005.vst" in r.stderr and "Traceback" not in r.stderr


def test_truncated_log_file_is_named(run12, tmp_path):
    out = _copy(run12, tmp_path)
    path = out / "logs" / "000004.vlog"
    path.write_bytes(path.read_bytes()[:5])
    with pytest.raises(TamperedFileError, match="000004.vlog"):
        audit(Run.open(out), "cpu")
    r = cli("audit", str(out))
    assert r.returncode == 2 and "000004.vlog" in r.stderr and "Traceback" not in r.stderr


def test_corrupt_log_committed_by_the_trainer_is_its_divergence(run12, tmp_path):
    # a cheater that commits to garbage: the file hashes to its leaf, but cannot be replayed
    out = _copy(run12, tmp_path)
    path = out / "logs" / "000004.vlog"
    path.write_bytes(path.read_bytes()[:5])
    run = Run.open(out)
    records = list(run.records)
    r4 = records[4]
    records[4] = LeafRecord(4, r4.state_hash, keccak256(path.read_bytes()), r4.batch_hash)
    (out / "leaves.bin").write_bytes(encode_leaves(records))
    report = audit(Run.open(out), "cpu")
    assert report.divergence.step == 4 and "000004.vlog" in report.divergence.reason


def test_corrupt_leaves_file_is_named(run12, tmp_path):
    out = _copy(run12, tmp_path)
    data = bytearray((out / "leaves.bin").read_bytes())
    data[-1] ^= 1
    (out / "leaves.bin").write_bytes(bytes(data))
    with pytest.raises(TamperedFileError, match="leaves.bin"):
        Run.open(out)
    (out / "leaves.bin").write_bytes(bytes(data[:30]))
    with pytest.raises(RunError, match="leaves.bin"):
        Run.open(out)


@pytest.mark.parametrize("args, words", [
    (["train", "examples/nope.toml"], ["nope.toml", "not found"]),
    (["train", "examples/mlp.toml", "--fault", "3:explode"], ["explode"]),
    (["train", "examples/mlp.toml", "--device", "emu:nope"], ["emu:nope"]),
])
def test_cli_bad_input_exits_2_with_one_line(args, words, tmp_path):
    r = cli(*args, "--out", str(tmp_path / "run"))
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and r.stderr.startswith("error: ")
    for w in words:
        assert w in r.stderr
    assert not (tmp_path / "run").exists()


def test_cli_audit_of_a_non_run_exits_2(tmp_path):
    r = cli("audit", str(tmp_path), process=True)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "spec.json" in r.stderr


def test_cli_help_reads_like_a_manual():
    for cmd in ("train", "audit", "replay-step", "inspect", "devices"):
        r = cli(cmd, "--help")
        assert r.returncode == 0 and "Examples:" in r.stdout
    r = cli("train", "--help")
    assert "VTRAIN_DEVICE" in r.stdout and "--fault" in r.stdout and "VTRAIN_THREADS" in r.stdout
