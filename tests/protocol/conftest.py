"""Fixtures for the protocol tests: real runs (trained once per session), chains, an anvil, a file server.

Runs are real torch training of a small logistic regression (a few steps, a fraction of a second
each); chains are real: the embedded eth-tester chain, or an anvil process started on a free
loopback port and stopped by its PID.
"""

from __future__ import annotations

import dataclasses
import functools
import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from eth_account import Account

REPO = Path(__file__).resolve().parents[2]
ANVIL = REPO / "node_modules" / "@foundry-rs" / "anvil-linux-amd64" / "bin" / "anvil"
CAST = REPO / "node_modules" / "@foundry-rs" / "cast-linux-amd64" / "bin" / "cast"
VTRAIN = [str(Path(sys.executable).parent / "vtrain")]
STEPS = 8
FAULT_STEP = 6
LIAR_STEP = 3
ETHER = 10**18
CLOCK_RESERVE_S = 600  # chess-clock seconds per side where real time passes (anvil tests)


@dataclass(frozen=True)
class Runs:
    spec: object
    honest: Path  # the trainer's run
    cheater: Path  # the same spec with FAULT_STEP:poison-batch
    liar: Path  # with LIAR_STEP:poison-batch (a lying auditor's leaves)
    audit_honest: Path  # an auditor's replay of `honest` on an emulated device
    audit_cheater: Path  # and of `cheater`
    auditor_device: str


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    import torch

    from vtrain.audit import audit
    from vtrain.devices import list_devices
    from vtrain.faults import parse_fault
    from vtrain.run import Run
    from vtrain.spec import load_spec, to_toml
    from vtrain.train import train

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("runs")
    spec = dataclasses.replace(load_spec(REPO / "examples" / "logreg.toml"), steps=STEPS)
    dirs = {}
    for name, fault in (("honest", None), ("cheater", f"{FAULT_STEP}:poison-batch"), ("liar", f"{LIAR_STEP}:poison-batch")):
        dirs[name] = root / name
        train(spec, dirs[name], spec_toml=to_toml(spec), faults=[parse_fault(fault)] if fault else [])
    device = next(d.name for d in list_devices() if d.name.startswith("emu:"))
    for name in ("honest", "cheater"):
        audit(Run.open(dirs[name]), device, out=root / f"audit-{name}")
    return Runs(spec, dirs["honest"], dirs["cheater"], dirs["liar"], root / "audit-honest", root / "audit-cheater", device)


@pytest.fixture(scope="session")
def artifact():
    from protocol.compile import compile_contracts

    return compile_contracts()["VerificationGame"]


@dataclass
class Chain:
    """A chain with the contract deployed and one funded local key per role."""

    w3: object
    binding: object
    keys: dict  # role name -> LocalAccount
    rpc: str | None


ROLES = ("client", "trainer", "cheater", "auditor", "liar", "referee", "anyone")


def make_chain(w3, rpc: str | None) -> Chain:
    from protocol.chain import deploy
    from protocol.roles.network import fund

    keys = {name: Account.create() for name in ROLES}
    fund(w3, [k.address for k in keys.values()], 100 * ETHER)
    return Chain(w3, deploy(w3, keys["client"]), keys, rpc)


@pytest.fixture
def tester_chain(artifact) -> Chain:
    from protocol.chain import tester_web3

    return make_chain(tester_web3(), None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Anvil:
    url: str
    port: int
    proc: subprocess.Popen


def start_anvil() -> Anvil:
    if not ANVIL.exists():
        pytest.skip(f"anvil binary missing at {ANVIL}: run scripts/setup.sh")
    port = free_port()
    proc = subprocess.Popen([str(ANVIL), "--port", str(port), "--host", "127.0.0.1", "--silent"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    from web3 import Web3

    w3 = Web3(Web3.HTTPProvider(url))
    for _ in range(100):
        try:
            w3.eth.chain_id
            return Anvil(url, port, proc)
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.05)
    proc.terminate()
    raise RuntimeError("anvil did not answer within 5 s")


def stop_anvil(a: Anvil) -> None:
    a.proc.terminate()
    try:
        a.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        a.proc.kill()


@pytest.fixture
def anvil():
    a = start_anvil()
    yield a
    stop_anvil(a)


@pytest.fixture
def anvil_chain(anvil, artifact) -> Chain:
    from protocol.roles.network import connect

    return make_chain(connect(anvil.url), anvil.url)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # noqa: ANN002
        pass


@pytest.fixture
def serve():
    """serve(directory) -> base URL of a static HTTP server of a copy of it (tests may tamper the copy)."""
    servers = []

    def start(directory: Path, tmp: Path) -> tuple[str, Path]:
        copy = tmp / ("served-" + directory.name)
        shutil.copytree(directory, copy)
        handler = functools.partial(_QuietHandler, directory=str(copy))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}/", copy

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def vtrain_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VTRAIN_")}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env
