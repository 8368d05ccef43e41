"""The auditor (replay a whole run) and the referee's tool (replay one step).

The auditor trusts nothing of the trainer's but its logs: it initialises from the spec, replays
every step with the trainer's log of that step, computes its own leaves and compares them with the
trainer's. At the first differing leaf it reports the divergence, then continues honestly (its own
log, record mode) so that it ends with its own commitment of the same size, which is what it puts
on-chain when it challenges.

With a checkpoint interval k > 1 the auditor still replays every step with that step's log, but
compares leaves per interval: a divergence names the first differing leaf and the steps it covers
(and, when a log was rejected, the step). The referee's tool replays one interval the same way,
from the trainer's state of the leaf before it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from vtrain import native_views
from vtrain.intervals import interval_record
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
    step: int       # the first differing leaf (the step itself when checkpoint_interval = 1)
    reason: str     # what differs: "state", "log", "batch", or the replay error's message
    steps: range = range(0)   # the steps that leaf covers (k > 1)

    def __str__(self) -> str:
        if len(self.steps) <= 1:
            return f"DIVERGED step={self.step} {self.reason}"
        return f"DIVERGED leaf={self.step} steps={self.steps[0]}..{self.steps[-1]} {self.reason}"


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
    refined: list[int] = field(default_factory=list)       # per step (exact, float32 work): outputs computed in float64
    recomputed: list[int] = field(default_factory=list)    # per step (resolution exact): exact recomputations

    @property
    def matched(self) -> bool:
        return self.divergence is None and self.root == self.trainer_root


def _differing_parts(ours: LeafRecord, theirs: LeafRecord, run: Run, steps: range,
                     step_hashes: list[tuple[bytes, bytes]]) -> str:
    parts = [name for name, a, b in (("state", ours.state_hash, theirs.state_hash),
                                      ("log", ours.log_hash, theirs.log_hash),
                                      ("batch", ours.batch_hash, theirs.batch_hash)) if a != b]
    text = "leaf differs: " + "+".join(parts) + " hash" + ("es" if len(parts) > 1 else "")
    # an interval's log and batch hashes cover several steps: say which step's differs first
    differs = [t for t, mine in zip(steps, step_hashes) if mine != run.step_hashes[t - 1]]
    return text + (f" (first at step {differs[0]})" if len(steps) > 1 and differs else "")


def _replay(session: TrainingSession, run: Run, t: int) -> tuple[StepResult, str | None]:
    """Replay step t with the trainer's log; if the log is rejected, redo the step honestly.

    Returns the step's result and, when the trainer's log was rejected, why.
    """
    if not run.has_logs:   # resolution exact: the canonical values are the same on every device
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


@native_views.held()  # (a replay's steps: see vtrain.native_views)
def _audit(group: Group, run: Run, device: str, out: str | Path | None, ignore_log: bool,
           progress: Callable[[int, StepResult], None] | None) -> AuditReport:
    session = TrainingSession(run.spec, device, group)
    intervals = run.intervals
    records = [session.record()]
    divergence = None if records[0].leaf == run.records[0].leaf else Divergence(0, "initial state differs")
    report = AuditReport(hex0x(run.root), "", run.size, None)
    hashes: list[tuple[bytes, bytes]] = []   # (log hash, batch hash) of the current interval's steps
    notes: list[str] = []                    # why the trainer's log of a step in it was rejected
    for t in range(1, run.steps + 1):
        if divergence is not None:
            result = session.step(t, "record")
            log_hash, note = result.log_hash, None
        elif ignore_log:
            result, note = session.step(t, "plain"), None
            log_hash = keccak256(run.read_log_bytes(t)) if run.has_logs else result.log_hash
        else:
            result, note = _replay(session, run, t)
            log_hash = result.log_hash
        hashes.append((log_hash, result.batch_hash))
        if note:   # the replay errors name the step
            notes.append(note)
        if intervals.ends_leaf(t):
            leaf = intervals.leaf_of(t)
            record = _leaf_record(session, leaf, hashes, intervals.k)
            records.append(record)
            if divergence is None and (notes or record.leaf != run.records[leaf].leaf):
                steps = intervals.steps_of(leaf)
                divergence = Divergence(leaf, notes[0] if notes else
                                        _differing_parts(record, run.records[leaf], run, steps, hashes), steps)
            hashes, notes = [], []
        report.corrections.append(int(result.stats.get("corrections", 0)))
        report.logged.append(int(result.stats.get("logged", 0)))
        report.log_bytes.append(len(result.log_bytes))
        report.ambiguous.append(int(result.stats.get("ambiguous", 0)))
        report.refined.append(int(result.stats.get("refined", 0)))
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


def _leaf_record(session: TrainingSession, leaf: int, hashes: list[tuple[bytes, bytes]], k: int) -> LeafRecord:
    return interval_record(leaf, state_hash(session.state_bytes()), [h[0] for h in hashes],
                           [h[1] for h in hashes], k)


def _report_json(report: AuditReport) -> dict:
    return {"matched": report.matched, "root": report.root, "size": report.size,
            "trainer_root": report.trainer_root,
            "divergence": None if report.divergence is None else
            {"step": report.divergence.step, "reason": report.divergence.reason,
             "steps": list(report.divergence.steps)},
            "corrections": report.corrections}


@dataclass
class StepReplay:
    step: int             # the leaf replayed (the step itself when checkpoint_interval = 1)
    leaf: bytes           # the leaf an honest replay of its interval produces
    trainer_leaf: bytes
    note: str | None      # why the trainer's log of a step was rejected, when it was
    steps: range = range(0)   # the steps replayed

    @property
    def equal(self) -> bool:
        return self.leaf == self.trainer_leaf


def replay_step_detail(run: Run, step: int, device: str = "cpu") -> StepReplay:
    """Recompute leaf `step` (its interval's steps) from the trainer's state of leaf step - 1 and the
    trainer's logs of those steps."""
    if not 1 <= step < run.size:
        raise RunError(f"{run.path}: leaf {step} is outside 1..{run.size - 1}")
    intervals = run.intervals
    session = TrainingSession(run.spec, device)
    session.load_state(run.read_state(step - 1), str(run.state_path(step - 1)))
    if session.step_count != intervals.last_step(step - 1):
        raise RunError(f"{run.state_path(step - 1)}: holds the state after step {session.step_count}")
    hashes, notes = [], []
    for t in intervals.steps_of(step):
        result, note = _replay(session, run, t)
        hashes.append((result.log_hash, result.batch_hash))
        if note:
            notes.append(note)
    record = _leaf_record(session, step, hashes, intervals.k)
    return StepReplay(step, record.leaf, run.records[step].leaf, notes[0] if notes else None, intervals.steps_of(step))


def replay_step(run: Run, step: int, device: str = "cpu") -> bytes:
    """The referee's tool: the honest leaf `step` (compare it with run.leaves[step])."""
    return replay_step_detail(run, step, device).leaf
