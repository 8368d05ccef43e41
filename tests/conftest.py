"""Settings for every test process: one intra-op thread, and in-process runs for named tests.

pyproject.toml runs the suite on `-n auto --dist worksteal` (pytest-xdist): one worker per core (at
most MAX_WORKERS), each worker stealing queued tests from the other when it runs dry, so the long
slow cases overlap the many short ones. Two consequences handled here:

- Workers share the cores, and an OpenMP pool per worker would oversubscribe them (spinning threads
  slow everyone down). OMP_NUM_THREADS=1 is set before any test imports torch, so every worker and
  every subprocess a test starts defaults to one thread; tests that claim something about thread
  counts set them explicitly (`VTRAIN_THREADS`, `torch.set_num_threads`), which overrides it.
- Starting workers costs a few seconds, which a developer running one named test
  (`pytest tests/x.py::test_y`) should not pay: when every argument is a test id, `auto` means no
  workers. `-n 0` forces one process for anything else, `-n 2` two workers for named tests too.

Session fixtures are per worker: each worker trains the runs and compiles the contracts it needs
(contract artifacts are written atomically, so concurrent compiles are safe).
"""

from __future__ import annotations

import os
import sys

import pytest

# Each worker repeats the session fixtures and holds its own torch (~0.7 GB): more workers than this
# cost more than they gain even on a large machine.
MAX_WORKERS = 8

os.environ["OMP_NUM_THREADS"] = "1"
if "torch" in sys.modules:  # imported before this file (by a plugin): the variable came too late
    sys.modules["torch"].set_num_threads(1)


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: no workers when only test ids are named, else one per usable core (capped)."""
    if config.args and all("::" in arg for arg in config.args):
        return 0
    workers = min(len(os.sched_getaffinity(0)), MAX_WORKERS)
    return workers if workers > 1 else 0  # one worker is one process plus the cost of starting it
