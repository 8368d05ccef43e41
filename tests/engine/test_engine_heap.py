"""A training process keeps freed memory for its next step's tensors (vtrain.heap).

Each case runs in a fresh interpreter: malloc's settings are per process, and a test worker's own may have been
set by any earlier test."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest
from enginekit import ROOT, cli
from vtrain.heap import OPT_OUT

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc's")

# A step's pattern, without the interpreter's and torch's small allocations in between (which settle in the freed
# space at times and then hold the heap's top by chance): three blocks written and freed, of 16 MB (by default
# from the heap, whose 48 MB free at the top go back to the kernel, beyond glibc's own trimming threshold of
# twice the largest mapping freed) or of 40 MB (by default a mapping each, above glibc's ceiling of 32 MB on its
# mapping threshold). Either way the next round faults all their pages in again. Counted over rounds 2-8.
_ROUNDS = """
import ctypes, json, resource, sys
setup, size = sys.argv[1], int(sys.argv[2]) << 20
if setup == "session":
    from vtrain.spec import load_spec
    from vtrain.train import TrainingSession
    TrainingSession(load_spec("examples/logreg.toml"))
elif setup == "heap":
    from vtrain.heap import keep_freed_memory
    assert keep_freed_memory()
libc = ctypes.CDLL(None)
libc.prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: a host's huge pages would fault 512 pages at once
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
faults = []
for _ in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(size) for _ in range(3)]
    for b in blocks:
        ctypes.memset(b, 1, size)
    for b in blocks:
        libc.free(b)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(sum(faults[1:])))
"""


def _faults(setup: str, mb: int, env: dict | None = None) -> int:
    # (without the parent's malloc tunables, which would decide what the rounds measure)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES", OPT_OUT))}
    r = subprocess.run([sys.executable, "-c", _ROUNDS, setup, str(mb)], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**clean, **(env or {})})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _pages(mb: int) -> int:
    """The rounds' pages: 7 rounds of three blocks."""
    return 7 * 3 * (mb << 20) // 4096


@pytest.mark.parametrize("mb", [16, 40])
@pytest.mark.parametrize(("setup", "env"), [("none", {}), ("session", {OPT_OUT: "0"})], ids=["none", "opted-out"])
def test_without_the_settings_each_round_faults_its_pages_in_again(setup, env, mb):
    # (what the other test would see if the settings were lost; and a session where the user opted out)
    assert _faults(setup, mb, env) >= _pages(mb) * 9 // 10


@pytest.mark.parametrize("mb", [16, 40])
@pytest.mark.parametrize("setup", ["heap", "session"])
def test_a_training_process_reuses_the_pages_it_freed(setup, mb):
    # (a few pages at most: the interpreter's own small objects)
    assert _faults(setup, mb) < _pages(mb) // 100


def test_the_cli_help_names_the_opt_out():
    r = cli("--help")
    assert r.returncode == 0 and f"{OPT_OUT}=0" in r.stdout
