"""Event-driven agents: one loop per role that reacts to the chain until its work is settled.

Each tick an agent reads new contract events since the block it last saw (to discover games),
then reads the current state of each of its games and does what that state asks of its role:
move when it is its turn, end a game whose opponent ran out of time, ask for a refund when the
referee missed its deadline, finalize, claim and withdraw. Decisions are taken from the chain's
state, not from remembered intentions, and every transaction goes through the journal in the
agent's state file, so an agent killed at any point and restarted on the same state file resumes
without sending anything twice.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable

from protocol.agents.state import AgentState
from protocol.chain import Game, GameStatus, Job, JobStatus
from protocol.roles.base import Role, RoleError, ended
from protocol.roles.player import Auditor, Player, Trainer, read_audit_leaves
from protocol.roles.referee import Referee, Verdict
from protocol.runsource import RunSource, check_commitment
from vtrain.errors import VtrainError

Log = Callable[[str], None]


def quiet(_: str) -> None:
    """A log that says nothing: the default for agents and the demo."""


class Agent(ABC):
    """The loop shared by every role; subclasses implement `step`."""

    role_name = ""

    def __init__(self, role: Role, state: AgentState, log: Log = quiet) -> None:
        self.role = role
        self.state = state
        self.log = log
        self._last_error = ""

    @abstractmethod
    def step(self) -> bool:
        """One pass over the agent's work; True once there is nothing left to do."""

    def tick(self) -> bool:
        """`step`, with errors that a later tick may cure logged rather than raised."""
        try:
            done = self.step()
        except VtrainError as e:
            # A race (the opponent moved first, a clock not yet expired by a second) or missing
            # data: the next tick re-reads the chain and decides again. Said once, not every tick.
            if str(e) != self._last_error:
                self.log(f"{self.role_name}: {e}")
                self._last_error = str(e)
            return False
        self._last_error = ""
        return done

    def run(self, poll_s: float = 0.2, max_seconds: float | None = None) -> bool:
        """Tick until done (True) or `max_seconds` passed (False)."""
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        while True:
            if self.tick():
                return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(poll_s)

    # ---------------------------------------------------------------- shared pieces

    def scan(self, event: str, **filters: Any) -> list[Any]:
        """New `event` logs since the last scan (the scan position is saved with the state)."""
        latest = self.role.w3.eth.block_number
        start = self.state.next_block
        if start > latest:
            return []
        logs = getattr(self.role.contract.events, event).get_logs(from_block=start, to_block=latest,
                                                                   argument_filters=filters or None)
        self.state.next_block = latest + 1
        self.state.save()
        return list(logs)

    def referee_deadline(self, game_id: int) -> int:
        return int(self.role.binding.referee_deadline(game_id))

    def nudge(self, game: Game) -> None:
        """Calls anyone may make to move a stuck game on: timeout or refund."""
        if game.status == GameStatus.ACTIVE:
            _, left, _ = self.role.binding.time_left(game.game_id)
            if left == 0:
                self.log(f"{self.role_name}: the side to move in game {game.game_id} is out of time")
                self.role.timeout(game.game_id)
        elif game.status == GameStatus.ISOLATED and self.role.now() > self.referee_deadline(game.game_id):
            self.log(f"{self.role_name}: the referee missed its deadline in game {game.game_id}")
            self.role.refund(game.game_id)

    def collect(self) -> None:
        """Withdraw whatever the contract owes this account."""
        if self.role.credit() > 0:
            result = self.role.withdraw()
            self.log(f"{self.role_name}: {result.label} (tx {result.hash})")


class PlayerAgent(Agent):
    """Plays the games of one job for one side."""

    role: Player

    def __init__(self, role: Player, state: AgentState, job_id: int, log: Log = quiet) -> None:
        super().__init__(role, state, log)
        self.job_id = job_id

    def play(self, job: Job) -> bool:
        """Play every known game of the job; True when all of them have ended."""
        for gid in sorted(self.state.games, key=int):
            info = self.state.games[gid]
            if info.get("ended"):
                continue
            game = self.role.game(int(gid))
            if ended(game.status):
                info["ended"] = game.status.name
                self.state.save()
                self.log(f"{self.role_name}: game {gid} ended: {game.status.name}")
                continue
            if self.role.my_turn(game):
                result = self.role.respond(game.game_id)
                if result is not None:
                    self.log(f"{self.role_name}: {result.label} (gas {result.gas_used})")
            else:
                self.nudge(game)
        return all(info.get("ended") for info in self.state.games.values())


class TrainerAgent(PlayerAgent):
    """Commits its run to the job (if asked), defends every challenge, finalizes and withdraws."""

    role_name = "trainer"
    role: Trainer

    def __init__(self, role: Trainer, state: AgentState, job_id: int, commit: bool = True, log: Log = quiet) -> None:
        super().__init__(role, state, job_id, log)
        self.commit = commit

    def step(self) -> bool:
        job = self.role.job(self.job_id)
        if job.status == JobStatus.OPEN:
            if self.commit:
                result = self.role.commit(self.job_id)
                self.log(f"trainer: {result.label} (gas {result.gas_used})")
            return False
        if job.trainer.lower() != self.role.address.lower():
            self.log(f"trainer: job {self.job_id} was committed by {job.trainer}, not by this account")
            return True
        for log in self.scan("Challenged", jobId=self.job_id):
            gid = str(int(log["args"]["gameId"]))
            if gid not in self.state.games:
                self.state.games[gid] = {"challenger": log["args"]["challenger"]}
                self.state.save()
                self.log(f"trainer: job {self.job_id} challenged by {log['args']['challenger']} (game {gid})")
        all_ended = self.play(job)
        job = self.role.job(self.job_id)
        if job.status == JobStatus.COMMITTED and all_ended and job.open_games == 0 \
                and self.role.now() >= job.challenge_closes_at:
            result = self.role.finalize(self.job_id)
            self.log(f"trainer: {result.label} (gas {result.gas_used})")
            job = self.role.job(self.job_id)
        if job.status in (JobStatus.FINAL, JobStatus.VOID) and all_ended:
            self.collect()
            return True
        return False


class AuditorAgent(PlayerAgent):
    """Audits the job's committed run (or uses a given audit), challenges if it differs, plays."""

    role_name = "auditor"
    role: Auditor

    def __init__(self, role: Auditor, state: AgentState, job_id: int, audit_dir: Path,
                 source: RunSource | None = None, device: str = "cpu", log: Log = quiet,
                 progress: Callable[[int], Callable[[int, Any], None]] | None = None) -> None:
        super().__init__(role, state, job_id, log)
        self.audit_dir = Path(audit_dir)
        self.source = source
        self.device = device
        self.progress = progress  # total steps -> per-step callback of the audit (the CLI's progress bar)

    def _audit(self, job: Job) -> None:
        """Have the auditor's own leaves in audit_dir (an earlier run's or a given audit's are reused)."""
        if not (self.audit_dir / "leaves.bin").exists():
            from vtrain.audit import audit  # torch: only when auditing

            if self.source is None:
                raise RoleError(f"no audit at {self.audit_dir} and no trainer run source to audit")
            run = self.source.fetch_for_audit()
            check_commitment(run, job.root, job.terms.size, job.terms.spec_hash, where=self.source.location)
            self.log(f"auditor: auditing the trainer's run ({run.steps} steps) on {self.device}")
            report = audit(run, self.device, out=self.audit_dir,
                           progress=self.progress(run.steps) if self.progress else None)
            self.log(f"auditor: {'MATCH' if report.matched else report.divergence} root={report.root}")
        self.role.set_leaves(read_audit_leaves(self.audit_dir))

    def _recover_game(self) -> None:
        # A challenge mined just before a crash: the chain, not memory, says whether it exists.
        games = self.role.games_of_job(self.job_id, challenger=self.role.address, from_block=self.state.start_block)
        if games:
            gid = games[0]
            self.state.notes["game"] = gid
            self.state.games.setdefault(str(gid), {})
            self.state.save()

    def step(self) -> bool:
        job = self.role.job(self.job_id)
        if job.status == JobStatus.OPEN:
            return False
        if not self.role.leaves:
            self._audit(job)
        if "game" not in self.state.notes:
            self._recover_game()
        if "game" not in self.state.notes:
            if self.role.leaves[-1] == job.final_leaf:
                self.log(f"auditor: the audit agrees with the commitment of job {self.job_id}: nothing to challenge")
                return True
            if job.status != JobStatus.COMMITTED or self.role.now() >= job.challenge_closes_at:
                self.log(f"auditor: job {self.job_id} is {job.status.name.lower()} and its window closed at "
                         f"{job.challenge_closes_at}: too late to challenge")
                return True
            gid, result = self.role.challenge(self.job_id)
            self.state.notes["game"] = gid
            self.state.games[str(gid)] = {}
            self.state.save()
            self.log(f"auditor: {result.label} -> game {gid} (gas {result.gas_used})")
        if not self.play(job):
            return False
        game = self.role.game(self.state.notes["game"])
        job = self.role.job(self.job_id)
        if game.status == GameStatus.CHALLENGER_WON and not game.share_claimed:
            if job.open_games > 0:
                return False  # the split of the trainer's bond is fixed when the last game ends
            result = self.role.claim_share(game.game_id)
            self.log(f"auditor: {result.label} (gas {result.gas_used})")
        self.collect()
        return True


class RefereeAgent(Agent):
    """Judges every isolated step of jobs naming this account as referee, with the trainer's run."""

    role_name = "referee"
    role: Referee

    def __init__(self, role: Referee, state: AgentState, sources: dict[int, RunSource], device: str = "cpu",
                 log: Log = quiet) -> None:
        super().__init__(role, state, log)
        self.sources = sources
        self.device = device

    def step(self) -> bool:
        for log in self.scan("StepIsolated"):
            gid = str(int(log["args"]["gameId"]))
            game = self.role.game(int(gid))
            job = self.role.job(game.job_id)
            if job.terms.referee.lower() == self.role.address.lower() and gid not in self.state.games:
                self.state.games[gid] = {"job": game.job_id, "step": int(log["args"]["step"])}
                self.state.save()
                self.log(f"referee: step {game.hi} of job {game.job_id} isolated in game {gid}")
        for gid, info in sorted(self.state.games.items(), key=lambda kv: int(kv[0])):
            if info.get("done"):
                continue
            game = self.role.game(int(gid))
            if game.status != GameStatus.ISOLATED:
                info["done"] = game.status.name
                self.state.save()
                continue
            if self.role.now() > self.referee_deadline(game.game_id):
                info["done"] = "deadline missed"
                self.state.save()
                self.log(f"referee: missed the deadline of game {gid}; the challenger's bond will be refunded")
                continue
            if "verdict" in info:  # judged before a restart: the replay is deterministic, do not redo it
                verdict = Verdict(game.game_id, game.hi, info["verdict"]["trainer_wins"], None,
                                  info["verdict"]["reason"], info["verdict"]["seconds"])
            else:
                source = self.sources.get(info["job"])
                if source is None:
                    raise RoleError(f"no run source for job {info['job']}: pass --run {info['job']}=DIR_OR_URL")
                verdict = self.role.judge(game.game_id, source, self.device)
                info["verdict"] = {"trainer_wins": verdict.trainer_wins, "reason": verdict.reason,
                                   "seconds": round(verdict.seconds, 3)}
                self.state.save()
            result = self.role.resolve(verdict)
            self.log(f"referee: {result.label}: {verdict.reason} (gas {result.gas_used})")
        return False  # a referee serves until stopped
