"""Page faults and step times with and without vtrain.heap's malloc settings (docs/benchmarks.md, session 31).

The settings are per process, so each size runs in two child processes, one with VTRAIN_KEEP_FREED_MEMORY=0 (glibc's
own behaviour) and one without (the default), alternating pass by pass. In each child a plain float64 session
("none": native torch) and the trainer ("record", the bound log) step alternately; after the warm-up steps it
reports medians of ms a step, minor page faults a step (getrusage) and the kernel's ms a step, and the resident
memory at the end. Ratios are the trainer's to plain float64 within one child.

    .venv/bin/python benchmarks/bench_heap.py --passes 2 --steps 8
    .venv/bin/python benchmarks/bench_heap.py --size resnet-tiny:width=64,batch_size=32
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = ("gpt2-tiny:d_model=256,context=128,batch_size=8", "gpt2-tiny:d_model=512,context=128,batch_size=8",
         "resnet-tiny:width=32,batch_size=32", "resnet-tiny:width=64,batch_size=32")
WARMUP = 3


def child(size: str, steps: int) -> dict:
    """Step a plain float64 session and the trainer alternately in this process (see the module docstring)."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests" / "families"))
    import torch
    from familykit import family_spec, write_cifar, write_corpus

    from vtrain.train import TrainingSession
    torch.set_num_threads(1)
    family, _, fields = size.partition(":")
    changes = {k: int(v) for k, v in (f.split("=") for f in fields.split(",") if f)}
    rows: dict[str, list[tuple[float, int, float]]] = {"none": [], "record": []}
    with tempfile.TemporaryDirectory() as tmp:
        data = {"cifar10": write_cifar(Path(tmp) / "cifar"), "text": write_corpus(Path(tmp) / "corpus.txt")}
        # (the spec's length only shapes the schedule; the examples warm up for 5 steps, so at least 10)
        spec = family_spec(family, data, steps=max(steps + 1, 10), **changes)
        sessions = {mode: TrainingSession(spec) for mode in rows}
        for t in range(1, steps + 1):
            for mode, s in sessions.items():
                before = resource.getrusage(resource.RUSAGE_SELF)
                seconds = s.step(t, mode).seconds
                after = resource.getrusage(resource.RUSAGE_SELF)
                if t > WARMUP:
                    rows[mode].append((seconds * 1e3, after.ru_minflt - before.ru_minflt,
                                       (after.ru_stime - before.ru_stime) * 1e3))
    status = Path("/proc/self/status").read_text().splitlines()
    rss = next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS"))
    return {mode: [statistics.median(col) for col in zip(*r)] for mode, r in rows.items()} | {"rss_mb": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", action="append", default=[], metavar="FAMILY:KEY=INT,...",
                    help="a family and its changed integer fields (repeatable; default: the four goal sizes)")
    ap.add_argument("--steps", type=int, default=8, help=f"steps per child, the first {WARMUP} not counted")
    ap.add_argument("--passes", type=int, default=2, help="alternating passes of the two settings")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps)))
        return
    if args.steps <= WARMUP:
        ap.error(f"--steps must exceed the {WARMUP} warm-up steps")
    print("| size | malloc | pass | plain64 ms | trainer ms | trainer/plain64 | faults/step plain, trainer | "
          "kernel ms/step plain, trainer | RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size in args.size or SIZES:
        for p in range(1, args.passes + 1):
            for label, keep in (("glibc's", "0"), ("kept", "1")):
                env = {**os.environ, "VTRAIN_KEEP_FREED_MEMORY": keep}
                r = subprocess.run([sys.executable, __file__, "--child", size, "--steps", str(args.steps)],
                                   env=env, capture_output=True, text=True, check=False)
                if r.returncode:
                    sys.exit(f"{size} ({label} malloc) failed:\n{r.stderr}")
                m = json.loads(r.stdout)
                (pm, pf, ps), (tm, tf, ts) = m["none"], m["record"]
                print(f"| {size} | {label} | {p} | {pm:.1f} | {tm:.1f} | {tm / pm:.2f}x | {pf:.0f}, {tf:.0f} | "
                      f"{ps:.0f}, {ts:.0f} | {m['rss_mb']} |", flush=True)


if __name__ == "__main__":
    main()
