"""The one-pass binary IEEE ops (vtrain.fused_binary) on and off, side by side in one process.

Three sessions of one model-family spec step in turn: the trainer with the path, the trainer without it
(every output left to the two-pass way: torch's op, then the rounding), and plain FP64 training. The order
is reversed every other step (the first arm of a step measured up to 5 % slower in session 14). Prints
median step times, the ratios, and whether the two trainers' logs and final states are identical (they must
be: the path computes the same bits).

    .venv/bin/python benchmarks/bench_one_pass.py --family resnet-tiny --set width=32 --set batch_size=32
    .venv/bin/python benchmarks/bench_one_pass.py --family gpt2-tiny --set d_model=256 --set context=128 \\
        --set batch_size=8 [--exact]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "families"))

from familykit import family_spec, write_cifar, write_corpus  # noqa: E402
from vtrain import fused_binary  # noqa: E402
from vtrain.state import state_hash  # noqa: E402
from vtrain.train import TrainingSession  # noqa: E402

ARMS = ("one pass", "two passes", "plain64")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=("gpt2-tiny", "resnet-tiny"), default="resnet-tiny")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=INT",
                    help="change an integer spec field, e.g. width=32 (repeatable)")
    ap.add_argument("--steps", type=int, default=9, help="steps per arm (the first is left out of the medians)")
    ap.add_argument("--exact", action="store_true", help='resolution "exact" instead of the log')
    args = ap.parse_args()
    changes = {k: int(v) for k, v in (item.split("=", 1) for item in args.set)}
    torch.set_num_threads(1)
    on = fused_binary.MIN_ELEMENTS
    with tempfile.TemporaryDirectory() as tmp:
        data = {"cifar10": write_cifar(Path(tmp) / "cifar"), "text": write_corpus(Path(tmp) / "corpus.txt")}
        spec = family_spec(args.family, data, steps=args.steps + 2, **changes)
        if args.exact:
            spec = dataclasses.replace(spec, resolution="exact")
        sessions = {arm: TrainingSession(spec) for arm in ARMS}
        secs: dict[str, list[float]] = {arm: [] for arm in ARMS}
        logs: dict[str, list[bytes]] = {arm: [] for arm in ARMS}
        for t in range(1, args.steps + 1):
            for arm in ARMS if t % 2 else reversed(ARMS):
                fused_binary.MIN_ELEMENTS = on if arm == "one pass" else 1 << 62
                start = time.perf_counter()
                r = sessions[arm].step(t, "none" if arm == "plain64" else "record")
                secs[arm].append(time.perf_counter() - start)
                logs[arm].append(r.log_bytes)
        fused_binary.MIN_ELEMENTS = on
    ms = {arm: 1000 * statistics.median(v[1:]) for arm, v in secs.items()}
    same = logs["one pass"] == logs["two passes"] and \
        state_hash(sessions["one pass"].state_bytes()) == state_hash(sessions["two passes"].state_bytes())
    name = args.family + "".join(f" {k}={v}" for k, v in changes.items()) + (" exact" if args.exact else "")
    print("| model | one pass ms | two passes ms | plain64 ms | one / two | one / plain64 | two / plain64 | "
          "identical logs and states |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {name} | {ms['one pass']:.1f} | {ms['two passes']:.1f} | {ms['plain64']:.1f} | "
          f"{ms['one pass'] / ms['two passes']:.3f}x | {ms['one pass'] / ms['plain64']:.2f}x | "
          f"{ms['two passes'] / ms['plain64']:.2f}x | {same} |")
    if not same:
        sys.exit("the one-pass path changed a log or a state: it must compute the two-pass bits")


if __name__ == "__main__":
    main()
