"""Wall time and gas of each demo story on anvil, and the referee's replay of one step vs a training step.

    .venv/bin/python benchmarks/bench_demo.py [--reps 3] [--steps 24] [--spec examples/logreg.toml ...]

For each spec, the three stories of `vtrain demo` run `--reps` times on a fresh anvil (a real
node over HTTP, transactions signed locally); reported are medians of the story's wall time split
into training, auditing, on-chain moves (everything between posting the job and the last
withdrawal, referee replay excluded) and the referee's replay, with the gas of all its
transactions. The ratio is the referee's `replay_step` of one step (building the model, loading
and checking the state before it, replaying with the trainer's log) over one training step of
the same run (median over the run's steps). Prints a Markdown section for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def replay_ratio(run_dir: Path, steps: list[int]) -> dict[str, float]:
    """Medians over `steps`: the referee's whole replay_step, its set-up part (model, data, state
    load), and one training step of the run (from its metrics)."""
    from vtrain.audit import replay_step_detail
    from vtrain.run import Run
    from vtrain.train import TrainingSession

    run = Run.open(run_dir)
    train_s = statistics.median(m["seconds"] for m in run.metrics())
    whole, setup = [], []
    for t in steps:
        t0 = time.perf_counter()
        assert replay_step_detail(run, t).equal
        whole.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        TrainingSession(run.spec, "cpu").load_state(run.read_state(t - 1), str(run.state_path(t - 1)))
        setup.append(time.perf_counter() - t0)
    replay_s, setup_s = statistics.median(whole), statistics.median(setup)
    return {"replay": replay_s, "setup": setup_s, "train": train_s, "ratio": replay_s / train_s,
            "step_ratio": (replay_s - setup_s) / train_s}


def bench_spec(spec: Path, steps: int, reps: int) -> tuple[list[str], str]:
    from protocol.anvil import start_anvil
    from protocol.demo import DemoOptions, run_demo

    per_story: dict[str, list[dict]] = {}
    ratio_line = ""
    for rep in range(reps):
        with start_anvil() as node, tempfile.TemporaryDirectory() as tmp:
            summary = run_demo(DemoOptions(spec=spec, steps=steps, rpc=node.url, workdir=Path(tmp)))
            for s in summary["stories"]:
                per_story.setdefault(s["name"], []).append(s)
            if rep == 0:
                r = replay_ratio(Path(tmp) / "runs" / "honest", list(range(1, steps + 1, max(1, steps // 6))))
                ratio_line = (f"{spec.name}: referee `replay_step` of one step {r['replay'] * 1e3:.1f} ms vs one "
                              f"training step {r['train'] * 1e3:.1f} ms = **{r['ratio']:.1f}×**; of it, building "
                              f"the model and data and loading the checked state take {r['setup'] * 1e3:.1f} ms, "
                              f"the step itself {(r['replay'] - r['setup']) * 1e3:.1f} ms = "
                              f"{r['step_ratio']:.1f}× a training step")
    rows = []
    for name, runs in per_story.items():
        med = {k: statistics.median(r["seconds"][k] for r in runs) for k in runs[0]["seconds"]}
        gas = statistics.median(r["gas"] for r in runs)
        rows.append(f"| {spec.name} | {name} | {runs[0]['outcome']} | {len(runs[0]['txs'])} | {gas:,.0f} | "
                    f"{med['training']:.2f} | {med['auditing']:.2f} | {med['onchain']:.2f} | {med['replay']:.3f} | "
                    f"{med['total']:.2f} |")
    return rows, ratio_line


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", type=Path, action="append", default=None)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    specs = args.spec or [REPO / "examples" / "logreg.toml", REPO / "examples" / "mlp.toml"]
    print(f"Command: `.venv/bin/python benchmarks/bench_demo.py --steps {args.steps} --reps {args.reps}"
          + "".join(f" --spec {s.relative_to(REPO) if s.is_absolute() else s}" for s in specs) + "`\n")
    print("| spec | story | outcome | txs | gas | training s | auditing s | on-chain s | replay s | total s |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    ratios = []
    for spec in specs:
        rows, ratio = bench_spec(spec.resolve(), args.steps, args.reps)
        print("\n".join(rows))
        ratios.append(ratio)
    print()
    for r in ratios:
        print(f"- {r}")


if __name__ == "__main__":
    main()
