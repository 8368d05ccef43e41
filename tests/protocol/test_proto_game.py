"""The bisection rule both sides play (protocol.chain.bisection.plan_move), against the real contract."""

from __future__ import annotations

import pytest
from protokit import ETHER, Chain

from protocol.chain import GameStatus, JobTerms, Side, TreeProver
from protocol.roles.player import Player
from vtrain.leaves import keccak256


class Bisector(Player):
    def __init__(self, chain: Chain, who: str, side: Side, leaves: list[bytes]) -> None:
        self.side = side
        super().__init__(chain.binding, chain.keys[who], leaves)


@pytest.mark.parametrize("steps, first_bad", [(1, 1), (2, 1), (2, 2), (5, 3), (8, 1), (8, 8), (16, 9), (33, 17),
                                               (64, 63), (100, 37)])
def test_honest_play_isolates_the_first_differing_step(tester_chain: Chain, steps: int, first_bad: int) -> None:
    good = [keccak256(b"good%d" % i) for i in range(steps + 1)]
    bad = good[:first_bad] + [keccak256(b"bad%d" % i) for i in range(first_bad, steps + 1)]
    g = tester_chain.binding
    terms = JobTerms(bytes(32), good[0], tester_chain.keys["referee"].address, steps, 600, 600, 600, ETHER, ETHER)
    job = g.create_job(terms, ETHER, tester_chain.keys["client"]).value
    # Either side may be the one in the wrong: the rule does not depend on who is right.
    trainer_leaves, challenger_leaves = (bad, good) if first_bad % 2 else (good, bad)
    g.commit_tree(job, TreeProver(trainer_leaves), tester_chain.keys["trainer"])
    game = g.challenge_tree(job, TreeProver(challenger_leaves), tester_chain.keys["auditor"]).value
    players = {Side.TRAINER: Bisector(tester_chain, "trainer", Side.TRAINER, trainer_leaves),
               Side.CHALLENGER: Bisector(tester_chain, "auditor", Side.CHALLENGER, challenger_leaves)}
    moves = 0
    while g.game(game).status == GameStatus.ACTIVE:
        turn = g.game(game).turn
        assert players[Side(1 - turn)].respond(game) is None  # the side not to move does nothing
        assert players[turn].respond(game).status == 1
        moves += 1
    end = g.game(game)
    assert end.status == GameStatus.ISOLATED and (end.lo, end.hi) == (first_bad - 1, first_bad)
    # One move per level of the descent below the root's children (the challenge revealed those).
    assert moves <= max(0, steps.bit_length() - (steps == 1))
