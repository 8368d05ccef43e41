"""Shared helpers of the contract tests: leaf sequences, job terms, a World of named accounts."""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from dataclasses import dataclass, replace

import pytest
from web3 import Web3

from protocol.chain import ContractRevert, GameStatus, JobTerms, Side, TreeProver, TxResult, VerificationGame
from protocol.chain.connect import latest_timestamp, revert, set_next_timestamp, snapshot

ETHER = 10**18
REWARD = 5 * ETHER
TRAINER_BOND = 2 * ETHER
CHALLENGER_BOND = ETHER
WINDOW = 1000
CLOCK = 300
REFEREE_WINDOW = 500


def leaves(n: int, tag: str = "honest", diverge_at: int | None = None, leaf0: bytes | None = None) -> list[bytes]:
    """n + 1 leaves 0..n; from `diverge_at` on, a different run's leaves (tag + '/bad')."""
    out = []
    for i in range(n + 1):
        t = tag if diverge_at is None or i < diverge_at else tag + "/bad"
        out.append(hashlib.sha3_256(f"{t}:{i}".encode()).digest())
    if leaf0 is not None:
        out[0] = leaf0
    return out


LEAF0 = leaves(0)[0]


@dataclass
class World:
    """A deployed game and named accounts on one chain."""

    w3: Web3
    game: VerificationGame
    client: str
    trainer: str
    auditor: str
    auditor2: str
    referee: str
    stranger: str

    def terms(self, num_steps: int = 8, **overrides) -> JobTerms:
        base = JobTerms(
            spec_hash=hashlib.sha3_256(b"spec").digest(), leaf0=LEAF0, referee=self.referee, num_steps=num_steps,
            challenge_window=WINDOW, clock_per_side=CLOCK, referee_window=REFEREE_WINDOW,
            trainer_bond=TRAINER_BOND, challenger_bond=CHALLENGER_BOND,
        )  # fmt: skip
        return replace(base, **overrides)

    def new_job(self, num_steps: int = 8, reward: int = REWARD, **overrides) -> int:
        return self.game.create_job(self.terms(num_steps, **overrides), reward, self.client).value

    def committed_job(self, num_steps: int = 8, trainer_leaves: list[bytes] | None = None) -> tuple[int, TreeProver]:
        job_id = self.new_job(num_steps)
        prover = TreeProver(trainer_leaves or leaves(num_steps))
        self.game.commit_tree(job_id, prover, self.trainer)
        return job_id, prover

    def now(self) -> int:
        return latest_timestamp(self.w3)

    def at(self, timestamp: int) -> None:
        """The next transaction runs at `timestamp` (time only moves forward: see `rewind`)."""
        set_next_timestamp(self.w3, timestamp)

    @contextmanager
    def rewind(self):
        """Undo everything, the chain's clock included, done inside the block."""
        snap = snapshot(self.w3)
        try:
            yield
        finally:
            revert(self.w3, snap)


def make_world(w3: Web3, artifact) -> World:
    """Deploy a VerificationGame from account 0; name accounts 0..5."""
    accounts = w3.eth.accounts
    game = VerificationGame.deploy(w3, accounts[0], artifact)
    return World(w3, game, *accounts[:6])


@contextmanager
def reverts(world: World, name: str, **fields):
    """Expect a revert with custom error `name` (checked by its 4-byte selector) and `fields`."""
    with pytest.raises(ContractRevert) as info:
        yield info
    err = info.value
    assert err.selector == world.game.tx.decoder.selectors()[name], f"expected {name}, got {err}"
    assert type(err).__name__ == name
    for key, value in fields.items():
        assert err.fields[key] == value, f"{name}.{key}: {err.fields[key]!r} != {value!r}"


def play(world: World, game_id: int, trainer: TreeProver, challenger: TreeProver) -> list[TxResult]:
    """Both sides move honestly from their own trees until the game leaves ACTIVE."""
    results = []
    while (g := world.game.game(game_id)).status == GameStatus.ACTIVE:
        prover, sender = (trainer, world.trainer) if g.turn == Side.TRAINER else (challenger, world.auditor)
        results.append(world.game.move_tree(game_id, prover, sender))
    return results
