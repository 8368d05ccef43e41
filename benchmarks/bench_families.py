"""Model-family benchmark (issue 6): gpt2-tiny and resnet-tiny.

1. Time per step, in one process, modes interleaved step by step: plain32 and plain64 (native torch,
   no dispatch mode), trainer (rounded, bound log recorded), auditor (replaying the trainer's log on
   an emulated device). Medians of --steps steps after --warmup untimed ones (default 2, every mode);
   ratios are to plain64 and plain32 of the same run.
2. Log bytes per step: the bound sparse log (what the run commits to), the paper's dense ternary
   code over every rounded value, and dense + zip; entries and corrections per step.
3. The paper's divergence figure: l2 distance between the trainer's (cpu) and the auditor's
   (emu:splitk8-tree) weights after each step, for plain FP32 training, rounding without the log,
   and rounding with the log, on the scale models (FP32 work, bits = 20). Written as a PNG.

Data: the generated CIFAR-10-format batches and text corpus of tests/families (no download here).

    .venv/bin/python benchmarks/bench_families.py --steps 20 --fig-steps 50 --png docs/families-divergence.png
    # the trainer's overhead as the models grow (timing only, auditor on cpu; a comma list sweeps a field,
    # one row per size):
    .venv/bin/python benchmarks/bench_families.py --family gpt2-tiny --set d_model=128,256,384,512 \
        --set context=128 --set batch_size=8 --steps 6 --auditor cpu --no-figure [--exact]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "families"))

from familykit import family_spec, write_cifar, write_corpus  # noqa: E402
from vtrain.roundlog import StepLog  # noqa: E402
from vtrain.train import TrainingSession  # noqa: E402

FAMILIES = ("gpt2-tiny", "resnet-tiny")
AUDITOR = "emu:splitk8-tree"


def timing(spec, steps: int, auditor: str = AUDITOR, warmup: int = 2) -> dict:
    """Medians over `steps` steps after `warmup` untimed ones (every mode runs those too: a process's first steps
    load the compiled kernels from their cache and grow the heap, which later steps reuse)."""
    # (the plain sessions round nothing: their spec's resolution is moot, and float32 work's exact needs bits <= 19)
    sessions = {"plain32": TrainingSession(dataclasses.replace(spec, dtype="float32", resolution="log")),
                "plain64": TrainingSession(spec), "trainer": TrainingSession(spec),
                "auditor": TrainingSession(spec, auditor)}
    secs = {k: [] for k in sessions}
    stats, replay = [], []
    timed = range(warmup + 1, warmup + steps + 1)
    for t in range(1, warmup + steps + 1):
        for name, s in sessions.items():   # interleaved: machine load hits every mode alike
            if name == "auditor":  # (resolution exact: no log, the auditor computes what the trainer did)
                r = s.step(t, "replay", replay_log=StepLog.from_bytes(trainer_log) if trainer_log else None)
            else:
                r = s.step(t, "record" if name == "trainer" else "none")
            if name == "trainer":
                trainer_log = r.log_bytes
            if t in timed:
                secs[name].append(r.seconds)
                if name == "auditor":
                    replay.append(r.stats)
                elif name == "trainer":
                    stats.append({**r.stats, "log_file_bytes": len(r.log_bytes)})
    ms = {k: 1000 * statistics.median(v) for k, v in secs.items()}
    storage = TrainingSession(spec)
    storage.measure_storage = True  # the dense baselines: a second trainer, outside the timed ones
    dense = [r.stats for r in (storage.step(t, "record") for t in range(1, warmup + steps + 1)) if r.step in timed]

    def mean(rows: list[dict], key: str) -> float:
        return statistics.fmean(float(x.get(key, 0)) for x in rows)

    return {"ms": ms,
            "trainer/plain64": ms["trainer"] / ms["plain64"], "auditor/plain64": ms["auditor"] / ms["plain64"],
            "trainer/plain32": ms["trainer"] / ms["plain32"], "auditor/plain32": ms["auditor"] / ms["plain32"],
            "log_bytes": mean(stats, "log_file_bytes"), "dense_bytes": mean(dense, "dense_bytes"),
            "dense_zip_bytes": mean(dense, "dense_zip_bytes"), "rounded": mean(stats, "rounded"),
            "logged": mean(stats, "logged"), "value_entries": mean(stats, "logged_values"),
            "corrections": mean(replay, "corrections")}


def _weights(s: TrainingSession) -> torch.Tensor:
    return torch.cat([p.detach().double().reshape(-1) for _, p in sorted(s.model.named_parameters())])


def divergence(spec, steps: int) -> dict[str, list[float]]:
    """l2(trainer weights - auditor weights) after each step, for the three settings of the figure."""
    settings = {"plain FP32": (dataclasses.replace(spec, bits=32), "plain", "plain"),
                "rounding, no log": (spec, "record", "plain"),
                "rounding + log": (spec, "record", "replay")}
    out = {}
    for label, (sp, mode_t, mode_a) in settings.items():
        trainer, auditor = TrainingSession(sp), TrainingSession(sp, AUDITOR)
        dist = []
        for t in range(1, steps + 1):
            r = trainer.step(t, mode_t)
            auditor.step(t, mode_a, replay_log=StepLog.from_bytes(r.log_bytes) if mode_a == "replay" else None)
            dist.append(float(torch.linalg.vector_norm(_weights(trainer) - _weights(auditor))))
        out[label] = dist
    return out


def _allreduce_worker(group, path: str) -> list[float]:
    import torch.distributed as dist
    grads = torch.load(path)                              # (shards, P) grid values
    v = grads[list(group.shards(grads.shape[0]))].sum(0)  # this process's shards, then gloo's order
    if group.world > 1:
        dist.all_reduce(v)
    return v.tolist()


def allreduce_orders(shards: int = 4, elements: int = 100_000) -> dict[str, float]:
    """Fraction of FP64 gradient-sum elements that differ from the 1-process sum, per world size."""
    from vtrain.grid import round_to_grid
    from vtrain.parallel import run_workers
    g = torch.Generator().manual_seed(0)
    grads = round_to_grid(torch.randn(shards, elements, generator=g, dtype=torch.float64)
                          * torch.exp(torch.randn(1, elements, generator=g, dtype=torch.float64) * 3), 32)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "grads.pt")
        torch.save(grads, path)
        sums = {n: torch.tensor(run_workers(_allreduce_worker, n, path)) if n > 1 else grads.sum(0)
                for n in (1, 2, 4)}
    out = {f"N={n} vs N=1": float((sums[n] != sums[1]).double().mean()) for n in (2, 4)}
    out["N=4 vs N=2"] = float((sums[4] != sums[2]).double().mean())
    return out


def plot(curves: dict[str, dict[str, list[float]]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.6))
    for ax, (family, series) in zip(axes, curves.items()):
        for label, ys in series.items():
            # log axis: a zero distance (bit-identical weights) is drawn at the bottom edge
            ax.plot(range(1, len(ys) + 1), [max(y, 1e-12) for y in ys], label=label)
        ax.set_yscale("log")
        ax.set_ylim(5e-13, None)
        ax.set_title(f"{family} (scale model: FP32 work, bits = 20)")
        ax.set_xlabel("step")
        ax.set_ylabel("l2(trainer - auditor weights)")
        ax.legend()
    fig.suptitle(f"trainer cpu, auditor {AUDITOR}; 1e-12 = identical")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="steps timed per family")
    ap.add_argument("--warmup", type=int, default=2,
                    help="steps run before the timed ones, untimed, in every mode (default 2)")
    ap.add_argument("--fig-steps", type=int, default=50, help="steps of the divergence figure")
    ap.add_argument("--png", type=Path, default=ROOT / "docs" / "families-divergence.png")
    ap.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    ap.add_argument("--only-allreduce", action="store_true", help="only measure the all-reduce orders")
    ap.add_argument("--family", action="append", choices=FAMILIES, default=[],
                    help="time this family only (repeatable; default: all)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=INT[,INT...]",
                    help="change an integer spec field of the timed families, e.g. width=32 (repeatable); "
                         "a comma list times each value, every combination of the lists one row")
    ap.add_argument("--auditor", default=AUDITOR, help=f"the auditor's device (default {AUDITOR})")
    ap.add_argument("--no-figure", action="store_true", help="skip the divergence figure")
    ap.add_argument("--exact", action="store_true", help='time resolution "exact" (no log) instead of the log')
    ap.add_argument("--threads", type=int, default=1, help="torch threads for every mode (default 1)")
    args = ap.parse_args()
    sweep = {k: [int(x) for x in v.split(",")] for k, v in (item.split("=", 1) for item in args.set)}
    sizes = [dict(zip(sweep, values)) for values in itertools.product(*sweep.values())]
    torch.set_num_threads(args.threads)
    if args.only_allreduce:
        fractions = allreduce_orders()
        print("FP64 gradient-sum elements that differ: " + ", ".join(f"{k}: {100 * f:.1f}%"
                                                                     for k, f in fractions.items()))
        return
    with tempfile.TemporaryDirectory() as tmp:
        data = {"cifar10": write_cifar(Path(tmp) / "cifar"), "text": write_corpus(Path(tmp) / "corpus.txt")}
        results, curves = {}, {}
        for family in args.family or FAMILIES:
            for changes in sizes:
                name = family + "".join(f" {k}={v}" for k, v in changes.items())
                spec = family_spec(family, data, steps=max(args.warmup + args.steps, 10), **changes)
                if args.exact:
                    spec, name = dataclasses.replace(spec, resolution="exact"), name + " exact"
                results[name] = timing(spec, args.steps, args.auditor, args.warmup)
            if not args.no_figure:
                curves[family] = divergence(family_spec(f"scale/{family}", data, steps=args.fig_steps),
                                            args.fig_steps)
    if curves:
        plot(curves, args.png)
    print("| model | plain32 ms | plain64 ms | trainer ms | auditor ms | trainer/plain64 | auditor/plain64 | "
          "trainer/plain32 | auditor/plain32 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for f, r in results.items():
        ms = r["ms"]
        print(f"| {f} | {ms['plain32']:.1f} | {ms['plain64']:.1f} | {ms['trainer']:.1f} | {ms['auditor']:.1f} | "
              f"{r['trainer/plain64']:.2f}x | {r['auditor/plain64']:.2f}x | {r['trainer/plain32']:.2f}x | "
              f"{r['auditor/plain32']:.2f}x |")
    print()
    print("| model | rounded values/step | logged/step (value entries) | corrections/step | bound sparse B | "
          "dense B | dense+zip B |")
    print("|---|---|---|---|---|---|---|")
    for f, r in results.items():
        print(f"| {f} | {r['rounded']:.0f} | {r['logged']:.1f} ({r['value_entries']:.1f}) | {r['corrections']:.2f} | "
              f"{r['log_bytes']:.0f} | {r['dense_bytes']:.0f} | {r['dense_zip_bytes']:.0f} |")
    print()
    for f, series in curves.items():
        print(f + ": " + "; ".join(f"{k}: step 1 {v[0]:.3g}, step {len(v)} {v[-1]:.3g}" for k, v in series.items()))
    if args.json:
        args.json.write_text(json.dumps({"results": results, "curves": curves}, indent=1))


if __name__ == "__main__":
    main()
