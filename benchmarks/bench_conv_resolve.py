"""The exact resolution's convolution recomputation, two ways side by side (issue 7).

Under `resolution = "exact"` the ambiguous outputs of a convolution and of its backward are recomputed as
correctly rounded exact sums. The reference path gathers every position's terms first (torch's indexing,
or `resolve._weight_taps` for weight gradients) and then sums them in vtrain.exactdot; the resolver now sums
each position's terms as its kernel gathers them (`resolve._forward_dots`, `_input_dots`, `_weight_dots`).
This script runs one resnet-tiny step under a mode that records each convolution's operands, rounds them to
the FP32 grid (the trainer's operands are grid values), and for each output recomputes the same random
positions both ways, alternating, checking that the values are bit-identical. It prints each layer's
medians and the ratio old / new.

    .venv/bin/python benchmarks/bench_conv_resolve.py --set width=32 --set batch_size=32 --positions 100
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "families"))

from bench_engine import FloorSession, PassThrough  # noqa: E402
from familykit import family_spec, write_cifar, write_corpus  # noqa: E402
from vtrain import resolve, round_to_grid  # noqa: E402

aten = torch.ops.aten
CONVOLUTIONS = (aten.convolution.default, aten.convolution_backward.default)


class Recorder(PassThrough):
    """PassThrough that keeps a copy of every convolution's (op, args, kwargs), its floats on the grid."""

    def __init__(self, bits: int) -> None:
        super().__init__()
        self.bits, self.ops = bits, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func in CONVOLUTIONS:
            kept = tuple(round_to_grid(a.detach().clone(), self.bits) if isinstance(a, torch.Tensor)
                         and a.is_floating_point() else a for a in args)
            self.ops.append((func, kept, dict(kwargs or {})))
        return func(*args, **(kwargs or {}))


class RecordingSession(FloorSession):
    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.recorder = Recorder(32)

    def _context(self, rounding: str, t: int, replay_log: object) -> Recorder:
        return self.recorder


def _timed(fn) -> tuple[float, np.ndarray]:  # noqa: ANN001
    """(seconds, result) of one call."""
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=INT",
                    help="a resnet-tiny size setting, e.g. width=32 (repeatable)")
    ap.add_argument("--positions", type=int, default=100, help="positions recomputed per output")
    ap.add_argument("--reps", type=int, default=9, help="timed repetitions of each way (alternating)")
    args = ap.parse_args()
    changes = {k: int(v) for k, v in (s.split("=", 1) for s in args.set)}
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        spec = family_spec("resnet-tiny", {"cifar10": write_cifar(Path(tmp) / "cifar"),
                                           "text": write_corpus(Path(tmp) / "corpus.txt")}, steps=10, **changes)
        session = RecordingSession(spec)
        session.step(1, "none")
    rng = np.random.default_rng(0)
    label = " ".join(f"{k}={v}" for k, v in changes.items())
    print(f"resnet-tiny {label}: {args.positions} positions an output, medians of {args.reps}\n")
    print("| op | output | operands | terms | reference ms | summed as gathered ms | ratio |\n|---|---|---|---|---|---|---|")
    for op, op_args, kwargs in session.recorder.ops:
        outs = op(*op_args, **kwargs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        for i, out in enumerate(outs[:2]):  # (grad_bias, a plain sum, has no gathering kernel)
            if out is None:
                continue
            pos = np.sort(rng.choice(out.numel(), min(args.positions, out.numel()), replace=False))
            shapes = " ".join(str(tuple(a.shape)) for a in op_args[:3] if isinstance(a, torch.Tensor))
            name = "convolution" if op is aten.convolution.default else "backward"
            if resolve._convolution_matmul(op, op_args, kwargs, i, pos.size) is not None:
                print(f"| {name} | {i} | {shapes} | | (as a matmul both ways) | | |")
                continue
            width, part = (resolve._convolution_terms if op is aten.convolution.default
                           else resolve._convolution_backward_terms)(op_args, kwargs, i)
            old_s, new_s, old, new = [], [], None, None
            for _ in range(args.reps):  # alternating, so that machine load hits both alike
                s, old = _timed(lambda: resolve._chunked(pos, width, resolve._rounded(part, 32)))
                old_s.append(s)
                s, new = _timed(lambda: resolve.resolver_for(op)(op_args, kwargs, i, pos, 32))
                new_s.append(s)
            if not np.array_equal(old.view(np.int64), new.view(np.int64)):
                sys.exit(f"{name} output {i} {shapes}: the two ways differ")
            o, n = statistics.median(old_s), statistics.median(new_s)
            print(f"| {name} | {i} | {shapes} | {width} | {o * 1e3:.2f} | {n * 1e3:.2f} | {o / n:.1f}x |")


if __name__ == "__main__":
    main()
