"""Canonical rounding benchmark (issue 7): resolution "exact" vs the log vs plain training.

Side by side in one process, medians over interleaved repetitions (each repetition runs every mode once):
  exact      trainer with resolution "exact" (no log); its auditor does exactly the same work
  log        trainer with the bound log (mode "record")
  log-audit  auditor replaying that log (mode "replay")
  plain64    native torch FP64, no dispatch mode
  plain32    native torch FP32, no dispatch mode
Then, from one exact run: elements checked per step, the fraction near a boundary ("ambiguous") per
op class, how many of those were certified exact (no recomputation), how many were recomputed exactly and
the time that took, and how many outputs float32 work computed in float64 (vtrain.refine, "refined"); and
the log bytes per step of each resolution (0 for exact).

    .venv/bin/python benchmarks/bench_exact.py                        # logreg, mlp, cnn; 20 steps, 5 reps
    .venv/bin/python benchmarks/bench_exact.py --examples scale/cnn --steps 12 --reps 3
    .venv/bin/python benchmarks/bench_exact.py --examples mlp --set hidden=1024 --set batch_size=256
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_engine import markdown_table, mean_stat, run_steps  # noqa: E402
from vtrain.spec import load_spec  # noqa: E402

# op name prefix -> class, for the ambiguous fractions
OP_CLASSES = {
    "linear": ("aten.mm", "aten.addmm", "aten.bmm", "aten.mv", "aten.dot", "aten.convolution",
               "aten.embedding_dense_backward", "aten.avg_pool2d", "aten.max_pool2d"),
    "sum/mean": ("aten.sum", "aten.mean"),
    "transcendental": ("aten.exp", "aten.log", "aten.tanh", "aten.sigmoid", "aten.expm1", "aten.log1p",
                       "aten.rsqrt", "aten.pow", "aten.erf", "aten.gelu"),
    "loss": ("aten.nll_loss",),
}


def op_class(name: str) -> str:
    return next((c for c, prefixes in OP_CLASSES.items() if name.startswith(prefixes)), "other")


def by_class(stats: list[dict]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for s in stats:
        for name, tally in s.get("by_op", {}).items():
            acc = out.setdefault(op_class(name), [0, 0, 0, 0, 0])
            for i, v in enumerate(tally):
                acc[i] += v
    return out


def bench_example(name: str, steps: int, reps: int, changes: dict) -> dict:
    spec = dataclasses.replace(load_spec(ROOT / "examples" / f"{name}.toml"), steps=max(steps, 1), **changes)
    exact = dataclasses.replace(spec, resolution="exact")
    spec32 = dataclasses.replace(spec, dtype="float32", bits=32) if spec.dtype == "float64" else spec
    run_steps(exact, "cpu", "record", steps)  # warm-up (loads the compiled kernels)
    warm = run_steps(exact, "cpu", "record", steps)  # the statistics, on warm kernels
    log_run = run_steps(spec, "cpu", "record", steps)
    logs = log_run["logs"]
    times: dict[str, list[float]] = {k: [] for k in ("exact", "log", "log-audit", "plain64", "plain32")}
    for _ in range(reps):
        times["plain64"].append(run_steps(spec, "cpu", "none", steps)["seconds"] / steps)
        times["exact"].append(run_steps(exact, "cpu", "record", steps)["seconds"] / steps)
        times["log"].append(run_steps(spec, "cpu", "record", steps)["seconds"] / steps)
        times["log-audit"].append(run_steps(spec, "cpu", "replay", steps, logs)["seconds"] / steps)
        times["plain32"].append(run_steps(spec32, "cpu", "none", steps)["seconds"] / steps)
    med = {k: statistics.median(v) for k, v in times.items()}
    st = warm["stats"]
    return {
        "example": name + "".join(f" {k}={v}" for k, v in changes.items()), "steps": steps, "reps": reps, "dtype": spec.dtype, "bits": spec.bits,
        "ms_per_step": {k: round(v * 1e3, 3) for k, v in med.items()},
        "exact_vs_plain64": round(med["exact"] / med["plain64"], 2),
        "log_vs_plain64": round(med["log"] / med["plain64"], 2),
        "log_audit_vs_plain64": round(med["log-audit"] / med["plain64"], 2),
        "exact_vs_log": round(med["exact"] / med["log"], 2),
        "exact_vs_plain32": round(med["exact"] / med["plain32"], 2),
        "checked_per_step": mean_stat(st, "checked"),
        "ambiguous_per_step": mean_stat(st, "ambiguous"),
        "certified_per_step": mean_stat(st, "certified"),
        "refined_per_step": mean_stat(st, "refined"),
        "recomputed_per_step": mean_stat(st, "recomputed"),
        "exact_ms_per_step": round(mean_stat(st, "exact_seconds") * 1e3, 3),
        "by_class": by_class(st),
        "log_bytes_per_step": statistics.fmean(len(lg.to_bytes()) for lg in logs),
        "exact_log_bytes_per_step": 0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--examples", nargs="+", default=["logreg", "mlp", "cnn"],
                    help="example names under examples/ (e.g. mlp, scale/cnn)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=INT",
                    help="change an integer spec field of every example, e.g. hidden=1024 (repeatable)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    changes = {k: int(v) for k, v in (item.split("=", 1) for item in args.set)}
    results = [bench_example(name, args.steps, args.reps, changes) for name in args.examples]
    print(f"# torch {torch.__version__}, threads={args.threads}, steps={args.steps}, reps={args.reps}\n")
    markdown_table(["example", "plain32 ms", "plain64 ms", "exact ms", "log ms", "log audit ms", "exact/plain64",
                    "log/plain64", "log audit/plain64", "exact/log"],
                   [[r["example"], *(r["ms_per_step"][k] for k in ("plain32", "plain64", "exact", "log", "log-audit")),
                     *(f"{r[k]}x" for k in ("exact_vs_plain64", "log_vs_plain64", "log_audit_vs_plain64",
                                            "exact_vs_log"))] for r in results])
    print()
    markdown_table(["example", "checked/step", "ambiguous/step", "certified/step", "refined/step", "recomputed/step",
                    "exact ms/step", "log B/step", "exact log B/step"],
                   [[r["example"], f"{r['checked_per_step']:.0f}", f"{r['ambiguous_per_step']:.1f}",
                     f"{r['certified_per_step']:.1f}", f"{r['refined_per_step']:.1f}",
                     f"{r['recomputed_per_step']:.1f}", r["exact_ms_per_step"],
                     f"{r['log_bytes_per_step']:.0f}", 0] for r in results])
    print()
    markdown_table(["example", "op class", "checked", "ambiguous fraction", "certified", "refined", "recomputed"],
                   [[r["example"], cls, checked, f"{amb / max(checked, 1):.2e}", cert, ref, rec]
                    for r in results for cls, (checked, amb, cert, ref, rec) in sorted(r["by_class"].items())])
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
