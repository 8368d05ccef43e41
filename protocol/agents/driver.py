"""Running several agents in one process on a local chain, moving its clock when everyone waits.

This is how the demo (and the tests) play a whole story in seconds: every agent ticks in turn;
when a full round mines no block, nobody has anything to do until time passes, so the chain's
clock jumps ahead (windows, chess clocks and referee deadlines are minutes to hours long). Only
for chains whose clock may be moved (eth-tester, anvil); on a real network agents run in their own
processes (`vtrain watch`) and time passes by itself.
"""

from __future__ import annotations

from typing import Callable, Sequence

from web3 import Web3

from protocol.agents.agent import Agent
from protocol.chain import advance_time
from vtrain.errors import VtrainError


class StalledError(VtrainError):
    """The agents did not settle within the allowed number of rounds."""


def drive(w3: Web3, agents: Sequence[Agent], finished: Sequence[Agent], idle_advance_s: int,
          max_rounds: int = 300, on_advance: Callable[[int], None] | None = None) -> int:
    """Tick `agents` until every agent of `finished` is done; return the rounds taken."""
    done: set[int] = set()
    for rounds in range(1, max_rounds + 1):
        block = w3.eth.block_number
        for agent in agents:
            if id(agent) not in done and agent.tick():
                done.add(id(agent))
        if all(id(a) in done for a in finished):
            return rounds
        if w3.eth.block_number == block:
            advance_time(w3, idle_advance_s)
            if on_advance is not None:
                on_advance(idle_advance_s)
    raise StalledError(f"agents did not settle within {max_rounds} rounds")
