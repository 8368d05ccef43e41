"""Training-side commands: devices, train, audit, replay-step, inspect.

This module only turns options into calls of vtrain and maps its errors to exit codes
(0 success, 1 a verification outcome that is not a match, 2 bad input, 130 interrupted).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, Callable

import click

DEVICE_OPTION = click.option(
    "--device", "-d", default="cpu", show_default=True, envvar="VTRAIN_DEVICE", show_envvar=True,
    help="Device that executes the device-dependent ops: cpu, cuda, or an emulated profile emu:NAME "
         "(see `vtrain devices`).")
WORKERS_OPTION = click.option(
    "--workers", "-w", type=click.IntRange(1, 1024), default=1, show_default=True,
    help="Processes sharing each step's micro-batch shards (data parallel over gloo); must divide the "
         "spec's shards. The result does not depend on it: a run trained by N processes audits "
         "bit-exactly with any other divisor.")
THREADS_OPTION = click.option(
    "--threads", type=click.IntRange(1, 256), default=None, envvar="VTRAIN_THREADS", show_envvar=True,
    help="torch CPU threads (default: torch's choice). Results do not depend on it; that is the point.")


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def cli_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Map deliberate vtrain errors to one line on stderr and exit 2, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from vtrain.errors import VtrainError
        try:
            return fn(*args, **kwargs)
        except VtrainError as exc:
            _fail(str(exc), 2)
        except OSError as exc:   # unreadable input, unwritable --out, disk full: say which file
            _fail(f"{exc.filename or ''}: {exc.strerror or exc}", 2)
        except KeyboardInterrupt:
            _fail("interrupted; `vtrain train` resumes from the last complete step", 130)

    return wrapper


def _prepare(device: str, threads: int | None) -> None:
    """Check the device name before any work or output, and set the thread count."""
    from vtrain.devices import get_device
    get_device(device)
    if threads is not None:
        import torch
        torch.set_num_threads(threads)


class _Progress:
    """A rich progress bar on stderr, one tick per step, with the step's loss and log size."""

    def __init__(self, total: int, label: str) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
        self._bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                             TextColumn("{task.fields[info]}"), console=Console(stderr=True), transient=False)
        self._task = self._bar.add_task(label, total=total, info="")

    def __enter__(self) -> "_Progress":
        self._bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bar.__exit__(*exc)

    def __call__(self, t: int, result: Any) -> None:
        info = f"loss={result.loss:.4f} log={len(result.log_bytes)}B"
        if "corrections" in result.stats:
            info += f" corrections={result.stats['corrections']}"
        self._bar.update(self._task, completed=t, info=info)


@click.command()
def devices() -> None:
    """List the devices a run can be trained or audited on.

    \b
    Examples:
      vtrain devices
      vtrain audit run/ --device emu:splitk8-tree
    """
    from vtrain.devices import list_devices
    for d in list_devices():
        click.echo(f"{d.name:24s} {d.description}")


@click.command()
@click.argument("spec", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", "-o", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Run directory to write (an interrupted run in it is resumed).")
@DEVICE_OPTION
@click.option("--steps", type=click.IntRange(1), default=None,
              help="Stop after this step (default: the spec's steps); rerun without it to continue.")
@click.option("--fault", "faults", multiple=True, metavar="STEP:KIND",
              help="Make a dishonest run for protocol tests; KIND is poison-batch, skip-step or "
                   "perturb-weights. Repeatable.")
@WORKERS_OPTION
@THREADS_OPTION
@cli_errors
def train(spec: Path, out: Path, device: str, steps: int | None, faults: tuple[str, ...], workers: int,
          threads: int | None) -> None:
    """Train a spec on the FP32 grid, log ambiguous roundings, and commit to every step.

    Writes the run directory (spec, a rounding log per step, a state and a leaf per step or,
    with the spec's checkpoint_interval k > 1, after every k-th and the last step, metrics) and
    ends with the commitment `root=0x… size=N` (also in OUT/commitment.json).

    \b
    Examples:
      vtrain train examples/mlp.toml --out runs/mlp
      vtrain train examples/cnn.toml --out runs/cnn --device emu:splitk8-tree --threads 2
      vtrain train examples/mlp.toml --out runs/bad --fault 40:poison-batch
      vtrain train gpt2-dp.toml --out runs/gpt2 --workers 4     (a spec with shards = 4 or 8, ...)
    """
    from vtrain.faults import parse_fault
    from vtrain.spec import load_spec
    from vtrain.train import train as run_training
    parsed = [parse_fault(f) for f in faults]
    s = load_spec(spec)
    _prepare(device, threads)
    total = s.steps if steps is None else min(steps, s.steps)
    toml = spec.read_text(encoding="utf-8")
    if workers > 1:   # the steps run in other processes: no progress bar
        result = run_training(s, out, spec_toml=toml, device=device, steps=steps, faults=parsed, workers=workers,
                              threads=threads or 1)
    else:
        with _Progress(total, "train") as bar:
            result = run_training(s, out, spec_toml=toml, device=device, steps=steps, faults=parsed, progress=bar)
    if result.resumed_from >= 0:
        click.echo(f"resumed after step {result.resumed_from}", err=True)
    click.echo(f"root={result.root} size={result.size}")


@click.command()
@click.argument("run", type=click.Path(file_okay=False, path_type=Path))
@DEVICE_OPTION
@click.option("--out", "-o", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory for the auditor's own leaves.bin, commitment.json and report.json.")
@click.option("--ignore-log", is_flag=True,
              help="Round without applying the trainer's log (the ablation: shows the log is needed); "
                   "for a resolution 'exact' run, round without the exact resolution.")
@WORKERS_OPTION
@THREADS_OPTION
@cli_errors
def audit(run: Path, device: str, out: Path | None, ignore_log: bool, workers: int, threads: int | None) -> None:
    """Replay a trainer's run from its spec and compare every leaf.

    Ends with `MATCH root=0x…` (exit 0) or `DIVERGED step=K …` (exit 1) at the first differing
    leaf (`DIVERGED leaf=I steps=A..B …` for a checkpoint interval k > 1); after a divergence the
    audit continues honestly to give its own root of the same size.

    \b
    Examples:
      vtrain audit runs/mlp --device emu:splitk8-tree --out runs/mlp-audit
      vtrain audit runs/mlp --ignore-log
      vtrain audit runs/gpt2 --workers 2 --device emu:lanes8-butterfly
    """
    from vtrain.audit import audit as run_audit
    from vtrain.run import Run
    r = Run.open(run)
    _prepare(device, threads)
    if workers > 1:
        report = run_audit(r, device, out=out, ignore_log=ignore_log, workers=workers, threads=threads or 1)
    else:
        with _Progress(r.steps, "audit") as bar:
            report = run_audit(r, device, out=out, ignore_log=ignore_log, progress=bar)
    corr = report.corrections
    nonzero = [f"{t}:{c}" for t, c in enumerate(corr, start=1) if c]
    click.echo(f"corrections: total={sum(corr)} max={max(corr, default=0)} steps_with_corrections={len(nonzero)}")
    if nonzero:
        click.echo("corrections per step: " + " ".join(nonzero[:50]) + (" …" if len(nonzero) > 50 else ""))
    n = max(1, len(report.log_bytes))
    click.echo(f"log: entries/step={sum(report.logged) / n:.1f} bytes/step={sum(report.log_bytes) / n:.0f} "
               f"total_bytes={sum(report.log_bytes)}")
    if not r.has_logs:
        click.echo(f"exact: ambiguous/step={sum(report.ambiguous) / n:.1f} refined/step={sum(report.refined) / n:.1f} "
                   f"recomputed/step={sum(report.recomputed) / n:.1f} total_recomputed={sum(report.recomputed)}")
    if report.matched:
        click.echo(f"MATCH root={report.root} size={report.size}")
        return
    d = report.divergence
    if d is None:  # all leaves equal but the roots differ: cannot happen unless the run is inconsistent
        click.echo(f"DIVERGED step=? root={report.root} trainer_root={report.trainer_root}")
    else:
        click.echo(f"{d} root={report.root} trainer_root={report.trainer_root}")
    sys.exit(1)


@click.command(name="replay-step")
@click.argument("run", type=click.Path(file_okay=False, path_type=Path))
@click.argument("step", type=click.IntRange(1))
@DEVICE_OPTION
@THREADS_OPTION
@cli_errors
def replay_step(run: Path, step: int, device: str, threads: int | None) -> None:
    """Recompute one leaf from the trainer's state before it and its logs (the referee's tool).

    STEP is a leaf index: the step itself when the spec's checkpoint_interval is 1; with an
    interval k > 1, leaf STEP covers steps (STEP-1)k+1 .. STEPk, which are all replayed (this is
    the "step" an on-chain dispute isolates). Prints `leaf=0x…` and whether it equals the trainer's
    leaf STEP (exit 0 equal, 1 different). The state before is checked against leaf STEP-1 first.

    \b
    Examples:
      vtrain replay-step runs/mlp 41 --device emu:lanes8-butterfly
    """
    from vtrain.audit import replay_step_detail
    from vtrain.run import Run
    _prepare(device, threads)
    r = replay_step_detail(Run.open(run), step, device)
    click.echo(f"leaf=0x{r.leaf.hex()}")
    if r.note:
        click.echo(r.note)
    covers = f" (steps {r.steps[0]}..{r.steps[-1]})" if len(r.steps) > 1 else ""
    if r.equal:
        click.echo(f"equal to the trainer's leaf {step}{covers}")
        return
    click.echo(f"DIFFERENT from the trainer's leaf {step}{covers} (0x{r.trainer_leaf.hex()})")
    sys.exit(1)


@click.command()
@click.argument("run", type=click.Path(file_okay=False, path_type=Path))
@click.option("--verify", is_flag=True, help="Also check every state and log file against its leaf.")
@cli_errors
def inspect(run: Path, verify: bool) -> None:
    """Show a run: its spec, steps, commitment, log sizes and training statistics.

    \b
    Examples:
      vtrain inspect runs/mlp
      vtrain inspect runs/mlp --verify
    """
    from vtrain.run import Run
    r = Run.open(run)
    click.echo(f"run:        {r.path}")
    click.echo(f"spec_hash:  0x{r.spec_hash.hex()}")
    click.echo("spec:       " + " ".join(f"{k}={v}" for k, v in sorted(vars(r.spec).items())))
    click.echo(f"steps:      {r.steps} of {r.spec.steps}")
    k = r.spec.checkpoint_interval
    click.echo(f"interval:   {'a leaf every step' if k == 1 else f'a leaf every {k} steps and after the last'}"
               f" ({r.size} of {r.intervals.size} leaves written)")
    click.echo(f"root:       0x{r.root.hex()}  size={r.size}")
    sizes = [r.log_path(t).stat().st_size for t in range(1, r.steps + 1) if r.log_path(t).exists()]
    if sizes:
        click.echo(f"log bytes:  total={sum(sizes)} mean/step={sum(sizes) / len(sizes):.0f} max={max(sizes)}")
    m = r.metrics()
    if m:
        def total(key: str) -> int:
            return sum(int(x.get(key, 0)) for x in m)
        losses = [x["loss"] for x in m if x.get("loss") is not None]
        if losses:
            click.echo(f"loss:       first={losses[0]:.4f} last={losses[-1]:.4f}")
        # (certified: values within the band proved exact, which need no entry; exact_sums: values of whole ops
        # proved exact before any band, vtrain.grains)
        certified = f" certified={total('certified')}" if r.has_logs else ""
        certified += f" exact_sums={total('exact_sums')}"
        click.echo(f"rounding:   rounded={total('rounded')} logged={total('logged')} "
                   f"value_entries={total('logged_values')}{certified} "
                   f"seconds/step={sum(x['seconds'] for x in m) / len(m):.4f}")
        if not r.has_logs:
            click.echo(f"exact:      checked={total('checked')} ambiguous={total('ambiguous')} "
                       f"certified={total('certified')} refined={total('refined')} recomputed={total('recomputed')} "
                       f"seconds/step={sum(x.get('exact_seconds', 0) for x in m) / len(m):.4f}")
    if verify:
        for t in range(r.size):
            r.verify_files(t)
        logs = f" and {r.steps} logs" if r.has_logs else ""
        click.echo(f"verified:   {r.size} states{logs} match their leaves")
