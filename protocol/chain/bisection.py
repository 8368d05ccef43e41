"""The bisection as a player sees it: which children to reveal next, from the game's node.

Both honest sides play the same rule (VerificationGame.move): reveal the own children of the
disputed node [start, end), descend the way the contract will (into the left child when the left
children differ from the opponent's, else the right), and, unless that reaches a single leaf,
reveal the own children of the new node. A move that isolates a step also proves the pre-leaf
(leaf step - 1) unless it is the agreed left child just compared. Nothing here touches the chain,
so the rule is tested against the contract and on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.chain.prover import Prover, split_point

ZERO = bytes(32)


@dataclass(frozen=True)
class Move:
    """The arguments of one `move` call, and the node [start, end) it descends into."""

    children: tuple[bytes, bytes]
    next: tuple[bytes, bytes]  # zeros when the move isolates a step
    pre_leaf: bytes  # zero unless the isolating move must prove it
    pre_proof: list[bytes]
    start: int
    end: int

    @property
    def isolates(self) -> bool:
        return self.end - self.start == 1

    def args(self, game_id: int) -> tuple:
        return (game_id, list(self.children), list(self.next), self.pre_leaf, self.pre_proof)


def plan_move(start: int, end: int, opponent: tuple[bytes, bytes], prover: Prover) -> Move:
    """The move of the player owning `prover` at node [start, end), against the opponent's children."""
    left, right = prover.children(start, end)
    k = split_point(end - start)
    if left != opponent[0]:
        new_start, new_end, agreed_leaf = start, start + k, False
    else:
        new_start, new_end, agreed_leaf = start + k, end, k == 1
    if new_end - new_start > 1:
        return Move((left, right), prover.children(new_start, new_end), ZERO, [], new_start, new_end)
    pre_leaf, pre_proof = (ZERO, []) if agreed_leaf else prover.reveal(new_start - 1)
    return Move((left, right), (ZERO, ZERO), pre_leaf, pre_proof, new_start, new_end)
