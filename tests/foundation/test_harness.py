"""The test harness itself (tests/conftest.py): one torch thread per test process, workers only when useful."""

import os
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch


@pytest.fixture
def harness(pytestconfig) -> ModuleType:
    # Every conftest.py is a module named "conftest": find the root one among the loaded plugins.
    path = str(Path(__file__).resolve().parents[1] / "conftest.py")
    return next(p for p in pytestconfig.pluginmanager.get_plugins() if getattr(p, "__file__", None) == path)


def test_test_processes_and_their_children_default_to_one_thread():
    # Several workers share the cores; a test that raises the count must set it back.
    assert torch.get_num_threads() == 1
    assert os.environ["OMP_NUM_THREADS"] == "1"


def test_named_tests_run_without_workers(harness):
    config = SimpleNamespace(args=["tests/a.py::test_b", "tests/c.py::T::test_d"])
    assert harness.pytest_xdist_auto_num_workers(config) == 0


def test_directories_and_files_get_one_worker_per_core(harness):
    cores = len(os.sched_getaffinity(0))
    expected = min(cores, harness.MAX_WORKERS) if cores > 1 else 0
    for args in (["tests"], ["tests/a.py", "tests/c.py::test_d"]):
        assert harness.pytest_xdist_auto_num_workers(SimpleNamespace(args=args)) == expected, args
