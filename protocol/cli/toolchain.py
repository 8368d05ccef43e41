"""Toolchain commands: `compile` (the Solidity contracts) and `node` (a local anvil chain).

Exit codes: 0 success; 3 the compiler or anvil failed or is missing; 130 interrupted.
"""

from __future__ import annotations

import signal
import sys
import threading

import click


def _fail(message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@click.command("compile")
@click.option("--force", is_flag=True, help="Recompile even if the sources and settings did not change.")
def compile_cmd(force: bool) -> None:
    """Compile the Solidity contracts in contracts/ into out/ (Foundry layout).

    Uses the pinned npm solc and the settings of contracts/compiler.json; results are cached by
    the hash of sources and settings, so an unchanged tree compiles instantly.

    \b
    Examples:
      vtrain compile            # compile what changed
      vtrain compile --force    # compile everything again
    """
    from protocol.compile import OUT_DIR, REPO_ROOT, compile_contracts
    from vtrain.errors import ToolchainError

    try:
        artifacts = compile_contracts(force=force)
    except ToolchainError as e:
        _fail(str(e), 3)
    for art in sorted(artifacts.values(), key=lambda a: (a.source, a.name)):
        path = (OUT_DIR / art.source.rsplit("/", 1)[-1] / f"{art.name}.json").relative_to(REPO_ROOT)
        size = (len(art.deployed_bytecode) - 2) // 2
        click.echo(f"{art.name:<24} {size:>6} bytes  {path}")


@click.command("node")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Port on 127.0.0.1 (default: a free one).")
@click.option("--chain-id", type=int, default=31337, show_default=True, help="Chain id the node reports.")
def node(port: int | None, chain_id: int) -> None:
    """Run a local anvil chain on 127.0.0.1 until Ctrl-C or SIGTERM.

    Prints the RPC URL and chain id; point other commands at it with --rpc-url. The node's
    dev accounts are funded and unlocked (never use them outside this machine).

    \b
    Examples:
      vtrain node                  # a free port
      vtrain node --port 8545      # a fixed port (error if taken)
    """
    from protocol.anvil import AnvilError, start_anvil

    try:
        anvil = start_anvil(port=port, chain_id=chain_id)
    except AnvilError as e:
        _fail(str(e), 3)
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    click.echo(f"anvil running: {anvil.url} (chain id {anvil.chain_id}, pid {anvil.pid}); Ctrl-C to stop")
    try:
        while not stop.is_set() and anvil.process.poll() is None:
            stop.wait(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        crashed = anvil.process.poll() is not None
        anvil.stop()
        signal.signal(signal.SIGTERM, previous)
    if crashed:
        _fail(f"anvil exited by itself with status {anvil.process.returncode}", 3)
    click.echo("anvil stopped")
