"""The bisection as a player sees it: which leaf to reveal next, from the game's (lo, hi).

Both honest sides play the same rule (VerificationGame.move): answer the opponent's leaf at
mid = (lo + hi) / 2 with one's own leaf at mid, narrow the interval the way the contract will, and,
unless that isolates a step, reveal one's own leaf at the new midpoint. Nothing here touches the
chain, so the rule is tested against the contract and on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from vtrain.merkle import MerkleTree

ZERO_LEAF = bytes(32)


@dataclass(frozen=True)
class Move:
    """The arguments of one `move` call, and the interval it leads to."""

    answer_index: int
    answer: bytes
    answer_proof: list[bytes]
    next_index: int | None  # None when the move isolates a step
    next: bytes
    next_proof: list[bytes]
    lo: int
    hi: int

    def args(self, game_id: int) -> tuple:
        return (game_id, self.answer, self.answer_proof, self.next, self.next_proof)


def plan_move(lo: int, hi: int, pending: bytes, leaves: Sequence[bytes], tree: MerkleTree) -> Move:
    """The move of a player whose tree is `tree` (over `leaves`) answering `pending` in (lo, hi)."""
    mid = (lo + hi) // 2
    answer = leaves[mid]
    new_lo, new_hi = (mid, hi) if answer == pending else (lo, mid)
    if new_hi - new_lo == 1:
        return Move(mid, answer, tree.proof(mid), None, ZERO_LEAF, [], new_lo, new_hi)
    nxt = (new_lo + new_hi) // 2
    return Move(mid, answer, tree.proof(mid), nxt, leaves[nxt], tree.proof(nxt), new_lo, new_hi)

