"""An agent's persistent memory: its games and the transactions it signed, in one JSON file.

The file is rewritten atomically (temp file, fsync, rename) whenever it changes and always
*before* a transaction leaves the process, so an agent killed at any instant restarts knowing every
transaction it may have sent; `protocol.roles.tx.Transactor` uses that to rebroadcast or await the
same signed bytes instead of signing a second transaction for the same action.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from vtrain.errors import VtrainError

STATE_VERSION = 1


class AgentStateError(VtrainError):
    """The agent's state file is unreadable or belongs to another agent."""


class AgentState:
    """The JSON state of one agent (one role, account, contract and chain)."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = Path(path)
        self.data = data

    @classmethod
    def load(cls, path: Path, *, role: str, account: str, contract: str, chain_id: int, start_block: int) -> "AgentState":
        """Open the state at `path`, or start one; refuse a file written for another identity."""
        path = Path(path)
        identity = {"role": role, "account": account, "contract": contract, "chain_id": chain_id}
        if path.exists():
            try:
                data = json.loads(path.read_text())
            except ValueError:
                raise AgentStateError(f"agent state {path} is not valid JSON; it was damaged outside vtrain "
                                      f"(its writes are atomic): restore it or start with a new --state file") from None
            if data.get("version") != STATE_VERSION:
                raise AgentStateError(f"agent state {path} has version {data.get('version')}, expected {STATE_VERSION}")
            mine = {k: data.get(k) for k in identity}
            if mine != identity:
                raise AgentStateError(f"agent state {path} belongs to {mine}, not {identity}: use another --state file")
            return cls(path, data)
        data = {"version": STATE_VERSION, **identity, "start_block": start_block, "next_block": start_block,
                "games": {}, "txs": {}, "notes": {}}
        state = cls(path, data)
        state.save()
        return state

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    @property
    def games(self) -> dict[str, dict]:
        """Game id (as a string, JSON keys are strings) -> what this agent knows of the game."""
        return self.data["games"]

    @property
    def txs(self) -> dict[str, dict]:
        """Action key -> the signed transaction for it and, once mined, its outcome."""
        return self.data["txs"]

    @property
    def notes(self) -> dict[str, Any]:
        """Role-specific facts worth keeping across restarts (e.g. the audit's result)."""
        return self.data["notes"]

    @property
    def start_block(self) -> int:
        """The first block that can hold an event of interest (the contract's deployment)."""
        return self.data["start_block"]

    @property
    def next_block(self) -> int:
        return self.data["next_block"]

    @next_block.setter
    def next_block(self, block: int) -> None:
        self.data["next_block"] = block
