"""Checkpoint interval k: what a run stores, what training costs, and what a dispute costs, per k.

For each k the example spec is trained with `checkpoint_interval = k` into a fresh directory:
- storage: bytes of states/ (one state per leaf), logs/ (one log per step, the same for every k)
  and the index files (leaves.bin, steps.bin);
- train s: wall time of the whole `vtrain.train.train` call (median of --reps);
- leaves and the dispute's on-chain moves: a game halves the disputed range once per move until one
  leaf is left, so a dispute takes at most ceil(log2(leaves)) moves (one node of the tree per move);
- replay s: the referee's `replay_step_detail` of one leaf (an interval of k steps) in the middle
  of the run, median of --reps: the work a dispute leaves to the referee grows with k.

Usage (prints a markdown table):
    .venv/bin/python benchmarks/bench_interval.py --spec examples/mlp.toml --k 1 4 10 --reps 3
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import tempfile
import time
from pathlib import Path

import torch

from vtrain.audit import replay_step_detail
from vtrain.run import Run
from vtrain.spec import load_spec, to_toml
from vtrain.train import train

ROOT = Path(__file__).resolve().parents[1]


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def bench(spec_path: Path, k: int, reps: int) -> dict:
    spec = dataclasses.replace(load_spec(spec_path), checkpoint_interval=k)
    times, replays = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(reps):
            out = Path(tmp) / f"run{rep}"
            t0 = time.perf_counter()
            train(spec, out, spec_toml=to_toml(spec))
            times.append(time.perf_counter() - t0)
        run = Run.open(out)
        middle = run.size // 2
        for _ in range(reps):
            t0 = time.perf_counter()
            assert replay_step_detail(run, middle).equal
            replays.append(time.perf_counter() - t0)
        return {"k": k, "steps": run.steps, "leaves": run.size, "states": _bytes(out / "states"),
                "logs": _bytes(out / "logs"), "index": _bytes(out / "leaves.bin") + _bytes(out / "steps.bin"),
                "train": statistics.median(times), "moves": math.ceil(math.log2(run.size)),
                "replay": statistics.median(replays), "replayed_steps": len(run.intervals.steps_of(middle))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, default=ROOT / "examples" / "mlp.toml")
    ap.add_argument("--k", type=int, nargs="+", default=[1, 4, 10])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"Command: `.venv/bin/python benchmarks/bench_interval.py --spec {args.spec.relative_to(ROOT)} "
          f"--k {' '.join(map(str, args.k))} --reps {args.reps}` (torch {torch.__version__}, threads={args.threads})\n")
    print("| k | steps | leaves | states bytes | logs bytes | leaves+steps.bin bytes | train s | dispute moves (max) "
          "| referee replay of one leaf s (steps) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k in args.k:
        r = bench(args.spec.resolve(), k, args.reps)
        print(f"| {r['k']} | {r['steps']} | {r['leaves']} | {r['states']:,} | {r['logs']:,} | {r['index']:,} | "
              f"{r['train']:.2f} | {r['moves']} | {r['replay']:.3f} ({r['replayed_steps']}) |")


if __name__ == "__main__":
    main()
