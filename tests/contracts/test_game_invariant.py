"""Solvency under random honest and hostile play (Hypothesis stateful testing).

Random sequences of job creations, cancellations, commitments (honest or cheating trees),
challenges (right or wrong trees), honest and malformed moves, time jumps, timeouts, referee
verdicts (honest, wrong or missing), refunds, finalizations, share claims and withdrawals by
every actor. An independent ledger, driven only by the payout rules applied to the events each
transaction emits, predicts every account's credit and what the contract owes; after every
transaction (and every revert) the contract's balance must equal what it owes, every credit must
match the ledger, and ether may only enter with a deposit and leave with a withdrawal.
"""

from __future__ import annotations

import os
from collections import defaultdict

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from gamekit import World, leaves, make_world
from protocol.chain import ContractRevert, GameStatus, JobStatus, Side, TreeProver, revert, snapshot, tester_web3
from protocol.chain.bisection import ZERO, plan_move
from protocol.compile import compile_contracts

pytestmark = pytest.mark.filterwarnings("ignore:The recursion limit will not be reset")

N = 6  # steps per job: 7 leaves, games of up to 3 moves, so sequences reach every phase
TRUTH = TreeProver(leaves(N))


def variant(name: str, diverge_at: int) -> TreeProver:
    """The truth up to `diverge_at`, then leaves of its own (distinct final leaves per variant)."""
    return TreeProver(TRUTH.leaves[:diverge_at] + leaves(N, tag=name)[diverge_at:])


TREES = {
    "truth": TRUTH,
    "late-cheat": variant("late", N),
    "mid-cheat": variant("mid", N // 2 + 1),
    "early-cheat": variant("early", 1),
}
_WORLD: World | None = None


def shared_world() -> World:
    global _WORLD
    if _WORLD is None:
        _WORLD = make_world(tester_web3(), compile_contracts()["VerificationGame"])
    return _WORLD


class Ledger:
    """What the contract owes, recomputed from events by the payout rules (not from its state)."""

    def __init__(self) -> None:
        self.credits: dict[str, int] = defaultdict(int)
        self.escrow: dict[int, int] = {}  # job -> reward held
        self.trainer_bond: dict[int, int] = {}  # job -> trainer bond held (live commitment or pool)
        self.challenger_bond: dict[int, int] = {}  # game -> bond held while the game is open
        self.share: dict[int, int] = {}  # job -> fixed share once split
        self.jobs: dict[int, dict] = {}
        self.games: dict[int, dict] = {}

    def owed(self) -> int:
        return sum(self.credits.values()) + sum(self.escrow.values()) + sum(self.trainer_bond.values()) + sum(
            self.challenger_bond.values()
        )

    def apply(self, ev, value: int) -> None:
        a = ev.args
        if ev.name == "JobCreated":
            assert a["reward"] == value
            self.escrow[a["jobId"]] = value
            self.jobs[a["jobId"]] = {"client": a["client"]}
        elif ev.name == "JobCancelled":
            job = self.jobs[a["jobId"]]
            self.credits[job["client"]] += self.escrow.pop(a["jobId"])
        elif ev.name == "Committed":
            self.trainer_bond[a["jobId"]] = value
            self.jobs[a["jobId"]]["trainer"] = a["trainer"]
        elif ev.name == "Challenged":
            self.challenger_bond[a["gameId"]] = value
            self.games[a["gameId"]] = {"job": a["jobId"], "challenger": a["challenger"]}
        elif ev.name == "GameEnded":
            game = self.games[a["gameId"]]
            bond = self.challenger_bond.pop(a["gameId"])
            winner = self.jobs[game["job"]]["trainer"] if a["outcome"] == GameStatus.TRAINER_WON else game["challenger"]
            self.credits[winner] += bond
            game["outcome"] = a["outcome"]
        elif ev.name == "CommitmentVoided":
            job = self.jobs[a["jobId"]]
            self.credits[job["client"]] += self.escrow.pop(a["jobId"])
        elif ev.name == "BondSplit":
            job_id = a["jobId"]
            winners = [g for g, x in self.games.items() if x["job"] == job_id and x.get("outcome") == GameStatus.CHALLENGER_WON]
            assert a["winners"] == len(winners)
            assert not [g for g, x in self.games.items() if x["job"] == job_id and "outcome" not in x], "split with open games"
            bond = self.trainer_bond[job_id]
            assert (a["share"], a["remainder"]) == divmod(bond, len(winners))
            self.share[job_id] = a["share"]
            self.trainer_bond[job_id] -= a["remainder"]
            self.credits[self.jobs[job_id]["client"]] += a["remainder"]
        elif ev.name == "ShareClaimed":
            game = self.games[a["gameId"]]
            assert game.get("outcome") == GameStatus.CHALLENGER_WON and not game.get("claimed")
            assert a["challenger"] == game["challenger"] and a["amount"] == self.share[game["job"]]
            game["claimed"] = True
            self.trainer_bond[game["job"]] -= a["amount"]
            self.credits[game["challenger"]] += a["amount"]
        elif ev.name == "Finalized":
            job_id = a["jobId"]
            amount = self.escrow.pop(job_id) + self.trainer_bond.pop(job_id)
            assert a["amount"] == amount and a["trainer"] == self.jobs[job_id]["trainer"]
            self.credits[a["trainer"]] += amount
        elif ev.name == "Withdrawn":
            assert a["amount"] == self.credits[a["account"]] > 0
            self.credits[a["account"]] = 0


class GameMachine(RuleBasedStateMachine):
    """Drives one chain's World; `world_factory` is eth-tester's here, anvil's in its test."""

    world_factory = staticmethod(shared_world)

    @initialize(tree=st.sampled_from(sorted(TREES)), challenger_tree=st.sampled_from(sorted(TREES)))
    def start(self, tree, challenger_tree):
        self.world = self.world_factory()
        self.snap = snapshot(self.world.w3)
        # Every transaction runs at a time this machine chooses, counted from a fixed point well
        # ahead of the wall clock, so a replayed example sees the same times (Hypothesis needs
        # runs to be reproducible, and eth-tester's own block times follow the wall clock).
        self.clock = self.world.now() + 10**6
        self.ledger = Ledger()
        # Only this machine's transactions move the contract's ether: the balance read after one
        # is the balance before the next (one read a transaction instead of two or three).
        self.base_balance = self.balance = self.world.game.balance()
        w = self.world
        self.actors = [w.client, w.trainer, w.auditor, w.auditor2, w.referee, w.stranger]
        self.job_ids: list[int] = []
        self.game_ids: list[int] = []
        self.trees: dict[tuple[str, int], TreeProver] = {}  # (role, id) -> tree the party committed
        # Start every sequence from a committed job and one challenge (when the trees differ),
        # so that random rules spend their steps on games rather than on reaching one.
        self.create_job(reward=10**18, bonds=(3, 2))
        self.commit(0, tree)
        self.challenge(0, "auditor", challenger_tree)

    def teardown(self):
        revert(self.world.w3, self.snap)

    # -------------------------------------------------------------- sending

    def send(self, method: str, *args, value: int = 0, **kw):
        """Call a binding method; feed its events to the ledger; a revert must change nothing."""
        before = self.balance
        self.clock += 1
        self.world.at(self.clock)
        try:
            r = getattr(self.world.game, method)(*args, **kw)
        except ContractRevert:
            assert self.world.game.balance() == before
            return None
        withdrawn = sum(e["amount"] for e in r.events if e.name == "Withdrawn")
        self.balance = self.world.game.balance()
        assert self.balance - before == value - withdrawn, f"{method} moved ether it should not"
        deposit_events = [e for e in r.events if e.name in ("JobCreated", "Committed", "Challenged")]
        assert deposit_events or value == 0, f"{method} kept {value} wei without a deposit event"
        for ev in r.events:
            self.ledger.apply(ev, value)
        self.check_ledger()
        return r

    def pick(self, ids: list[int], i: int) -> int:
        return ids[i % len(ids)] if ids else 1 + i % 3  # no ids yet: a missing id (must revert)

    # -------------------------------------------------------------- rules

    @rule(reward=st.integers(0, 10**18), bonds=st.sampled_from([(3, 2), (10**17, 10**17), (7 * 10**16 + 1, 10**16)]))
    def create_job(self, reward, bonds):
        if len(self.job_ids) >= 3:
            return
        terms = self.world.terms(N, trainer_bond=bonds[0], challenger_bond=bonds[1])
        r = self.send("create_job", terms, reward, self.world.client, value=reward)
        assert r is not None
        self.job_ids.append(r.value)

    @rule(i=st.integers(0, 5), who=st.integers(0, 5))
    def cancel(self, i, who):
        self.send("cancel_job", self.pick(self.job_ids, i), self.actors[who])

    @rule(i=st.integers(0, 5), tree=st.sampled_from(sorted(TREES)))
    def commit(self, i, tree):
        job_id = self.pick(self.job_ids, i)
        job = self.world.game.job(job_id)
        prover = TREES[tree]
        r = self.send("commit_tree", job_id, prover, self.world.trainer, value=job.terms.trainer_bond)
        if r is not None:
            self.trees[("trainer", job_id)] = prover

    @rule(i=st.integers(0, 5), who=st.sampled_from(["auditor", "auditor2", "stranger"]), tree=st.sampled_from(sorted(TREES)))
    def challenge(self, i, who, tree):
        job_id = self.pick(self.job_ids, i)
        job = self.world.game.job(job_id)
        r = self.send("challenge_tree", job_id, TREES[tree], getattr(self.world, who), value=job.terms.challenger_bond)
        if r is not None:
            self.game_ids.append(r.value)
            self.trees[("challenger", r.value)] = TREES[tree]

    @rule(i=st.integers(0, 20), tamper=st.sampled_from([None, "child", "pre", "sender", "next"]))
    def move(self, i, tamper):
        game_id = self.pick(self.game_ids, i)
        g = self.world.game.game(game_id)
        if g.status != GameStatus.ACTIVE:  # also a game that does not exist
            self.send("move", game_id, (ZERO, ZERO), (ZERO, ZERO), ZERO, [], self.world.trainer)  # must revert
            return
        trainer = self.world.game.job(g.job_id).trainer
        side = (self.trees[("trainer", g.job_id)], trainer) if g.turn == Side.TRAINER else (self.trees[("challenger", game_id)], g.challenger)
        prover, sender = side
        if tamper is None:
            self.send("move_tree", game_id, prover, sender)
            return
        m = plan_move(g.start, g.end, g.opponent_children, prover)
        children, nxt, pre_leaf = list(m.children), list(m.next), m.pre_leaf
        if tamper == "child":
            children[0] = os.urandom(32)
        elif tamper == "pre":
            pre_leaf = os.urandom(32)
        elif tamper == "sender":
            # Anyone but the side to move (the stranger may itself be this game's challenger).
            sender = next(a for a in (self.world.stranger, self.world.client) if a != sender)
        elif tamper == "next":
            nxt[1] = os.urandom(32)
        r = self.send("move", game_id, children, nxt, pre_leaf, m.pre_proof, sender)
        # Ignored inputs: `next` when the move isolates, `pre` unless it isolates with a proof.
        ignored = (tamper == "next" and m.isolates) or (tamper == "pre" and not m.pre_proof)
        assert r is None or ignored, f"a tampered move ({tamper}) was accepted"

    @rule(i=st.integers(0, 20))
    def honest_move(self, i):
        self.move(i, None)

    @rule(seconds=st.sampled_from([1, 60, 298, 299, 300, 499, 500, 1001]))
    def wait(self, seconds):
        self.clock += seconds

    @rule(i=st.integers(0, 20), who=st.integers(0, 5))
    def timeout(self, i, who):
        self.send("timeout", self.pick(self.game_ids, i), self.actors[who])

    @rule(i=st.integers(0, 20), verdict=st.sampled_from(["honest", "wrong", "stranger"]))
    def resolve(self, i, verdict):
        game_id = self.pick(self.game_ids, i)
        g = self.world.game.game(game_id)
        honest = g.trainer_leaf_hi == TRUTH.leaf(g.hi)
        trainer_wins = honest if verdict != "wrong" else not honest
        sender = self.world.stranger if verdict == "stranger" else self.world.referee
        r = self.send("resolve", game_id, trainer_wins, sender)
        assert r is None or verdict != "stranger", "a stranger resolved a game"

    @rule(i=st.integers(0, 20), who=st.integers(0, 5))
    def refund(self, i, who):
        self.send("refund", self.pick(self.game_ids, i), self.actors[who])

    @rule(i=st.integers(0, 5), who=st.integers(0, 5))
    def finalize(self, i, who):
        self.send("finalize", self.pick(self.job_ids, i), self.actors[who])

    @rule(i=st.integers(0, 20), who=st.integers(0, 5))
    def claim_share(self, i, who):
        self.send("claim_share", self.pick(self.game_ids, i), self.actors[who])

    @rule(who=st.integers(0, 5))
    def withdraw(self, who):
        self.send("withdraw", self.actors[who])

    # -------------------------------------------------------------- invariants

    def check_ledger(self):
        """After every mined transaction (a revert was checked to change no balance): the
        contract holds exactly what it owes, and every credit and job matches the ledger."""
        game = self.world.game
        assert self.balance - self.base_balance == self.ledger.owed()   # read just after the transaction
        for actor in self.actors:
            assert game.credit(actor) == self.ledger.credits[actor], actor
        for job_id in self.job_ids:
            job = game.job(job_id)
            assert (job_id in self.ledger.escrow) == (job.status in (JobStatus.OPEN, JobStatus.COMMITTED))
            open_games = [g for g, x in self.ledger.games.items() if x["job"] == job_id and "outcome" not in x]
            assert job.open_games == len(open_games)


SETTINGS = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


class TestSolvencyFast(GameMachine.TestCase):
    settings = settings(max_examples=6, stateful_step_count=20, **SETTINGS)

# The 200-sequence run is test_game_anvil.py::test_solvency_machine_on_anvil_200: the same
# machine on anvil, ~20x faster per transaction than eth-tester.
