"""Fixtures of the model-family tests (helpers live in familykit.py)."""

from __future__ import annotations

import pytest

from familykit import RunCache, write_cifar, write_corpus


@pytest.fixture(scope="session")
def family_data(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("family-data")
    return {"cifar10": write_cifar(base / "cifar-10-batches-py"), "text": write_corpus(base / "corpus.txt")}


@pytest.fixture(scope="session")
def family_runs(tmp_path_factory) -> RunCache:
    return RunCache(tmp_path_factory.mktemp("family-runs"))
