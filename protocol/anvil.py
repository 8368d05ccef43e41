"""Run a local anvil node: start it on a free loopback port, wait for its RPC, stop it by PID.

The binary from the npm package `@foundry-rs/anvil` is called directly (never through `npx`,
which leaves orphan processes behind), listens on 127.0.0.1 only, and logs to a file next to
nothing else the caller owns, so a full pipe can never stall it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from vtrain.errors import ToolchainError

REPO_ROOT = Path(__file__).resolve().parent.parent
ANVIL_BINARY = REPO_ROOT / "node_modules" / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil"
HOST = "127.0.0.1"
_LISTENING = re.compile(r"Listening on " + re.escape(HOST) + r":(\d+)")


class AnvilError(ToolchainError):
    """anvil is missing, could not start, or did not answer."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return True
        return False


@dataclass
class Anvil:
    """A running anvil process; use as a context manager or call `stop()`."""

    process: subprocess.Popen
    port: int
    chain_id: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM by PID and wait; SIGKILL (same PID) if it does not exit in `timeout` s."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout)
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> "Anvil":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def rpc(url: str, method: str, params: list | None = None, timeout: float = 2.0) -> object:
    """One JSON-RPC call with the standard library (no web3 needed to probe a node)."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params or []}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        reply = json.loads(response.read())
    if "error" in reply:
        raise AnvilError(f"{url} answered {method} with an error: {reply['error']}")
    return reply["result"]


def start_anvil(
    port: int | None = None, chain_id: int = 31337, timeout: float = 20.0, binary: Path = ANVIL_BINARY
) -> Anvil:
    """Start anvil on `port` (a free one if None) on 127.0.0.1 and wait until its RPC answers."""
    if not binary.is_file():
        raise AnvilError(f"anvil is missing at {binary}: run scripts/setup.sh (it runs npm ci for @foundry-rs/anvil)")
    if port is not None and port_in_use(port):
        raise AnvilError(f"port {port} on {HOST} is already in use: pick another port or omit it for a free one")
    fd, log_name = tempfile.mkstemp(prefix=f"anvil-{port or 'any'}-", suffix=".log")
    log_path = Path(log_name)
    # Without a port anvil binds port 0 (the kernel picks a free one) and names it in its log: picking a
    # free port first and passing it on would race with other processes doing the same (parallel tests).
    with os.fdopen(fd, "wb") as log:
        process = subprocess.Popen(
            [str(binary), "--host", HOST, "--port", str(port or 0), "--chain-id", str(chain_id)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    node = Anvil(process, port or 0, chain_id, log_path)
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            tail = log_path.read_text(errors="replace")[-2000:]
            log_path.unlink(missing_ok=True)
            raise AnvilError(f"anvil exited with status {process.returncode} before answering on port {port}:\n{tail}")
        if not node.port:
            found = _LISTENING.search(log_path.read_text(errors="replace"))
            node.port = int(found.group(1)) if found else 0
        try:
            answered = int(str(rpc(node.url, "eth_chainId")), 16) if node.port else None
        except (urllib.error.URLError, ConnectionError, OSError):
            answered = None
        if answered is not None:
            if answered != chain_id:
                node.stop()
                raise AnvilError(f"port {port} answered with chain id {answered}, not {chain_id}: another node holds it")
            return node
        if time.monotonic() > deadline:
            node.stop()
            raise AnvilError(f"anvil did not answer on {node.url} within {timeout} s")
        time.sleep(0.05)
