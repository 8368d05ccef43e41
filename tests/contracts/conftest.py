"""Fixtures for the contract tests: one compile per session, one chain per backend, snapshots.

Each test runs against a VerificationGame deployed once per session on a chain that is reverted
to a snapshot after the test, so tests are isolated yet none pays for a deployment.
"""

from __future__ import annotations

import pytest

from gamekit import World, make_world
from protocol.chain import revert, snapshot, tester_web3
from protocol.compile import compile_contracts


@pytest.fixture(scope="session")
def artifacts():
    return compile_contracts()


@pytest.fixture(scope="session")
def tester_world(artifacts) -> World:
    return make_world(tester_web3(), artifacts["VerificationGame"])


@pytest.fixture
def world(tester_world: World):
    """The eth-tester world, reverted to its state before the test afterwards."""
    snap = snapshot(tester_world.w3)
    yield tester_world
    revert(tester_world.w3, snap)
