"""A trainer feature on and off, side by side in one process: the one-pass binary IEEE ops
(vtrain.fused_binary, `--toggle one-pass`, the default) or the line-norm cache of the matmul pre-filters
(vtrain.prefilter.LineNorms, `--toggle line-norms`).

Three sessions of one model-family spec step in turn: the trainer with the feature, the trainer without it
(one pass: every output left to the two-pass way, torch's op and then the rounding; line norms: each
operand normed afresh at every use, by the same one-pass kernel, the other axis left unused), and plain FP64 training. The order is reversed every
other step (the first arm of a step measured up to 5 % slower in session 14). Prints median step times, the
ratios, and whether the two trainers' logs and final states are identical, and exits 1 if not: the one-pass
ops compute the two-pass bits, and the cache's norms move U, which only chooses where E is looked at, by
last bits (a differing log would show a decision that U made).

    .venv/bin/python benchmarks/bench_one_pass.py --family resnet-tiny --set width=32 --set batch_size=32
    .venv/bin/python benchmarks/bench_one_pass.py --family gpt2-tiny --set d_model=256 --set context=128 \\
        --set batch_size=8 [--exact] [--toggle line-norms]
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
from vtrain import fused_binary, prefilter  # noqa: E402
from vtrain.state import state_hash  # noqa: E402
from vtrain.train import TrainingSession  # noqa: E402

ARMS = ("on", "off", "plain64")
_MIN_ELEMENTS, _CACHED = fused_binary.MIN_ELEMENTS, prefilter.LineNorms.of


def _uncached(self: prefilter.LineNorms, t: torch.Tensor, out: object) -> tuple[bool, bool]:
    return prefilter._line_norms(t, out)


def _one_pass(on: bool) -> None:
    fused_binary.MIN_ELEMENTS = _MIN_ELEMENTS if on else 1 << 62


def _line_norms(on: bool) -> None:
    prefilter.LineNorms.of = _CACHED if on else _uncached


TOGGLES = {"one-pass": _one_pass, "line-norms": _line_norms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=("gpt2-tiny", "resnet-tiny"), default="resnet-tiny")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=INT",
                    help="change an integer spec field, e.g. width=32 (repeatable)")
    ap.add_argument("--steps", type=int, default=9, help="steps per arm (the first is left out of the medians)")
    ap.add_argument("--exact", action="store_true", help='resolution "exact" instead of the log')
    ap.add_argument("--toggle", choices=tuple(TOGGLES), default="one-pass", help="the feature switched")
    args = ap.parse_args()
    switch = TOGGLES[args.toggle]
    changes = {k: int(v) for k, v in (item.split("=", 1) for item in args.set)}
    torch.set_num_threads(1)
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
                switch(arm == "on")
                start = time.perf_counter()
                r = sessions[arm].step(t, "none" if arm == "plain64" else "record")
                secs[arm].append(time.perf_counter() - start)
                logs[arm].append(r.log_bytes)
        switch(True)
    ms = {arm: 1000 * statistics.median(v[1:]) for arm, v in secs.items()}
    same = logs["on"] == logs["off"] and \
        state_hash(sessions["on"].state_bytes()) == state_hash(sessions["off"].state_bytes())
    name = args.family + "".join(f" {k}={v}" for k, v in changes.items()) + (" exact" if args.exact else "")
    print(f"| model ({args.toggle}) | on ms | off ms | plain64 ms | on / off | on / plain64 | off / plain64 | "
          "identical logs and states |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {name} | {ms['on']:.1f} | {ms['off']:.1f} | {ms['plain64']:.1f} | "
          f"{ms['on'] / ms['off']:.3f}x | {ms['on'] / ms['plain64']:.2f}x | "
          f"{ms['off'] / ms['plain64']:.2f}x | {same} |")
    if not same:
        sys.exit(f"{args.toggle} changed a log or a state: it must not change a bit of either")


if __name__ == "__main__":
    main()
