"""`vtrain compile` and `vtrain node` (the toolchain commands), and anvil process handling."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from protocol.anvil import ANVIL_BINARY, AnvilError, rpc, start_anvil
from protocol.cli.toolchain import compile_cmd


def test_compile_lists_the_artifacts_written(artifacts):
    result = CliRunner().invoke(compile_cmd, [])
    assert result.exit_code == 0, result.output
    assert re.search(r"^VerificationGame\s+\d+ bytes  out/VerificationGame.sol/VerificationGame.json$", result.output, re.M)


@pytest.mark.anvil
def test_node_runs_until_sigterm_and_stops_its_anvil():
    proc = subprocess.Popen(
        [sys.executable, "-c", "from protocol.cli import main; main()", "node"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stdout.readline()
        m = re.match(r"anvil running: (http://127\.0\.0\.1:\d+) \(chain id 31337, pid (\d+)\)", line)
        assert m, line + proc.stderr.read()
        url, pid = m.group(1), int(m.group(2))
        assert rpc(url, "eth_chainId") == "0x7a69"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert "anvil stopped" in proc.stdout.read()
        assert not os.path.exists(f"/proc/{pid}") or "zombie" in open(f"/proc/{pid}/status").read().lower()
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.anvil
def test_node_on_a_taken_port_exits_3_with_a_clear_message():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-c", "from protocol.cli import main; main()", "node", "--port", str(port)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 3
    assert f"port {port} on 127.0.0.1 is already in use" in proc.stderr


def test_missing_anvil_binary_is_a_clear_error(tmp_path):
    with pytest.raises(AnvilError, match="anvil is missing at .*scripts/setup.sh"):
        start_anvil(binary=tmp_path / "anvil")


@pytest.mark.anvil
def test_anvil_stops_by_pid():
    node = start_anvil()
    pid = node.pid
    assert ANVIL_BINARY.name in open(f"/proc/{pid}/cmdline").read()
    node.stop()
    assert node.process.returncode is not None
    time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}")
