"""Engine benchmark (issue 3): time overhead of rounding + logging, and log sizes per step.

Side by side in one process, medians over interleaved repetitions (each repetition runs every mode
once, in turn, so machine load hits all modes alike):
  trainer   FP64 work, rounded onto the grid, bound log recorded (RoundedExecution mode "record")
  auditor   the same, replaying the trainer's logs (mode "replay")
  plain64   native torch FP64, no dispatch mode
  plain32   native torch FP32, no dispatch mode
  floor     native torch FP64 with forward and backward under a dispatch mode that passes every op through
            unchanged (the optimizer outside it, as the trainer's fused one dispatches nothing per element):
            what any per-op Python mechanism costs before it does any work
Time is the step itself (forward, loss, backward, optimizer step, encoding the log); state hashing
and file writes are reported separately ("hash"). The dense-baseline sizes are measured in the
warm-up run only (the trainer does not compute them).

Log bytes per step: bound sparse (ours) vs tau sparse (the paper's threshold, sparse format) vs the
paper's dense ternary code (5 codes a byte over every rounded value) vs dense + zip; the fraction of
rounded values logged, and corrections per step when an emulated device replays the log.

    .venv/bin/python benchmarks/bench_engine.py                 # all three examples, 30 steps, 5 reps
    .venv/bin/python benchmarks/bench_engine.py --steps 20 --reps 3 --examples mlp --threads 1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vtrain import native_views  # noqa: E402
from vtrain.devices import list_devices  # noqa: E402
from vtrain.roundlog import StepLog  # noqa: E402
from vtrain.spec import Spec, load_spec  # noqa: E402
from vtrain.state import state_hash  # noqa: E402
from vtrain.train import TrainingSession  # noqa: E402


class PassThrough(native_views.ViewsPastModes, TorchDispatchMode):
    """A dispatch mode that runs every aten op unchanged, the views of vtrain.native_views past it as they go
    past RoundedExecution: the floor of the same mechanism."""

    stats: dict = {}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # as RoundedExecution

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        return func(*args, **(kwargs or {}))


class FloorSession(TrainingSession):
    """Plain FP64 steps with forward and backward under PassThrough, the optimizer step outside it."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        step = self.optimizer.step

        def unmoded_step(*a, **k):  # noqa: ANN002, ANN003, ANN202
            with _disable_current_modes():
                return step(*a, **k)

        self.optimizer.step = unmoded_step

    def _context(self, rounding: str, t: int, replay_log: StepLog | None) -> PassThrough:
        return PassThrough()


@native_views.held()  # (as a run's steps are: vtrain.train, vtrain.audit)
def run_steps(spec: Spec, device: str, rounding: str, steps: int, logs: list[StepLog] | None = None,
              measure_storage: bool = False, session: type = TrainingSession) -> dict:
    s = session(spec, device)
    s.measure_storage = measure_storage  # the dense baselines: measured once, outside the timed runs
    seconds, hash_s, out_logs, stats = [], [], [], []
    for t in range(1, steps + 1):
        r = s.step(t, rounding, replay_log=logs[t - 1] if logs else None)
        seconds.append(r.seconds)
        stats.append(r.stats)
        out_logs.append(StepLog.from_bytes(r.log_bytes) if r.log_bytes else None)  # b"": resolution exact
        if rounding != "none":
            start = time.perf_counter()
            state_hash(s.state_bytes())
            hash_s.append(time.perf_counter() - start)
    return {"seconds": sum(seconds), "hash_seconds": sum(hash_s), "logs": out_logs, "stats": stats}


def mean_stat(stats: list[dict], key: str) -> float:
    return statistics.fmean(float(s.get(key, 0)) for s in stats)


def bench_example(name: str, steps: int, reps: int, emu: str) -> dict:
    spec = dataclasses.replace(load_spec(ROOT / "examples" / f"{name}.toml"), steps=max(steps, 1))
    spec32 = dataclasses.replace(spec, dtype="float32")
    trainer = run_steps(spec, "cpu", "record", steps, measure_storage=True)  # warm-up, sizes, the logs to replay
    logs = trainer["logs"]
    times: dict[str, list[float]] = {k: [] for k in ("trainer", "auditor", "plain64", "plain32", "floor", "hash")}
    for _ in range(reps):
        times["plain64"].append(run_steps(spec, "cpu", "none", steps)["seconds"] / steps)
        times["floor"].append(run_steps(spec, "cpu", "none", steps, session=FloorSession)["seconds"] / steps)
        tr = run_steps(spec, "cpu", "record", steps)
        times["trainer"].append(tr["seconds"] / steps)
        times["hash"].append(tr["hash_seconds"] / steps)
        times["plain32"].append(run_steps(spec32, "cpu", "none", steps)["seconds"] / steps)
        times["auditor"].append(run_steps(spec, "cpu", "replay", steps, logs)["seconds"] / steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    tau = run_steps(dataclasses.replace(spec, log_policy="tau"), "cpu", "record", steps)
    emu_audit = run_steps(spec, emu, "replay", steps, logs)
    st = trainer["stats"]
    return {
        "example": name, "steps": steps, "reps": reps,
        "ms_per_step": {k: round(v * 1e3, 3) for k, v in med.items()},
        "ratio_trainer_vs_plain64": round(med["trainer"] / med["plain64"], 2),
        "ratio_auditor_vs_plain64": round(med["auditor"] / med["plain64"], 2),
        "ratio_trainer_vs_plain32": round(med["trainer"] / med["plain32"], 2),
        "ratio_floor_vs_plain64": round(med["floor"] / med["plain64"], 2),
        "rounded_per_step": mean_stat(st, "rounded"),
        "logged_per_step": mean_stat(st, "logged"),
        "value_entries_per_step": mean_stat(st, "logged_values"),
        "logged_fraction": mean_stat(st, "logged") / max(1.0, mean_stat(st, "rounded")),
        "bytes_bound": statistics.fmean(len(lg.to_bytes()) for lg in logs),
        "bytes_tau": statistics.fmean(len(lg.to_bytes()) for lg in tau["logs"]),
        "tau_logged_per_step": mean_stat(tau["stats"], "logged"),
        "bytes_dense": mean_stat(st, "dense_bytes"),
        "bytes_dense_zip": mean_stat(st, "dense_zip_bytes"),
        "corrections_per_step_on_" + emu: mean_stat(emu_audit["stats"], "corrections"),
    }


def markdown_table(header: list[str], rows: list[list]) -> None:
    """Print a markdown table (the form docs/benchmarks.md quotes)."""
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(c) for c in row) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", nargs="+", default=["logreg", "mlp", "cnn"],
                    help="example names under examples/ (e.g. mlp, scale/mlp)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--emu", default=None, help="emulated device for the corrections count")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    emu = args.emu or next(d.name for d in list_devices() if d.name.startswith("emu:"))
    results = [bench_example(name, args.steps, args.reps, emu) for name in args.examples]
    print(f"# torch {torch.__version__}, threads={args.threads}, steps={args.steps}, reps={args.reps}\n")
    markdown_table(["example", "plain32 ms", "plain64 ms", "floor ms", "trainer ms", "auditor ms", "state hash ms",
                    "floor/plain64", "trainer/plain64", "auditor/plain64", "trainer/plain32"],
                   [[r["example"], *(r["ms_per_step"][k] for k in ("plain32", "plain64", "floor", "trainer", "auditor",
                                                                   "hash")),
                     f"{r['ratio_floor_vs_plain64']}x", f"{r['ratio_trainer_vs_plain64']}x",
                     f"{r['ratio_auditor_vs_plain64']}x", f"{r['ratio_trainer_vs_plain32']}x"] for r in results])
    print()
    markdown_table(["example", "rounded/step", "logged/step (values)", "logged fraction", "bound B/step", "tau B/step",
                    "dense B/step", "dense+zip B/step", "dense/bound", "corrections/step"],
                   [[r["example"], f"{r['rounded_per_step']:.0f}",
                     f"{r['logged_per_step']:.1f} ({r['value_entries_per_step']:.1f})", f"{r['logged_fraction']:.2e}",
                     f"{r['bytes_bound']:.0f}", f"{r['bytes_tau']:.0f}", f"{r['bytes_dense']:.0f}",
                     f"{r['bytes_dense_zip']:.0f}", f"{r['bytes_dense'] / max(1.0, r['bytes_bound']):.1f}x",
                     f"{r['corrections_per_step_on_' + emu]:.2f} ({emu})"] for r in results])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
