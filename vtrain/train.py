"""The training loop: one step under the rounded execution, and the trainer that writes a run.

A step is: draw the batch (and dropout masks) from the seed, set the step's learning rate, then
forward, loss, backward and optimizer.step() inside RoundedExecution, which rounds every op
output onto the grid and records (trainer), replays (auditor) or ignores (ablation) the rounding
log. The same `TrainingSession.step` serves the trainer, the auditor and the referee, so the three
cannot drift apart.

With spec.shards = M > 1 the step is M micro-batches, each under its own rounded execution with its
own log part, then the canonically rounded mean gradient and the optimizer step under one more
(vtrain.parallel); the processes of a data-parallel job each run their share of the micro-batches.

Rounding modes: "record" | "replay" | "plain" are RoundedExecution's; "none" runs native torch with
no dispatch mode at all (the baseline of the benchmarks and of "plain float32 training").
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch.nn import functional as F

from vtrain import native_views
from vtrain.data import batch_indices, load_dataset
from vtrain.devices import get_device
from vtrain.faults import Fault, perturb_weights, poison_labels
from vtrain.heap import keep_freed_memory
from vtrain.intervals import Intervals
from vtrain.leaves import ZERO_HASH, LeafRecord, batch_hash, keccak256
from vtrain.models import build_model, dropout_masks
from vtrain.models.norms import BatchNorm2d
from vtrain.optim import build_optimizer, lr_at, set_lr
from vtrain.parallel import SINGLE, Group, ShardLogRejected, check_workers, reduce_gradients, run_workers
from vtrain.rounding import IllegitimateLogEntryError, RoundedExecution, TraceMismatchError
from vtrain.roundlog import CorruptLogError, StepLog
from vtrain.shardlog import ShardedLog
from vtrain.run import Run, RunError, RunWriter
from vtrain.spec import Spec
from vtrain.state import capture_state, decode_state, encode_state, restore_state, state_hash

ROUNDING_MODES = ("record", "replay", "plain", "none")


@dataclass
class StepResult:
    step: int
    loss: float
    batch_hash: bytes
    log_bytes: bytes          # the step's log (an empty log when nothing was recorded; b"" under exact)
    stats: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def log_hash(self) -> bytes:
        # resolution "exact" has no log at all: its leaves commit a zero log hash
        return keccak256(self.log_bytes) if self.log_bytes else ZERO_HASH

    def metrics(self) -> dict:
        keep = ("rounded", "logged", "logged_values", "corrections", "dense_bytes", "dense_zip_bytes",
                "checked", "ambiguous", "certified", "refined", "recomputed", "exact_sums", "exact_seconds")
        out = {k: self.stats[k] for k in keep if k in self.stats}
        loss = None if self.loss != self.loss else self.loss   # NaN (a skipped step) is not JSON
        return {"loss": loss, "seconds": round(self.seconds, 6), "log_bytes": len(self.log_bytes), **out}


class TrainingSession:
    """A spec's model, optimizer and data on one device: the thing that executes steps."""

    def __init__(self, spec: Spec, device: str = "cpu", group: Group = SINGLE) -> None:
        keep_freed_memory()  # its steps' large tensors reuse the pages of the step before (vtrain.heap)
        self.spec = spec
        self.group = group
        check_workers(group.world, spec.shards)
        self.device = get_device(device)
        self.dtype = getattr(torch, spec.dtype)
        self.data = load_dataset(spec.dataset, self.dtype, path=spec.data_path, context=spec.context, bits=spec.bits,
                                 data_hash=spec.data_hash)
        self.model = build_model(spec, self.data).to(self.device.torch_device)
        self.optimizer = build_optimizer(spec, self.model)
        self.step_count = 0
        # dense-baseline log sizes (stats "dense_bytes"/"dense_zip_bytes"): a benchmark's question, off in training
        self.measure_storage = False
        self._grain_hints: dict = {}  # RoundedExecution's memory of whole-op tests that failed (a speed hint only)

    # --- state ---------------------------------------------------------------------------------
    def state_bytes(self) -> bytes:
        return encode_state(self.step_count, capture_state(self.model, self.optimizer))

    def record(self) -> LeafRecord:
        """Leaf 0: the initial state, with no log and no batch (vtrain.intervals builds the others)."""
        return LeafRecord(self.step_count, state_hash(self.state_bytes()), ZERO_HASH, ZERO_HASH)

    def load_state(self, data: bytes, source: str) -> None:
        step, tensors = decode_state(data, source)
        restore_state(self.model, self.optimizer, tensors, source)
        self.step_count = step

    def snapshot(self) -> tuple[int, dict[str, torch.Tensor]]:
        return self.step_count, {k: v.clone() for k, v in capture_state(self.model, self.optimizer).items()}

    def restore(self, snap: tuple[int, dict[str, torch.Tensor]]) -> None:
        self.step_count = snap[0]
        restore_state(self.model, self.optimizer, snap[1])

    # --- one step -------------------------------------------------------------------------------
    def step(self, t: int, rounding: str = "record", replay_log: StepLog | ShardedLog | None = None,
             fault: Fault | None = None) -> StepResult:
        """Execute step t (1-based) from the current state, which must be the state after t - 1."""
        spec = self.spec
        if t != self.step_count + 1:
            raise RunError(f"step {t} cannot follow the state after step {self.step_count}")
        if rounding not in ROUNDING_MODES:
            raise ValueError(f"rounding must be one of {ROUNDING_MODES}, got {rounding!r}")
        idx = batch_indices(spec.seed, t, spec.batch_size, self.data.n)
        bh = batch_hash(idx.tolist())
        if fault is not None and fault.kind == "skip-step":
            self.step_count = t
            empty = StepLog.empty() if spec.shards == 1 else ShardedLog.empty(spec.shards + 1)
            return StepResult(t, float("nan"), bh, b"" if spec.resolution == "exact" else empty.to_bytes())
        where = self.device.torch_device
        x, y = (v.to(where) for v in self.data.batch(idx))
        if fault is not None and fault.kind == "poison-batch":
            y = poison_labels(y, self.data.num_classes)
        masks = [m.to(where) for m in dropout_masks(self.model, len(idx), spec.seed, t, spec.bits)]
        set_lr(self.optimizer, lr_at(spec, t))
        start = time.perf_counter()
        if spec.shards == 1:
            with self._context(rounding, t, replay_log) as rx:
                self.optimizer.zero_grad(set_to_none=True)
                loss = self._loss(x, y, masks)
                loss.backward()
                self.optimizer.step()
            loss_value = float(loss.detach())
            log = rx.log if rx is not None and rounding == "record" else replay_log
            log_bytes = (log if log is not None else StepLog.empty()).to_bytes()
            stats = dict(rx.stats) if rx is not None else {}
        else:
            loss_value, log_bytes, stats = self._sharded_step(t, x, y, masks, rounding, replay_log)
        seconds = time.perf_counter() - start
        if spec.resolution == "exact":
            log_bytes = b""
        self.step_count = t
        if fault is not None and fault.kind == "perturb-weights":
            perturb_weights(self.model, spec.seed, t, spec.bits)
        return StepResult(t, loss_value, bh, log_bytes, stats, seconds)

    def _context(self, rounding: str, t: int, replay_log: StepLog | None) -> Any:
        if rounding == "none":
            return nullcontext()
        spec = self.spec
        if spec.resolution == "exact" and rounding == "replay":
            rounding = "record"   # nothing to replay: the auditor computes the same canonical values
        return RoundedExecution(bits=spec.bits, device=self.device, policy=spec.log_policy, tau=spec.tau,
                                mode=rounding, replay_log=replay_log, step=t, resolution=spec.resolution,
                                measure_storage=self.measure_storage, grain_hints=self._grain_hints)

    def _loss(self, x: torch.Tensor, y: torch.Tensor, masks: list[torch.Tensor]) -> torch.Tensor:
        # (B, classes) or, for a language model, (B, T, vocab): one prediction per target
        return F.cross_entropy(self.model(x, masks).flatten(0, -2), y.flatten())

    def _sharded_step(self, t: int, x: torch.Tensor, y: torch.Tensor, masks: list[torch.Tensor], rounding: str,
                      replay: ShardedLog | None) -> tuple[float, bytes, dict]:
        """The step as spec.shards micro-batches (this process's share of them), see vtrain.parallel."""
        spec, group = self.spec, self.group
        params = [p for _, p in sorted(self.model.named_parameters())]
        size = spec.batch_size // spec.shards
        grads: dict[int, list[torch.Tensor]] = {}
        mine: dict[int, tuple[float, bytes, dict]] = {}
        failure = None
        try:
            for i in group.shards(spec.shards):
                rows = slice(i * size, (i + 1) * size)
                for module in self.model.modules():
                    if isinstance(module, BatchNorm2d):
                        module.update_running = i == 0
                with self._context(rounding, t, replay.parts[i] if replay is not None else None) as rx:
                    for p in params:
                        p.grad = None
                    loss = self._loss(x[rows], y[rows], [m[rows] for m in masks])
                    loss.backward()
                grads[i] = [torch.zeros_like(p) if p.grad is None else p.grad.detach() for p in params]
                mine[i] = (float(loss.detach()), self._part_bytes(rx, rounding, replay, i), _counts(rx))
        except (CorruptLogError, IllegitimateLogEntryError, TraceMismatchError) as exc:
            if group.world == 1:
                raise
            failure = f"shard {i}: {exc}"
        # every process learns every shard's outcome, so all of them take the same path
        gathered = group.all_gather((failure, mine))
        failures = [f for f, _ in gathered if f is not None]
        if failures:
            raise ShardLogRejected(failures[0])
        done = {i: part for _, theirs in gathered for i, part in theirs.items()}   # shard -> (loss, log, counts)
        for p in params:
            p.grad = None
        if rounding == "none":   # the unrounded baseline: a plain mean
            for p, *gs in zip(params, *(grads[i] for i in sorted(grads))):
                p.grad = torch.stack(gs).sum(0)
            if group.world > 1:
                for p in params:
                    torch.distributed.all_reduce(p.grad)
            for p in params:
                p.grad /= spec.shards
        else:
            for p, g in zip(params, reduce_gradients(grads, spec.shards, spec.bits, group)):
                p.grad = g
        with self._context(rounding, t, replay.parts[-1] if replay is not None else None) as rx:
            self.optimizer.step()
        group.broadcast_buffers(self.model)
        parts = [done[i][1] for i in range(spec.shards)] + [self._part_bytes(rx, rounding, replay, spec.shards)]
        stats: dict = {}
        for counts in [done[i][2] for i in range(spec.shards)] + [_counts(rx)]:
            for k, v in counts.items():
                stats[k] = stats.get(k, 0) + v
        loss_value = sum(done[i][0] for i in range(spec.shards)) / spec.shards
        log = ShardedLog([StepLog.from_bytes(b) for b in parts]) if rounding == "record" else replay
        return loss_value, (log if log is not None else ShardedLog.empty(spec.shards + 1)).to_bytes(), stats

    @staticmethod
    def _part_bytes(rx: Any, rounding: str, replay: ShardedLog | None, i: int) -> bytes:
        if rx is not None and rounding == "record":
            return rx.log.to_bytes()
        return (replay.parts[i] if replay is not None else StepLog.empty()).to_bytes()


def _counts(rx: Any) -> dict:
    """The additive statistics of one rounded execution (none for the unrounded baseline)."""
    if rx is None:
        return {}
    return {k: v for k, v in rx.stats.items() if isinstance(v, (int, float)) and k != "bits"}


@dataclass
class TrainResult:
    root: str
    size: int
    spec_hash: str
    resumed_from: int   # the last step committed in --out before this call (-1: fresh run)


def train(spec: Spec, out: str | Path, *, spec_toml: str, device: str = "cpu", steps: int | None = None,
          faults: Iterable[Fault] = (), progress: Callable[[int, StepResult], None] | None = None,
          workers: int = 1, threads: int = 1) -> TrainResult:
    """Train `spec` into the run directory `out` (resuming it if it holds an interrupted run).

    `steps` stops after that step (at most spec.steps); the commitment then covers the leaves
    complete by then (with checkpoint_interval k > 1 a partial interval is redone on resuming).
    With `workers` > 1 the spec's shards are shared out over that many processes (each with
    `threads` torch threads); the run is bit-identical to the single-process one. `progress` is
    only called in a single process.
    """
    if workers == 1:
        return _train(SINGLE, spec, out, spec_toml, device, steps, tuple(faults), progress)
    check_workers(workers, spec.shards)
    get_device(device)
    RunWriter(out, spec, spec_toml)   # checks --out before any process starts
    return run_workers(_train, workers, spec, str(out), spec_toml, device, steps, tuple(faults), None,
                       threads=threads)


@native_views.held()  # (a run's steps: see vtrain.native_views)
def _train(group: Group, spec: Spec, out: str | Path, spec_toml: str, device: str, steps: int | None,
           faults: tuple[Fault, ...], progress: Callable[[int, StepResult], None] | None) -> TrainResult:
    last = spec.steps if steps is None else min(steps, spec.steps)
    by_step = {f.step: f for f in faults}
    session = TrainingSession(spec, device, group)   # first: an unknown device must not leave a directory behind
    writer = RunWriter(out, spec, spec_toml) if group.rank == 0 else None
    # process 0 owns the directory; the others learn where it stands before anything is written
    resumed_leaf, resumed_from = group.all_gather((writer.last_leaf, writer.last_step) if writer is not None
                                                  else None)[0]
    if resumed_leaf >= 0:   # a partial interval after the last leaf is redone from that leaf's state
        run = Run.open(out)
        session.load_state(run.read_state(resumed_leaf), str(run.state_path(resumed_leaf)))
    elif writer is not None:
        writer.write_leaf(session.state_bytes())
    intervals = Intervals(spec.steps, spec.checkpoint_interval)
    for t in range(max(resumed_from, 0) + 1, last + 1):
        result = session.step(t, "record", fault=by_step.get(t))
        if writer is not None:
            writer.write_log(t, result.log_bytes, result.batch_hash, result.metrics())
            if intervals.ends_leaf(t):
                writer.write_leaf(session.state_bytes())
        if progress is not None:
            progress(t, result)
    if writer is None:
        return TrainResult("", 0, "", resumed_from)
    c = writer.finish()
    return TrainResult(c["root"], c["size"], c["spec_hash"], resumed_from)
