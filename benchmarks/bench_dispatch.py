"""What rounded execution costs before it rounds anything: the price of a Python dispatch mode (issue 3).

The trainer intercepts every aten op with a TorchDispatchMode (vtrain.rounding). Any such mode costs time
by itself: each op pays the trip into Python, and autograd, which accumulates a gradient that several uses
of a tensor send back in place when no mode is active, accumulates out of place under any mode (torch's
InputBuffer treats every tensor as a subclass then), so a residual stream's or a shared weight's gradient
sums become fresh tensors. This benchmark separates that floor from the rounding and the log: per step, in
one process, the four interleaved step by step so that machine load hits them alike,

    native      plain FP64 training, no mode
    pass        the same with forward and backward under a mode that only calls each op (bench_engine's
                floor: what any dispatch-level design pays; the optimizer outside it, as the trainer's
                fused one dispatches nothing per element)
    rounding    RoundedExecution in mode "plain": every output rounded, nothing logged
    trainer     RoundedExecution recording the bound log (what `vtrain train` runs)

and prints medians (steps 3 onward) and ratios to native.

    .venv/bin/python benchmarks/bench_dispatch.py --family gpt2-tiny --set d_model=256 --set context=128 \\
        --set batch_size=8 --steps 10
    .venv/bin/python benchmarks/bench_dispatch.py --family resnet-tiny --set width=32 --set batch_size=32
    .venv/bin/python benchmarks/bench_dispatch.py --family scale/gpt2-tiny --steps 10   # float32 work, bits = 20

`--threads N` runs every mode on N torch threads (default 1, as bench_families).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "families"))

from bench_engine import FloorSession  # noqa: E402 (the examples' floor column: the same mode)
from familykit import family_spec, write_cifar, write_corpus  # noqa: E402
from vtrain.train import TrainingSession  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=("gpt2-tiny", "resnet-tiny", "scale/gpt2-tiny", "scale/resnet-tiny"),
                    default="gpt2-tiny", help="a model family, or its scale model (float32 work at bits = 20 or 19: "
                    "native is then plain FP32 training)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=INT",
                    help="a family size setting, e.g. d_model=256 (repeatable)")
    ap.add_argument("--steps", type=int, default=8, help="steps per mode; the first two are warm-up")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads for every mode (vtrain's long passes split across them: vtrain.omp)")
    args = ap.parse_args()
    changes = {k: int(v) for k, v in (s.split("=", 1) for s in args.set)}
    steps = max(args.steps, 3)  # (two of warm-up, one measured at least)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        data = {"cifar10": write_cifar(Path(tmp) / "cifar"), "text": write_corpus(Path(tmp) / "corpus.txt")}
        # (the spec's run length: longer than its learning-rate warm-up, as bench_families sets it)
        spec = family_spec(args.family, data, steps=max(steps, 10), **changes)
        runs = {"native": (TrainingSession(spec), "none"), "pass": (FloorSession(spec), "none"),
                "rounding": (TrainingSession(spec), "plain"), "trainer": (TrainingSession(spec), "record")}
        secs: dict[str, list[float]] = {k: [] for k in runs}
        for t in range(1, steps + 1):
            for name, (session, mode) in runs.items():
                secs[name].append(session.step(t, mode).seconds)
    med = {k: statistics.median(v[2:]) for k, v in secs.items()}
    label = " ".join(f"{k}={v}" for k, v in changes.items())
    print(f"{args.family} {label} ({steps - 2} steps, medians, {args.threads} torch thread(s))")
    print("| mode | ms / step | / native |\n|---|---|---|")
    for k, v in med.items():
        print(f"| {k} | {v * 1e3:.1f} | {v / med['native']:.2f}x |")


if __name__ == "__main__":
    main()
