"""A game between two honest but different runs isolates exactly their first differing leaf.

Sizes (numSteps + 1) are sampled in the fast test, always including 2, 3, 1024 and 1025 and
powers of two ± 1, with the first difference at both ends and in the middle; the slow sweep
(`sweep_cases`, run on anvil) covers many more sizes and positions.
"""

from __future__ import annotations

import random

import pytest

from gamekit import leaves, play
from protocol.chain import GameStatus, TreeProver
from protocol.chain.prover import split_point


def depth(size: int, leaf: int) -> int:
    """The depth of `leaf` in an RFC 9162 tree of `size` leaves (the root has depth 0)."""
    start, end, d = 0, size, 0
    while end - start > 1:
        k = split_point(end - start)
        start, end = (start, start + k) if leaf < start + k else (start + k, end)
        d += 1
    return d


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
    # One move per level below the root (whose children the challenge revealed); two leaves
    # isolate step 1 at the challenge.
    assert len(results) == (depth(num_steps + 1, diverge_at) if num_steps > 1 else 0)
    assert len(results) <= num_steps.bit_length()


FAST_CASES = [
    (1, 1), (2, 1), (2, 2), (3, 3), (4, 1), (7, 4), (8, 8), (15, 1), (16, 9), (17, 17), (63, 32),
    (64, 1), (127, 100), (255, 128), (1023, 1), (1023, 512), (1024, 1024), (1024, 777),
]  # fmt: skip


@pytest.mark.parametrize("num_steps, diverge_at", FAST_CASES)
def test_honest_game_isolates_the_first_differing_leaf(world, num_steps, diverge_at):
    isolate(world, num_steps, diverge_at)


def sweep_cases() -> list[tuple[int, int]]:
    """(numSteps, first difference) for the slow sweep: every size 2..69 at a random position
    (and at both ends up to size 9), powers of two ± 1 up to 1025 at both ends and a random
    position, and 20 random sizes up to 1025 at a random position."""
    rng = random.Random(4)
    cases = set()
    for size in range(2, 70):
        cases.add((size - 1, rng.randint(1, size - 1)))
        if size <= 9:
            cases |= {(size - 1, 1), (size - 1, size - 1)}
    for size in (2**k + e for k in range(6, 11) for e in (-1, 0, 1)):
        cases |= {(size - 1, 1), (size - 1, size - 1), (size - 1, rng.randint(1, size - 1))}
    for size in rng.sample(range(70, 1026), 20):
        cases.add((size - 1, rng.randint(1, size - 1)))
    return sorted(cases)


# The sweep itself runs on anvil (test_game_anvil.py::test_sweep_of_sizes_2_to_1025_on_anvil):
# its games take several times longer on eth-tester.
