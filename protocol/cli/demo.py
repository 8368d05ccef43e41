"""`vtrain demo`: the three stories of the protocol on a real chain with real training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from protocol.cli.chain import chain_errors


@click.command()
@click.option("--rpc", envvar="VTRAIN_RPC_URL", show_envvar=True, default=None, metavar="URL",
              help="Run on this local node (anvil: `vtrain node`) instead of an embedded eth-tester chain. The node "
                   "must have funded unlocked accounts and allow moving its clock (evm_setNextBlockTimestamp).")
@click.option("--spec", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Spec to train [default: examples/logreg.toml].")
@click.option("--steps", type=click.IntRange(2), default=24, show_default=True, help="Training steps of every run.")
@click.option("--fault-step", type=click.IntRange(1), default=None, help="The cheater's faulty step [default: 2/3].")
@click.option("--liar-step", type=click.IntRange(1), default=None,
              help="Where the lying auditor's leaves go wrong [default: 1/3].")
@click.option("--fault", "fault_kind", type=click.Choice(["poison-batch", "skip-step", "perturb-weights"]),
              default="poison-batch", show_default=True, help="The kind of fault of the cheater and the liar.")
@click.option("--auditor-device", default=None, help="Device the auditor replays on [default: the first emu: profile].")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path), default=Path("demo-runs"),
              show_default=True, help="Where runs, audits and agent state files go.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead of the story.")
@chain_errors
def demo(rpc: str | None, spec: Path | None, steps: int, fault_step: int | None, liar_step: int | None,
         fault_kind: str, auditor_device: str | None, workdir: Path, as_json: bool) -> None:
    """Run the whole story on an embedded chain and narrate it.

    A client posts jobs. An honest trainer trains, commits, is audited on another device, and is
    paid. A cheating trainer (a run with a fault at one step) is challenged; trainer and auditor
    bisect on-chain to exactly the faulty step; the referee replays it and the auditor wins the
    bond. A lying auditor challenges an honest trainer and loses its bond. Every role is its own
    key and agent; the chain's clock is moved on when everyone waits. With --json, prints a
    summary with gas and times per story and the fault step next to the isolated step.

    \b
    Examples:
      vtrain demo
      vtrain demo --json > demo.json
      vtrain node &  vtrain demo --rpc http://127.0.0.1:PORT
    """
    from protocol.demo import DEFAULT_SPEC, DemoOptions, run_demo

    if fault_step is not None and fault_step > steps or liar_step is not None and liar_step > steps:
        raise click.BadParameter(f"fault steps must lie in 1..{steps}")
    options = DemoOptions(spec=spec or DEFAULT_SPEC, steps=steps, fault_step=fault_step, liar_step=liar_step,
                          fault_kind=fault_kind, auditor_device=auditor_device, rpc=rpc, workdir=workdir)
    narrate = (lambda _: None) if as_json else click.echo
    summary = run_demo(options, narrate=narrate)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    _print_table(summary)


def _print_table(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="demo summary")
    for col in ("story", "outcome", "txs", "gas", "train s", "audit s", "on-chain s", "replay s"):
        table.add_column(col, no_wrap=True)
    for s in summary["stories"]:
        sec = s["seconds"]
        table.add_row(s["name"], s["outcome"], str(len(s["txs"])), f"{s['gas']:,}", f"{sec['training']:.2f}",
                      f"{sec['auditing']:.2f}", f"{sec['onchain']:.2f}", f"{sec['replay']:.2f}")
    console = Console(width=max(Console().width, 110))  # one line per story even when piped
    console.print(table)
    # with a checkpoint interval k > 1 a game isolates a leaf, the interval holding the fault step
    unit = "step" if summary["checkpoint_interval"] == 1 else f"leaf (k = {summary['checkpoint_interval']})"
    console.print(f"fault at step {summary['fault_step']}, game isolated {unit} {summary['isolated_step']}; "
                  f"liar wrong from step {summary['liar_step']}, isolated {summary['liar_isolated_step']}; "
                  f"total {summary['seconds']:.1f} s")
