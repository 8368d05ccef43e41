"""The training loop: one step under the rounded execution, and the trainer that writes a run.

A step is: draw the batch (and dropout masks) from the seed, set the step's learning rate, then
forward, loss, backward and optimizer.step() inside RoundedExecution, which rounds every op
output onto the grid and records (trainer), replays (auditor) or ignores (ablation) the rounding
log. The same `TrainingSession.step` serves the trainer, the auditor and the referee, so the three
cannot drift apart.

Rounding modes: "record" | "replay" | "plain" are RoundedExecution's; "none" runs native torch with
no dispatch mode at all (the baseline of the benchmarks and of "plain float32 training").
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import torch
from torch.nn import functional as F

from vtrain.data import batch_indices, load_dataset
from vtrain.devices import get_device
from vtrain.faults import Fault, perturb_weights, poison_labels
from vtrain.leaves import ZERO_HASH, LeafRecord, batch_hash, keccak256
from vtrain.models import build_model, dropout_masks
from vtrain.optim import build_optimizer, lr_at, set_lr
from vtrain.rounding import RoundedExecution
from vtrain.roundlog import StepLog
from vtrain.run import Run, RunError, RunWriter
from vtrain.spec import Spec
from vtrain.state import capture_state, decode_state, encode_state, restore_state, state_hash

ROUNDING_MODES = ("record", "replay", "plain", "none")


@dataclass
class StepResult:
    step: int
    loss: float
    batch_hash: bytes
    log_bytes: bytes          # the step's log (an empty log when nothing was recorded)
    stats: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def log_hash(self) -> bytes:
        return keccak256(self.log_bytes)

    def metrics(self) -> dict:
        keep = ("rounded", "logged", "logged_values", "corrections", "dense_bytes", "dense_zip_bytes")
        out = {k: self.stats[k] for k in keep if k in self.stats}
        loss = None if self.loss != self.loss else self.loss   # NaN (a skipped step) is not JSON
        return {"loss": loss, "seconds": round(self.seconds, 6), "log_bytes": len(self.log_bytes), **out}


class TrainingSession:
    """A spec's model, optimizer and data on one device: the thing that executes steps."""

    def __init__(self, spec: Spec, device: str = "cpu") -> None:
        self.spec = spec
        self.device = get_device(device)
        self.dtype = getattr(torch, spec.dtype)
        self.data = load_dataset(spec.dataset, self.dtype, path=spec.data_path, context=spec.context, bits=spec.bits)
        self.model = build_model(spec, self.data).to(self.device.torch_device)
        self.optimizer = build_optimizer(spec, self.model)
        self.step_count = 0

    # --- state ---------------------------------------------------------------------------------
    def state_bytes(self) -> bytes:
        return encode_state(self.step_count, capture_state(self.model, self.optimizer))

    def record(self, result: StepResult | None = None) -> LeafRecord:
        """The leaf record of the current state (leaf 0 when `result` is None)."""
        sh = state_hash(self.state_bytes())
        if result is None:
            return LeafRecord(self.step_count, sh, ZERO_HASH, ZERO_HASH)
        return LeafRecord(self.step_count, sh, result.log_hash, result.batch_hash)

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
    def step(self, t: int, rounding: str = "record", replay_log: StepLog | None = None,
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
            return StepResult(t, float("nan"), bh, StepLog.empty().to_bytes())
        where = self.device.torch_device
        x, y = (v.to(where) for v in self.data.batch(idx))
        if fault is not None and fault.kind == "poison-batch":
            y = poison_labels(y, self.data.num_classes)
        masks = [m.to(where) for m in dropout_masks(self.model, len(idx), spec.seed, t, spec.bits)]
        set_lr(self.optimizer, lr_at(spec, t))
        ctx = nullcontext() if rounding == "none" else RoundedExecution(
            bits=spec.bits, device=self.device, policy=spec.log_policy, tau=spec.tau, mode=rounding,
            replay_log=replay_log, step=t)
        start = time.perf_counter()
        with ctx as rx:
            self.optimizer.zero_grad(set_to_none=True)
            # (B, classes) or, for a language model, (B, T, vocab): one prediction per target
            loss = F.cross_entropy(self.model(x, masks).flatten(0, -2), y.flatten())
            loss.backward()
            self.optimizer.step()
        seconds = time.perf_counter() - start
        self.step_count = t
        if fault is not None and fault.kind == "perturb-weights":
            perturb_weights(self.model, spec.seed, t, spec.bits)
        log = rx.log if rx is not None and rounding == "record" else replay_log
        log_bytes = (log if log is not None else StepLog.empty()).to_bytes()
        stats = dict(rx.stats) if rx is not None else {}
        return StepResult(t, float(loss.detach()), bh, log_bytes, stats, seconds)


@dataclass
class TrainResult:
    root: str
    size: int
    spec_hash: str
    resumed_from: int   # the last complete step found in --out before this call (-1: fresh run)


def train(spec: Spec, out: str | Path, *, spec_toml: str, device: str = "cpu", steps: int | None = None,
          faults: Iterable[Fault] = (), progress: Callable[[int, StepResult], None] | None = None) -> TrainResult:
    """Train `spec` into the run directory `out` (resuming it if it holds an interrupted run).

    `steps` stops after that step (at most spec.steps); the commitment then covers steps 0..steps.
    """
    last = spec.steps if steps is None else min(steps, spec.steps)
    by_step = {f.step: f for f in faults}
    session = TrainingSession(spec, device)   # first: an unknown device must not leave a directory behind
    writer = RunWriter(out, spec, spec_toml)
    resumed_from = writer.last_step
    if resumed_from < 0:
        writer.write_step(session.record(), session.state_bytes(), None, None)
    else:
        run = Run.open(out)
        session.load_state(run.read_state(resumed_from), str(run.state_path(resumed_from)))
    for t in range(writer.last_step + 1, last + 1):
        result = session.step(t, "record", fault=by_step.get(t))
        state = session.state_bytes()
        writer.write_step(LeafRecord(t, state_hash(state), result.log_hash, result.batch_hash),
                          state, result.log_bytes, result.metrics())
        if progress is not None:
            progress(t, result)
    c = writer.finish()
    return TrainResult(c["root"], c["size"], c["spec_hash"], resumed_from)
