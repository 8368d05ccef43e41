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

# command name -> (module, attribute). A module that is not present yet is simply not listed.
COMMANDS: dict[str, tuple[str, str]] = {
    # training side (vtrain/): produce and check runs
    "devices": ("protocol.cli.engine", "devices"),
    "train": ("protocol.cli.engine", "train"),
    "audit": ("protocol.cli.engine", "audit"),
    "replay-step": ("protocol.cli.engine", "replay_step"),
    "inspect": ("protocol.cli.engine", "inspect"),
    # toolchain
    "compile": ("protocol.cli.toolchain", "compile_cmd"),
    "node": ("protocol.cli.toolchain", "node"),
    # chain side (protocol/): commit and dispute runs
    "deploy": ("protocol.cli.chain", "deploy"),
    "job": ("protocol.cli.chain", "job"),
    "commit": ("protocol.cli.chain", "commit"),
    "challenge": ("protocol.cli.chain", "challenge"),
    "resolve": ("protocol.cli.chain", "resolve"),
    "status": ("protocol.cli.chain", "status"),
    "withdraw": ("protocol.cli.chain", "withdraw"),
    "watch": ("protocol.cli.chain", "watch"),
    "demo": ("protocol.cli.demo", "demo"),
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name, (mod, _) in COMMANDS.items() if importlib.util.find_spec(mod) is not None]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        mod, attr = COMMANDS[name]
        if importlib.util.find_spec(mod) is None:
            return None
        return getattr(importlib.import_module(mod), attr)


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
    """
