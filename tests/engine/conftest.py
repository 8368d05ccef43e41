"""Fixtures of the engine tests (helpers live in enginekit.py)."""

from __future__ import annotations

import pytest

from enginekit import RunCache


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> RunCache:
    """Each (spec, device, faults) trained once per test session."""
    return RunCache(tmp_path_factory.mktemp("runs"))
