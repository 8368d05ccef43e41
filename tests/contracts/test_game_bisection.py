"""A game between two honest but different runs isolates exactly their first differing leaf.

Sizes (numSteps + 1) are sampled in the fast test, always including 2, 3, 1024 and 1025 and
powers of two ± 1, with the first difference at both ends and in the middle; the slow test
sweeps many more sizes and positions.
"""

from __future__ import annotations

import random

import pytest

from gamekit import leaves, play
from protocol.chain import GameStatus, TreeProver


def isolate(world, num_steps: int, diverge_at: int) -> None:
    job_id, trainer = world.committed_job(num_steps)
    auditor = TreeProver(leaves(num_steps, diverge_at=diverge_at))
    challenge = world.game.challenge_tree(job_id, auditor, world.auditor)
    results = play(world, challenge.value, trainer, auditor)
    g = world.game.game(challenge.value)
    assert g.status == GameStatus.ISOLATED
    assert (g.lo, g.hi) == (diverge_at - 1, diverge_at), f"size {num_steps + 1}, first difference at {diverge_at}"
    iso = (results[-1] if results else challenge).event("StepIsolated")
    assert iso["step"] == diverge_at
    assert iso["preLeaf"] == trainer.leaf(diverge_at - 1) == auditor.leaf(diverge_at - 1)
    assert (iso["trainerLeaf"], iso["challengerLeaf"]) == (trainer.leaf(diverge_at), auditor.leaf(diverge_at))
    # One move per halving: between floor(log2 n) and ceil(log2 n) moves for n steps.
    assert num_steps.bit_length() - 1 <= len(results) <= (num_steps - 1).bit_length()


FAST_CASES = [
    (1, 1), (2, 1), (2, 2), (3, 3), (4, 1), (7, 4), (8, 8), (15, 1), (16, 9), (17, 17), (63, 32),
    (64, 1), (127, 100), (255, 128), (1023, 1), (1023, 512), (1024, 1024), (1024, 777),
]  # fmt: skip


@pytest.mark.parametrize("num_steps, diverge_at", FAST_CASES)
def test_honest_game_isolates_the_first_differing_leaf(world, num_steps, diverge_at):
    isolate(world, num_steps, diverge_at)


@pytest.mark.slow
def test_sweep_of_sizes_2_to_1025(world):
    rng = random.Random(4)
    sizes = sorted({*range(2, 70), *(2**k + e for k in range(6, 11) for e in (-1, 0, 1)), *rng.sample(range(70, 1026), 40)})
    for size in sizes:
        n = size - 1
        for d in sorted({1, n, rng.randint(1, n)}):
            with world.rewind():
                isolate(world, n, d)
