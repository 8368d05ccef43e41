"""The `vtrain` command line: the only code that imports click.

Commands live in sibling modules and are imported only when invoked (or when `--help` needs
their one-line summary), so `vtrain --help` answers at once without loading torch or web3.
Each module exposes click commands; the table below says which module holds which command.

Exit codes (all commands): 0 success; 1 a verification outcome that is not a match (for example
`audit` reporting DIVERGED); 2 bad input or usage (no traceback); 3 a failure of an external
system (chain, RPC, compiler); 130 interrupted.
"""

from __future__ import annotations

import importlib
import importlib.util

import click

# command name -> (module, attribute, one-line summary). The summary is kept here so that listing the
# commands imports none of them (the engine commands pull in torch, the chain commands web3).
# A module that is not present yet is simply not listed.
COMMANDS: dict[str, tuple[str, str, str]] = {
    # training side (vtrain/): produce and check runs
    "devices": ("protocol.cli.engine", "devices", "List the devices a run can be trained or audited on."),
    "train": ("protocol.cli.engine", "train", "Train a spec, writing a run directory and its Merkle root."),
    "audit": ("protocol.cli.engine", "audit", "Replay a run on a device and compare every step's leaf."),
    "replay-step": ("protocol.cli.engine", "replay_step", "Recompute one step of a run (the referee's tool)."),
    "inspect": ("protocol.cli.engine", "inspect", "Show a run's spec, root, steps and log statistics."),
    # toolchain
    "compile": ("protocol.cli.toolchain", "compile_cmd", "Compile the contracts into out/ (Foundry layout)."),
    "node": ("protocol.cli.toolchain", "node", "Start a local anvil chain and print its URL."),
    # chain side (protocol/): commit and dispute runs
    "deploy": ("protocol.cli.chain", "deploy", "Deploy the verification-game contract."),
    "job": ("protocol.cli.chain", "job", "Create and finalize training jobs."),
    "commit": ("protocol.cli.chain", "commit", "Commit a run's Merkle root to a job with the trainer bond."),
    "challenge": ("protocol.cli.chain", "challenge", "Challenge a commitment with an audit's root."),
    "resolve": ("protocol.cli.chain", "resolve", "Referee: replay an isolated step and resolve the game."),
    "status": ("protocol.cli.chain", "status", "Show a job, its commitment and its games."),
    "withdraw": ("protocol.cli.chain", "withdraw", "Withdraw what the contract owes an account."),
    "watch": ("protocol.cli.chain", "watch", "Run a role's agent: answer games as events arrive."),
    "demo": ("protocol.cli.demo", "demo", "Run the whole story on an embedded chain and narrate it."),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (mod, _, _) in COMMANDS.items() if importlib.util.find_spec(mod) is not None]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        mod, attr, _ = COMMANDS[name]
        if importlib.util.find_spec(mod) is None:
            return None
        return getattr(importlib.import_module(mod), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="vtrain")
def main() -> None:
    """Verifiable ML training that a blockchain can enforce.

    A trainer trains in FP64 rounded onto the FP32 grid and logs the few ambiguous roundings; any
    auditor replays the run bit-exactly on its own hardware. Per-step checkpoint hashes form a
    Merkle tree whose root is committed on-chain with a bond; a differing auditor challenges, the
    two bisect on-chain to one step, and a referee replays that step.

    \b
    Examples:
      vtrain demo                                  # the whole story on an embedded chain
      vtrain train examples/mlp.toml --out run/    # train and commit locally
      vtrain audit run/ --device emu:splitk8       # replay on another "device"

    \b
    Environment:
      VTRAIN_KEEP_FREED_MEMORY=0   hand freed memory back to the kernel; by default a process that
                                   trains or audits keeps it for its next step's tensors (faster
                                   large steps, more resident memory: vtrain/heap.py)
    """
