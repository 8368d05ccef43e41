"""Per-step cost of rounded execution vs plain training, and log sizes per policy (numerics only).

    .venv/bin/python benchmarks/bench_rounding.py [--steps 20] [--reps 5] [--threads 1]

Models are the numerics tests' MLP (64-64-10, Adam) and CNN (two 3x3 convs, AdamW), batch 32 of sklearn
digits, plus wider MLPs: mlp-wide 64-256-256-10 (batch 32), mlp-xl 64-1024-1024-10 (batch 256) and mlp-xxl
64-2048-2048-10 (batch 512),
with vtrain's optimizers (vtrain.fused_optim, as training builds them; plain runs use them too). Float64
work at bits = 32 on device cpu. Timings are process CPU time (time.process_time: with one thread that is
the compute time, which other processes on a shared machine disturb far less than wall time), medians over
interleaved repetitions of `--steps` steps. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "numerics"))

from numkit import batch, make_model, make_optimizer  # noqa: E402
from vtrain.devices import get_device  # noqa: E402
from vtrain.fused_optim import RoundedAdam  # noqa: E402
from vtrain.grid import round_to_grid  # noqa: E402
from vtrain.rounding import RoundedExecution  # noqa: E402


BATCH = {"mlp-xl": 256, "mlp-xxl": 512}  # the others: 32
WIDTH = {"mlp-wide": 256, "mlp-xl": 1024, "mlp-xxl": 2048}


def _model(kind: str, dtype: torch.dtype) -> tuple[nn.Module, torch.optim.Optimizer]:
    if kind in WIDTH:
        torch.manual_seed(0)
        w = WIDTH[kind]
        model = nn.Sequential(nn.Linear(64, w), nn.ReLU(), nn.Linear(w, w), nn.ReLU(), nn.Linear(w, 10)).to(dtype)
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(round_to_grid(p, 32))
        return model, RoundedAdam(model.parameters(), lr=1e-3, foreach=False)
    model = make_model(kind, dtype, 32)
    return model, make_optimizer(kind, model, fused=True)


def _steps(kind: str, variant: str, steps: int, logs: list | None) -> tuple[float, list, list]:
    dtype = torch.float32 if variant == "plain-fp32" else torch.float64
    model, opt = _model(kind, dtype)
    out_logs, stats = [], []
    hints: dict = {}  # the whole-op tests that failed, kept across steps as a TrainingSession keeps them
    data = [batch(t, dtype, BATCH.get(kind, 32)) for t in range(steps)]
    t0 = time.process_time()
    for t, (x, y) in enumerate(data):
        if variant.startswith("plain-fp"):
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            continue
        mode, policy = {"rounded": ("plain", "bound"), "record": ("record", "bound"), "record-tau": ("record", "tau"),
                        "replay": ("replay", "bound")}[variant]
        with RoundedExecution(bits=32, device=get_device("cpu"), mode=mode, policy=policy, step=t,
                              replay_log=logs[t] if logs else None, measure_storage=False, grain_hints=hints) as rx:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        out_logs.append(rx.log)
        stats.append(rx.stats)
    return (time.process_time() - t0) / steps, out_logs, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="mlp,cnn,mlp-wide")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    variants = ["plain-fp32", "plain-fp64", "rounded", "record", "record-tau", "replay"]
    print("| model | " + " | ".join(f"{v} ms" for v in variants) + " | record/fp64 | replay/fp64 | rounded/fp64 |")
    print("|---|" + "---|" * (len(variants) + 3))
    sizes = []
    for kind in args.models.split(","):
        _, logs, _ = _steps(kind, "record", args.steps, None)  # warm-up, and the log the replay uses
        times: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(args.reps):
            for v in variants:
                times[v].append(_steps(kind, v, args.steps, logs if v == "replay" else None)[0])
        med = {v: statistics.median(ts) * 1e3 for v, ts in times.items()}
        print(f"| {kind} | " + " | ".join(f"{med[v]:.2f}" for v in variants)
              + f" | {med['record'] / med['plain-fp64']:.2f} | {med['replay'] / med['plain-fp64']:.2f}"
              + f" | {med['rounded'] / med['plain-fp64']:.2f} |")
        for policy in ("bound", "tau"):
            model, opt = _model(kind, torch.float64)
            tot = {"rounded": 0, "logged": 0, "logged_values": 0, "log_bytes": 0, "dense_bytes": 0, "dense_zip_bytes": 0}
            for t in range(args.steps):
                x, y = batch(t, torch.float64, BATCH.get(kind, 32))
                with RoundedExecution(bits=32, device=get_device("cpu"), policy=policy, step=t) as rx:
                    opt.zero_grad()
                    F.cross_entropy(model(x), y).backward()
                    opt.step()
                for key in tot:
                    tot[key] += rx.stats[key]
            sizes.append((kind, policy, {k: v / args.steps for k, v in tot.items()}))
    print()
    print("| model | policy | rounded values/step | logged/step (fraction) | value entries/step | sparse bytes/step "
          "| dense bytes/step | dense+zip bytes/step | dense/sparse |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, policy, s in sizes:
        print(f"| {kind} | {policy} | {s['rounded']:.0f} | {s['logged']:.0f} ({s['logged'] / s['rounded']:.2%}) "
              f"| {s['logged_values']:.1f} | {s['log_bytes']:.0f} | {s['dense_bytes']:.0f} | {s['dense_zip_bytes']:.0f} "
              f"| {s['dense_bytes'] / max(s['log_bytes'], 1):.1f}x |")


if __name__ == "__main__":
    main()
