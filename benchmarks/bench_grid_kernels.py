"""The grid rounding kernels alone (vtrain.fused), in ns a value: what every rounded op output pays.

    .venv/bin/python benchmarks/bench_grid_kernels.py [--bits 19 32] [--size 65536] [--reps 400]

For float64 and float32 work (float32 at bits < 32 only: every float32 is a grid value at 32), over `--size` values
of N(0, 0.1^2) in cache, one thread, medians of `--reps` calls:

    round_into      the output rounded into another array
    round_in_place  rounded where it lies (the copy that restores the input each time measured apart, subtracted)
    round_near      rounded, and the candidates within a per-value band of a rounding boundary collected (the
                    recording trainer's pass), the band a few units of the work dtype's last place

To compare two versions of the code, run the script from each tree (it imports the vtrain beside it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vtrain import fused  # noqa: E402
from vtrain.grid import grid_max  # noqa: E402


def _ns(call: Callable[[], object], size: int, reps: int) -> float:
    call()  # (the first call compiles or loads the kernel)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) / size * 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bits", type=int, nargs="+", default=[19, 32], help="grid sizes (10 to 32)")
    ap.add_argument("--size", type=int, default=1 << 16, help="values a call")
    ap.add_argument("--reps", type=int, default=400, help="calls timed per kernel")
    args = ap.parse_args()
    gen = np.random.default_rng(0)
    print("| work | bits | round_into | round_in_place | round_near |\n|---|---|---|---|---|")
    for dtype in (np.float64, np.float32):
        for bits in args.bits:
            if dtype == np.float32 and bits == 32:
                continue
            m, top, n = bits - 9, grid_max(bits), args.size
            x = (gen.standard_normal(n) * 0.1).astype(dtype)
            v, out = x.copy(), np.empty_like(x)
            cand, held = np.empty(n, np.int64), np.empty(n, dtype)
            band = (np.abs(x) * 4 * np.finfo(dtype).eps).astype(dtype)
            copy = _ns(lambda: np.copyto(v, x), n, args.reps)
            into = _ns(lambda: fused.round_into(x, out, m, top), n, args.reps)
            in_place = _ns(lambda: (np.copyto(v, x), fused.round_in_place(v, m, top)), n, args.reps) - copy
            near = _ns(lambda: fused.round_near(x, band, 2.0, m, top, out, cand, held), n, args.reps)
            print(f"| {np.dtype(dtype).name} | {bits} | {into:.2f} | {in_place:.2f} | {near:.2f} |")


if __name__ == "__main__":
    main()
