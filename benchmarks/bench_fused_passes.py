"""The model families' fused elementwise passes (vtrain.fused_norms, vtrain.fused_gelu), one pass at a time on one
thread, in ns a value, side by side with a numpy pass that reads and writes as many arrays: how far each pass is
from the memory traffic it cannot avoid. Medians of --reps calls over one norm's or GELU's values (float32-grid
float64 values; a batch norm's (N, C, H, W) statistics a channel, a layer norm's a row).

    .venv/bin/python benchmarks/bench_fused_passes.py                      # resnet-tiny's first batch norm, GPT-2's GELU
    .venv/bin/python benchmarks/bench_fused_passes.py --norm layer --shape 8 128 256
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

from vtrain import fused_gelu, fused_norms  # noqa: E402
from vtrain.grid import grid_max  # noqa: E402

LIMIT = grid_max(32)
# (pass, the arrays it reads, the arrays it writes)
NORM_PASSES = (("CENTER", 1, 2), ("AFFINE", 1, 1), ("SCALE_GRADS", 2, 2), ("QUOTIENT_GRADS", 2, 2),
               ("SQUARE_GRADS", 2, 2), ("MEAN_GRAD", 0, 1))
GELU_PASSES = (("INNER", 1, 1), ("OUTER", 2, 1), ("BACKWARD", 3, 1))


def _median_ns(call: Callable[[], object], values: int, reps: int) -> float:
    call()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return 1e9 * statistics.median(times) / values


def _traffic(arrays: list[np.ndarray], reads: int, writes: int) -> Callable[[], None]:
    """A numpy pass reading `reads` of the arrays and writing `writes` others (at least one of each)."""
    ins, outs = arrays[:max(reads, 1)], arrays[4:4 + max(writes, 1)]

    def run() -> None:
        for j, out in enumerate(outs):
            np.add(ins[j % len(ins)], 1.0, out=out)

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--norm", choices=("batch", "layer"), default="batch", help="the norm's layout (default batch)")
    ap.add_argument("--shape", type=int, nargs="+", default=[32, 32, 32, 32],
                    help="the norm's input: N C H W (batch) or rows... D (layer); default resnet-tiny width 32's")
    ap.add_argument("--gelu", type=int, default=8 * 128 * 1024, help="values of the GELU's passes (GPT-2-tiny's)")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    size = int(np.prod(args.shape))
    if args.norm == "batch":
        n, c, h, w = args.shape
        width, period, count, channels = h * w, c, n * h * w, True
    else:
        width, period, count, channels = args.shape[-1], size // args.shape[-1], args.shape[-1], False
    stats = np.abs(rng.standard_normal(period)).astype(np.float32).astype(np.float64) + 0.5
    params = np.abs(rng.standard_normal(period if channels else width)).astype(np.float32).astype(np.float64)
    arrays = [rng.standard_normal(size).astype(np.float32).astype(np.float64) for _ in range(6)]
    rows = size // width
    print(f"# {args.norm} norm over {args.shape}, GELU over {args.gelu} values, one thread; ns a value (median of "
          f"{args.reps})")
    print("| pass | fused | numpy, the same arrays | fused / numpy |")
    print("|---|---|---|---|")
    a, b, o, p = arrays[0], arrays[1], arrays[4], arrays[5]
    # (each pass's inputs in _pass's order: the statistics and parameters where it reads them, values elsewhere)
    inputs = {"CENTER": (a, stats, a, a), "AFFINE": (a, stats, params, params), "SCALE_GRADS": (a, b, stats, params),
              "QUOTIENT_GRADS": (a, b, stats, a), "SQUARE_GRADS": (stats, a, b, a), "MEAN_GRAD": (stats, a, a, a)}
    for name, reads, writes in NORM_PASSES:
        code = getattr(fused_norms, name + ("_CHANNELS" if channels and name in ("AFFINE", "SCALE_GRADS") else ""))
        ins = inputs[name]
        fused = _median_ns(lambda: fused_norms._pass(code, *ins, o, p, 0, rows, width, period, count, LIMIT),
                           size, args.reps)
        plain = _median_ns(_traffic(arrays, reads, writes), size, args.reps)
        print(f"| norm {name} | {fused:.2f} | {plain:.2f} | {fused / plain:.2f}x |")
    g = [rng.standard_normal(args.gelu).astype(np.float32).astype(np.float64) for _ in range(6)]
    t = np.tanh(g[1]).astype(np.float32).astype(np.float64)  # (the tanh's output, which the two later passes read)
    for name, reads, writes in GELU_PASSES:
        code = getattr(fused_gelu, name)
        fused = _median_ns(lambda: fused_gelu._pass(code, g[0], t, g[2], g[3], g[4], g[5], 0, args.gelu, 1, 1, 1,
                                                    LIMIT), args.gelu, args.reps)
        plain = _median_ns(_traffic(g, reads, writes), args.gelu, args.reps)
        print(f"| GELU {name} | {fused:.2f} | {plain:.2f} | {fused / plain:.2f}x |")


if __name__ == "__main__":
    main()
