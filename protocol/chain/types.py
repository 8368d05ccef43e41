"""Plain Python views of the VerificationGame's enums, structs and events.

The enums mirror the Solidity ones value for value (the ABI carries enums as uint8); the
dataclasses are what the binding returns, with snake_case fields and a few derived values
(midpoint, deadlines) that clients would otherwise recompute.
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
    """A bisection game as stored on-chain, with its clock unpacked."""

    game_id: int
    challenger: str
    job_id: int
    status: GameStatus
    share_claimed: bool
    root: bytes
    lo: int
    hi: int
    size: int
    turn: Side
    since: int  # when the side to move got the move (when the game stopped, once stopped)
    trainer_left: int  # seconds left when the move last changed hands
    challenger_left: int
    pending: bytes  # the last mover's leaf at `mid`, to be answered
    leaf_lo: bytes
    trainer_leaf_hi: bytes
    challenger_leaf_hi: bytes

    @property
    def mid(self) -> int:
        """The index whose leaf the side to move must reveal."""
        return (self.lo + self.hi) // 2

    @property
    def isolated_step(self) -> int | None:
        """The isolated step (hi) once the bisection ended there, else None."""
        return self.hi if self.hi - self.lo == 1 and self.status != GameStatus.ACTIVE else None


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
