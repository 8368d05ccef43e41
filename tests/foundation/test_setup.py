"""scripts/setup.sh: idempotent, and a missing prerequisite is a clear message before anything changes."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_setup() -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/setup.sh", "--no-demo"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)


def test_second_setup_run_is_fast_and_changes_nothing():
    # The first run brings the environment up to date (it may have work to do if a lock file changed
    # since the last set-up); the second must find nothing to do.
    assert run_setup().returncode == 0
    stamps = [REPO / ".venv/.vtrain-setup-stamp", REPO / "node_modules/.vtrain-setup-stamp"]
    before = [p.read_text() for p in stamps]
    t0 = time.monotonic()
    out = run_setup()
    assert out.returncode == 0, out.stderr
    assert "Python environment is up to date" in out.stdout
    assert "npm toolchain is up to date" in out.stdout
    assert time.monotonic() - t0 < 60
    assert [p.read_text() for p in stamps] == before


def test_missing_node_stops_setup_with_a_clear_message(tmp_path):
    # A PATH with the shell tools and Python but no node: setup must refuse before touching anything.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "sha256sum", "cut", "cat", "grep", "sed", "dirname", "printf"):
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    python = Path(os.path.realpath(sys.executable))
    env = {"PATH": str(bin_dir), "PYTHON": str(python), "HOME": str(tmp_path)}
    out = subprocess.run([str(bin_dir / "bash"), "scripts/setup.sh", "--no-demo"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "node not found: install Node.js 20" in out.stderr


def test_unknown_option_is_a_usage_error():
    out = subprocess.run(["bash", "scripts/setup.sh", "--bogus"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 2
    assert "unknown option --bogus" in out.stderr
