"""Fixtures for the protocol tests: real runs (trained once per session), chains, an anvil, a file server.

Runs are real torch training of a small logistic regression (a few steps, a fraction of a second
each); chains are real: the embedded eth-tester chain, or an anvil process started on a free
loopback port and stopped by its PID. Shared helpers live in protokit.py.
"""

from __future__ import annotations

import functools
import http.server
import shutil
import threading
from pathlib import Path

import pytest
from protokit import Chain, Runs, make_chain, train_runs


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> Runs:
    return train_runs(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="session")
def artifact():
    from protocol.compile import compile_contracts

    return compile_contracts()["VerificationGame"]


@pytest.fixture
def tester_chain(artifact) -> Chain:
    from protocol.chain import tester_web3

    return make_chain(tester_web3(), None)


@pytest.fixture
def anvil():
    """A fresh anvil on a free loopback port (protocol.anvil), stopped by its PID afterwards."""
    # No skip when the binary is missing: start_anvil raises AnvilError saying to run setup, so a
    # broken install fails the suite instead of silently dropping the anvil half of it.
    from protocol.anvil import start_anvil

    node = start_anvil()
    yield node
    node.stop()


@pytest.fixture
def anvil_chain(anvil, artifact) -> Chain:
    from protocol.roles.network import connect

    return make_chain(connect(anvil.url), anvil.url)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # noqa: ANN002
        pass


@pytest.fixture
def serve():
    """serve(directory, tmp) -> (base URL, served copy): a static HTTP server of a copy (tests may tamper it)."""
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
