"""The referee: replays the one isolated step of a game and says whose post-leaf is right.

The isolated "step" is a leaf index: one optimizer step when the spec's checkpoint_interval is 1,
an interval of k steps otherwise (all of them are replayed, from the state of the leaf before).

The referee needs the trainer's run (its state before the step and the step's rounding log), from
wherever the trainer publishes it. Its verdict rule:
- the trainer's published leaves must be the tree it committed and its state file must hash to the
  agreed leaf before the step; data that contradicts the trainer's own commitment (a tampered or
  substituted file) loses the game for the trainer, who is bound to serve what it committed;
- otherwise the step is replayed (`vtrain.audit.replay_step_detail`, with the trainer's log, whose
  illegitimate entries are rejected) and the trainer wins iff the replayed leaf equals its leaf.
Data that cannot be fetched at all (server down, file missing) is not judged: the referee raises,
tries again later, and if it never gets the data its deadline passes and the bonds are refunded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from protocol.chain import GameStatus
from protocol.roles.base import Role, RoleError
from protocol.roles.tx import SentTx
from protocol.runsource import RunSource, TamperedRunError, check_commitment


@dataclass(frozen=True)
class Verdict:
    game_id: int
    step: int  # the isolated step
    trainer_wins: bool
    replayed_leaf: bytes | None  # None when the trainer's data contradicted its commitment
    reason: str
    seconds: float  # time spent fetching and replaying


class Referee(Role):
    """Judges isolated steps of jobs that name this account as referee."""

    def judge(self, game_id: int, source: RunSource, device: str = "cpu") -> Verdict:
        from vtrain.audit import replay_step_detail  # torch: only when a step is judged

        t0 = time.perf_counter()
        game = self.game(game_id)
        if game.status != GameStatus.ISOLATED:
            raise RoleError(f"game {game_id} is {game.status.name.lower()}: only an isolated step can be judged")
        job = self.job(game.job_id)
        step = game.hi

        def lose(reason: str) -> Verdict:
            return Verdict(game_id, step, False, None, reason, time.perf_counter() - t0)

        try:
            run = source.open()
            check_commitment(run, job.root, job.terms.size, job.terms.spec_hash, where=source.location)
            if run.leaves[step - 1] != game.leaf_lo:
                return lose(f"the trainer's leaf {step - 1} is not the agreed pre-leaf 0x{game.leaf_lo.hex()}")
            source.fetch_for_replay(step)
        except TamperedRunError as e:
            return lose(f"the trainer's published data contradicts its commitment: {e}")
        replay = replay_step_detail(run, step, device)
        trainer_wins = replay.leaf == game.trainer_leaf_hi
        reason = ("the replayed leaf equals the trainer's" if trainer_wins else
                  f"the replayed leaf 0x{replay.leaf.hex()} differs from the trainer's 0x{game.trainer_leaf_hi.hex()}"
                  + (f" ({replay.note})" if replay.note else ""))
        return Verdict(game_id, step, trainer_wins, replay.leaf, reason, time.perf_counter() - t0)

    def resolve(self, verdict: Verdict) -> SentTx:
        game = self.game(verdict.game_id)
        job = self.job(game.job_id)
        if job.terms.referee.lower() != self.address.lower():
            raise RoleError(f"job {job.job_id} names referee {job.terms.referee}, not {self.address}")
        winner = "trainer" if verdict.trainer_wins else "challenger"
        return self._send("resolve", verdict.game_id, verdict.trainer_wins,
                          label=f"resolve game {verdict.game_id}: step {verdict.step}, {winner} wins",
                          key=f"resolve:{verdict.game_id}")
