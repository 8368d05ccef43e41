"""The two sides of a game: the trainer (commits a run) and the auditor (challenges it).

Both hold a full list of step leaves — the trainer its run's, the auditor its own replay's — and
play the same bisection rule (protocol.chain.bisection.plan_move). Each checks what it can before
sending, so a doomed transaction is refused with a reason instead of burning gas.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from protocol.chain import Game, GameStatus, Job, JobStatus, Side, TreeProver
from protocol.chain.bisection import plan_move
from protocol.roles.base import Role, RoleError
from protocol.roles.tx import SentTx
from vtrain.run import Run, RunError, decode_leaves


class Player(Role):
    """A side of the bisection holding its own step leaves."""

    side: Side

    def __init__(self, binding: Any, account: Any, leaves: Sequence[bytes] = (), **kw: Any) -> None:
        super().__init__(binding, account, **kw)
        self.set_leaves(leaves)

    def set_leaves(self, leaves: Sequence[bytes]) -> None:
        """Take this side's leaves (an auditor has them only once its audit finished)."""
        self.leaves = list(leaves)
        self.tree = TreeProver(self.leaves)

    @property
    def root(self) -> bytes:
        return self.tree.root

    @property
    def size(self) -> int:
        return self.tree.size

    def my_turn(self, game: Game) -> bool:
        return game.status == GameStatus.ACTIVE and game.turn == self.side

    def respond(self, game_id: int) -> SentTx | None:
        """Make this side's move in `game_id` if it is this side's turn; None otherwise."""
        game = self.game(game_id)
        if not self.my_turn(game):
            return None
        move = plan_move(game.start, game.end, game.opponent_children, self.tree)
        shown = f"isolate step {move.start}" if move.isolates else f"reveal children of [{move.start},{move.end})"
        label = f"move in game {game_id}: [{game.start},{game.end}) -> {shown}"
        return self._send("move", *move.args(game_id), label=label, key=f"move:{game_id}:{game.start}:{game.end}")

    def _check_size(self, job: Job) -> None:
        if self.size != job.terms.size:
            raise RoleError(f"job {job.job_id} has {job.terms.num_steps} steps (tree size {job.terms.size}) but these leaves make "
                            f"a tree of size {self.size}: train or audit the job's spec with its number of steps")


class Trainer(Player):
    """Commits a run to a job and defends it."""

    side = Side.TRAINER

    def __init__(self, binding: Any, account: Any, run: Run, **kw: Any) -> None:
        super().__init__(binding, account, run.leaves, **kw)
        self.run = run

    def commit(self, job_id: int) -> SentTx:
        job = self.job(job_id)
        if job.status != JobStatus.OPEN:
            raise RoleError(f"job {job_id} is {job.status.name.lower()}, not open: it takes no (more) commitments")
        if self.run.spec_hash != job.terms.spec_hash:
            raise RoleError(f"run {self.run.path} trains spec 0x{self.run.spec_hash.hex()}, but job {job_id} asks for "
                            f"0x{job.terms.spec_hash.hex()}")
        self._check_size(job)
        if self.leaves[0] != job.terms.leaf0:
            raise RoleError(f"run {self.run.path} starts from leaf 0x{self.leaves[0].hex()}, not the job's leaf 0 "
                            f"0x{job.terms.leaf0.hex()}: it would lose any game isolating step 1")
        last = self.size - 1
        return self._send("commit", job_id, self.root, self.size, self.leaves[last], self.tree.proof(last),
                          self.tree.proof(0), label=f"commit root 0x{self.root.hex()[:12]}… to job {job_id}",
                          key=f"commit:{job_id}", value=job.terms.trainer_bond)


def read_audit_leaves(audit_dir: Path) -> list[bytes]:
    """The auditor's own leaves, from the --out directory of `vtrain audit` (or a run directory)."""
    path = Path(audit_dir) / "leaves.bin"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise RunError(f"{path}: missing; give the --out directory of `vtrain audit`") from None
    return [r.leaf for r in decode_leaves(data, str(path))]


class Auditor(Player):
    """Challenges a commitment its own leaves disagree with, and plays the game."""

    side = Side.CHALLENGER

    def challenge(self, job_id: int) -> tuple[int, SentTx]:
        job = self.job(job_id)
        if job.status != JobStatus.COMMITTED:
            raise RoleError(f"job {job_id} is {job.status.name.lower()}: only a committed job can be challenged")
        self._check_size(job)
        last = self.size - 1
        if self.leaves[last] == job.final_leaf:
            raise RoleError(f"the audit's final leaf equals the trainer's on job {job_id}: nothing to challenge")
        now = self.now()
        if now >= job.challenge_closes_at:
            raise RoleError(f"job {job_id}'s challenge window closed at {job.challenge_closes_at} (chain time {now})")
        result = self._send("challenge", job_id, self.root, self.leaves[last], self.tree.proof(last),
                            self.tree.proof(0), *self.tree.root_children(),
                            label=f"challenge job {job_id} with root 0x{self.root.hex()[:12]}…",
                            key=f"challenge:{job_id}", value=job.terms.challenger_bond)
        games = self.games_of_job(job_id, challenger=self.address, from_block=result.block)
        if not games:
            raise RoleError(f"challenge of job {job_id}: transaction {result.hash} emitted no Challenged event")
        return games[0], result
