"""Checkpoint interval k: what a run stores, what training costs, and what a dispute costs, per k.

For each k the example spec is trained with `checkpoint_interval = k` into a fresh directory:
- storage: bytes of states/ (one state per leaf), logs/ (one log per step, the same for every k)
  and the index files (leaves.bin, steps.bin);
- train s: wall and CPU time of the whole `vtrain.train.train` call (medians of --reps, the k
  interleaved; CPU time is the steadier figure on a shared machine, one torch thread);
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
    """Bytes of a file, or of every file under a directory (0 when absent)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench(spec_path: Path, ks: list[int], reps: int, tmp: Path) -> list[dict]:
    """Train every k once per repetition, round-robin, so that a busy machine slows all k alike."""
    specs = {k: dataclasses.replace(load_spec(spec_path), checkpoint_interval=k) for k in ks}
    wall: dict[int, list[float]] = {k: [] for k in ks}
    cpu: dict[int, list[float]] = {k: [] for k in ks}
    for rep in range(reps):
        for k in ks:
            out = tmp / f"k{k}-{rep}"
            t0, c0 = time.perf_counter(), time.process_time()
            train(specs[k], out, spec_toml=to_toml(specs[k]))
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    rows = []
    for k in ks:
        out = tmp / f"k{k}-0"
        run = Run.open(out)
        middle = run.size // 2
        replays = []
        for _ in range(reps):
            t0 = time.perf_counter()
            assert replay_step_detail(run, middle).equal
            replays.append(time.perf_counter() - t0)
        rows.append({"k": k, "steps": run.steps, "leaves": run.size, "states": _bytes(out / "states"),
                     "logs": _bytes(out / "logs"), "index": _bytes(out / "leaves.bin") + _bytes(out / "steps.bin"),
                     "wall": statistics.median(wall[k]), "cpu": statistics.median(cpu[k]),
                     "moves": math.ceil(math.log2(run.size)), "replay": statistics.median(replays),
                     "replayed_steps": len(run.intervals.steps_of(middle))})
    return rows


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
    print("| k | steps | leaves | states bytes | logs bytes | leaves+steps.bin bytes | train wall s | train CPU s "
          "| dispute moves (max) | referee replay of one leaf s (steps) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for r in bench(args.spec.resolve(), args.k, args.reps, Path(tmp)):
            print(f"| {r['k']} | {r['steps']} | {r['leaves']} | {r['states']:,} | {r['logs']:,} | {r['index']:,} | "
                  f"{r['wall']:.2f} | {r['cpu']:.2f} | {r['moves']} | {r['replay']:.3f} ({r['replayed_steps']}) |")

if __name__ == "__main__":
    main()
