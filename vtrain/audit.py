"""The auditor (replay a whole run) and the referee's tool (replay one step).

The auditor trusts nothing of the trainer's but its logs: it initialises from the spec, replays
every step with the trainer's log of that step, computes its own leaves and compares them with the
trainer's. At the first differing leaf it reports the divergence, then continues honestly (its own
log, record mode) so that it ends with its own commitment of the same size, which is what it puts
on-chain when it challenges.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from vtrain.leaves import LeafRecord, hex0x, keccak256
from vtrain.merkle import MerkleTree
from vtrain.parallel import SINGLE, Group, ShardLogRejected, check_workers, run_workers
from vtrain.rounding import IllegitimateLogEntryError, TraceMismatchError
from vtrain.roundlog import CorruptLogError
from vtrain.run import Run, RunError, atomic_write, encode_leaves, write_commitment
from vtrain.shardlog import parse_step_log
from vtrain.state import state_hash
from vtrain.train import StepResult, TrainingSession


@dataclass
class Divergence:
    step: int
    reason: str     # what differs: "state", "log", "batch", or the replay error's message

    def __str__(self) -> str:
        return f"DIVERGED step={self.step} {self.reason}"


@dataclass
class AuditReport:
    trainer_root: str
    root: str
    size: int
    divergence: Divergence | None
    corrections: list[int] = field(default_factory=list)   # per step 1..N (0 where none were applied)
    logged: list[int] = field(default_factory=list)        # per step: entries in the log replayed
    log_bytes: list[int] = field(default_factory=list)     # per step: size of the log replayed
    ambiguous: list[int] = field(default_factory=list)     # per step (resolution exact): elements near a boundary
    recomputed: list[int] = field(default_factory=list)    # per step (resolution exact): exact recomputations

    @property
    def matched(self) -> bool:
        return self.divergence is None and self.root == self.trainer_root


def _differing_parts(ours: LeafRecord, theirs: LeafRecord) -> str:
    parts = [name for name, a, b in (("state", ours.state_hash, theirs.state_hash),
                                      ("log", ours.log_hash, theirs.log_hash),
                                      ("batch", ours.batch_hash, theirs.batch_hash)) if a != b]
    return "leaf differs: " + "+".join(parts) + " hash" + ("es" if len(parts) > 1 else "")


def _replay(session: TrainingSession, run: Run, t: int) -> tuple[StepResult, str | None]:
    """Replay step t with the trainer's log; if the log is rejected, redo the step honestly.

    Returns the step's result and, when the trainer's log was rejected, why.
    """
    if run.spec.resolution == "exact":   # no log: the canonical values are the same on every device
        return session.step(t, "record"), None
    snap = session.snapshot()
    try:
        # the bytes hash to the trainer's leaf (read_log_bytes checks), so a log that does not
        # parse was committed that way: it is the trainer's fault, not a download problem
        data = run.read_log_bytes(t)
        log = parse_step_log(data, str(run.log_path(t)), run.spec.shards)
        result = session.step(t, "replay", replay_log=log)
        result.log_bytes = data   # the leaf commits to the file as published, not to a re-encoding
        return result, None
    except (CorruptLogError, IllegitimateLogEntryError, TraceMismatchError, ShardLogRejected) as exc:
        session.restore(snap)
        return session.step(t, "record"), f"log rejected: {exc}"


def audit(run: Run, device: str = "cpu", *, out: str | Path | None = None, ignore_log: bool = False,
          progress: Callable[[int, StepResult], None] | None = None, workers: int = 1,
          threads: int = 1) -> AuditReport:
    """Replay `run` on `device`; with `ignore_log`, round without applying the trainer's log.

    With `ignore_log` the auditor's leaves still carry the trainer's log hashes (it read the logs,
    it only did not apply them), so a reported divergence is a difference of state, not of logs.
    With `workers` > 1 the replay shares the spec's shards out over that many processes, whatever
    number of processes trained the run. `progress` is only called in a single process.
    """
    if workers == 1:
        return _audit(SINGLE, run, device, out, ignore_log, progress)
    check_workers(workers, run.spec.shards)
    return run_workers(_audit_worker, workers, str(run.path), device, None if out is None else str(out),
                       ignore_log, threads=threads)


def _audit_worker(group: Group, path: str, device: str, out: str | None, ignore_log: bool) -> AuditReport:
    return _audit(group, Run.open(path), device, out if group.rank == 0 else None, ignore_log, None)


def _audit(group: Group, run: Run, device: str, out: str | Path | None, ignore_log: bool,
           progress: Callable[[int, StepResult], None] | None) -> AuditReport:
    session = TrainingSession(run.spec, device, group)
    records = [session.record()]
    divergence = None if records[0].leaf == run.records[0].leaf else Divergence(0, "initial state differs")
    report = AuditReport(hex0x(run.root), "", run.size, None)
    for t in range(1, run.size):
        if divergence is not None:
            result = session.step(t, "record")
            log_hash, note = result.log_hash, None
        elif ignore_log:
            result, note = session.step(t, "plain"), None
            log_hash = result.log_hash if run.spec.resolution == "exact" else keccak256(run.read_log_bytes(t))
        else:
            result, note = _replay(session, run, t)
            log_hash = result.log_hash
        record = LeafRecord(t, state_hash(session.state_bytes()), log_hash, result.batch_hash)
        records.append(record)
        if divergence is None and (note or record.leaf != run.records[t].leaf):
            divergence = Divergence(t, note or _differing_parts(record, run.records[t]))
        report.corrections.append(int(result.stats.get("corrections", 0)))
        report.logged.append(int(result.stats.get("logged", 0)))
        report.log_bytes.append(len(result.log_bytes))
        report.ambiguous.append(int(result.stats.get("ambiguous", 0)))
        report.recomputed.append(int(result.stats.get("recomputed", 0)))
        if progress is not None:
            progress(t, result)
    report.divergence = divergence
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "leaves.bin", encode_leaves(records))
        report.root = write_commitment(out / "commitment.json", records, run.spec)["root"]
        atomic_write(out / "report.json", (json.dumps(_report_json(report), indent=2) + "\n").encode())
    else:
        report.root = hex0x(MerkleTree(r.leaf for r in records).root)
    return report


def _report_json(report: AuditReport) -> dict:
    return {"matched": report.matched, "root": report.root, "size": report.size,
            "trainer_root": report.trainer_root,
            "divergence": None if report.divergence is None else
            {"step": report.divergence.step, "reason": report.divergence.reason},
            "corrections": report.corrections}


@dataclass
class StepReplay:
    step: int
    leaf: bytes           # the leaf an honest replay of the step produces
    trainer_leaf: bytes
    note: str | None      # why the trainer's log was rejected, when it was

    @property
    def equal(self) -> bool:
        return self.leaf == self.trainer_leaf


def replay_step_detail(run: Run, step: int, device: str = "cpu") -> StepReplay:
    """Recompute step `step` from the trainer's state after step - 1 and the trainer's log of step."""
    if not 1 <= step < run.size:
        raise RunError(f"{run.path}: step {step} is outside 1..{run.size - 1}")
    session = TrainingSession(run.spec, device)
    session.load_state(run.read_state(step - 1), str(run.state_path(step - 1)))
    if session.step_count != step - 1:
        raise RunError(f"{run.state_path(step - 1)}: holds the state after step {session.step_count}")
    result, note = _replay(session, run, step)
    return StepReplay(step, session.record(result).leaf, run.records[step].leaf, note)


def replay_step(run: Run, step: int, device: str = "cpu") -> bytes:
    """The referee's tool: the honest leaf of `step` (compare it with run.leaves[step])."""
    return replay_step_detail(run, step, device).leaf
