"""Plain Python views of the VerificationGame's enums, structs and events.

The enums mirror the Solidity ones value for value (the ABI carries enums as uint8); the
dataclasses are what the binding returns, with snake_case fields and a few derived values
(the interval lo..hi, the isolated step, deadlines) that clients would otherwise recompute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any


class JobStatus(IntEnum):
    NONE = 0
    OPEN = 1
    COMMITTED = 2
    FINAL = 3
    VOID = 4
    CANCELLED = 5


class GameStatus(IntEnum):
    NONE = 0
    ACTIVE = 1
    ISOLATED = 2
    TRAINER_WON = 3
    CHALLENGER_WON = 4
    REFUNDED = 5


class Side(IntEnum):
    TRAINER = 0
    CHALLENGER = 1


class EndReason(IntEnum):
    TIMEOUT = 0
    REFEREE = 1
    REFEREE_MISSED_DEADLINE = 2


# Solidity enum type name (as in the ABI's internalType) -> Python enum.
ENUMS: dict[str, type[IntEnum]] = {
    "JobStatus": JobStatus,
    "GameStatus": GameStatus,
    "Side": Side,
    "EndReason": EndReason,
}


def enum_for(internal_type: str | None) -> type[IntEnum] | None:
    """The Python enum for an ABI internalType such as 'enum VerificationGame.JobStatus'."""
    if not internal_type or not internal_type.startswith("enum "):
        return None
    return ENUMS.get(internal_type.rsplit(".", 1)[-1].split(" ")[-1])


@dataclass(frozen=True)
class JobTerms:
    """What a client fixes when it posts a job (see VerificationGame.JobTerms)."""

    spec_hash: bytes  # 32 bytes: hash of the spec's canonical JSON
    leaf0: bytes  # 32 bytes: leaf 0, the initial state
    referee: str  # address
    num_steps: int  # trees have num_steps + 1 leaves
    challenge_window: int  # seconds after the commitment
    clock_per_side: int  # chess-clock seconds per side per game
    referee_window: int  # seconds for the referee after a step is isolated
    trainer_bond: int  # wei
    challenger_bond: int  # wei

    def as_tuple(self) -> tuple:
        return (
            self.spec_hash, self.leaf0, self.referee, self.num_steps, self.challenge_window,
            self.clock_per_side, self.referee_window, self.trainer_bond, self.challenger_bond,
        )  # fmt: skip

    @property
    def size(self) -> int:
        """The size every tree of this job has: leaves 0..num_steps."""
        return self.num_steps + 1


@dataclass(frozen=True)
class Job:
    """A job and its commitment as stored on-chain."""

    job_id: int
    terms: JobTerms
    client: str
    status: JobStatus
    open_games: int
    winners: int
    reward: int
    trainer: str  # zero address while OPEN
    committed_at: int
    root: bytes
    final_leaf: bytes

    @property
    def challenge_closes_at(self) -> int:
        """First timestamp at which challenges are refused and finalize is allowed."""
        return self.committed_at + self.terms.challenge_window


@dataclass(frozen=True)
class Game:
    """A bisection game as stored on-chain, with its clock unpacked.

    The game descends both trees to the first leaf where they differ: [start, end) is the node
    whose hashes differ, every leaf before `start` agreeing. `lo`/`hi` say the same as an
    interval of steps: the trees agree up to leaf lo and first differ somewhere in (lo, hi]; a step
    is isolated when hi = lo + 1 (the step is hi, its pre-leaf is at lo).
    """

    game_id: int
    challenger: str
    job_id: int
    status: GameStatus
    share_claimed: bool
    root: bytes
    start: int
    end: int
    size: int
    turn: Side
    since: int  # when the side to move got the move (when the game stopped, once stopped)
    trainer_left: int  # seconds left when the move last changed hands
    challenger_left: int
    node: bytes  # ACTIVE: the side to move's hash of [start, end); isolated: the pre-leaf
    left: bytes  # ACTIVE: the opponent's left child (raw leaf if one leaf); isolated: trainer's leaf
    right: bytes  # ACTIVE: the opponent's right child; isolated: challenger's leaf

    @property
    def lo(self) -> int:
        """The last leaf known to agree (-1 before the descent passed any agreed subtree)."""
        return self.start - 1

    @property
    def hi(self) -> int:
        """The last leaf of the disputed node."""
        return self.end - 1

    @property
    def opponent_children(self) -> tuple[bytes, bytes]:
        """The children the side to move must answer (while ACTIVE)."""
        return self.left, self.right

    @property
    def isolated_step(self) -> int | None:
        """The isolated step once the bisection ended there, else None."""
        return self.start if self.end - self.start == 1 and self.status != GameStatus.ACTIVE else None

    @property
    def leaf_lo(self) -> bytes | None:
        """The agreed pre-leaf at step - 1, once a step is isolated."""
        return self.node if self.isolated_step is not None else None

    @property
    def trainer_leaf_hi(self) -> bytes | None:
        """The trainer's leaf at the isolated step."""
        return self.left if self.isolated_step is not None else None

    @property
    def challenger_leaf_hi(self) -> bytes | None:
        """The challenger's leaf at the isolated step."""
        return self.right if self.isolated_step is not None else None


@dataclass(frozen=True)
class Event:
    """One decoded contract event."""

    name: str
    args: dict[str, Any]
    block_number: int
    tx_hash: bytes

    def __getitem__(self, key: str) -> Any:
        return self.args[key]


@dataclass(frozen=True)
class TxResult:
    """A mined transaction: its gas, decoded events and the function's meaningful result."""

    function: str
    tx_hash: bytes
    block_number: int
    gas_used: int
    events: list[Event] = field(default_factory=list)
    value: Any = None  # the new job id / game id for create_job / challenge, else None

    def event(self, name: str) -> Event:
        """The one event called `name` this transaction emitted."""
        found = [e for e in self.events if e.name == name]
        if len(found) != 1:
            raise KeyError(f"{self.function} emitted {len(found)} {name} events, expected 1: {[e.name for e in self.events]}")
        return found[0]
