"""The whole protocol in three stories, on a real chain with real training (what `vtrain demo` runs).

1. honest:  a client posts a job; a trainer trains and commits; an auditor on another device
            replays the run, finds the same root and does not challenge; after the window the
            trainer is paid its bond and the reward.
2. cheater: a trainer commits a run with a fault injected at one step; the auditor's replay
            diverges there; it challenges, the two bisect on-chain down to one step, the referee
            replays that step and rules for the auditor, who gets its bond back plus the trainer's.
3. liar:    an auditor challenges an honest trainer with leaves of a corrupted run; the bisection
            isolates the step where its run went wrong, the referee's replay agrees with the
            trainer, and the liar's bond goes to the trainer.

Every role is a separate key and an agent of protocol.agents (the code `vtrain watch` runs), ticked
in turn in this process; when a full round of agents has nothing to send, the chain clock is moved
on (windows and clocks are minutes long, the demo takes seconds). `run_demo` returns a summary:
per story the transactions with their gas and the time split into training, auditing, on-chain
moves and the referee's replay, and the fault step next to the step the game isolated. With a
spec whose checkpoint_interval k > 1 a game isolates a leaf, the interval holding the fault step
(`fault_leaf`), and the referee replays that interval.
"""

from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from eth_account import Account

from protocol.agents.agent import AuditorAgent, Log, RefereeAgent, TrainerAgent, quiet
from protocol.agents.driver import drive
from protocol.agents.state import AgentState
from protocol.chain import GameStatus, deploy
from protocol.roles import Auditor, Client, Referee, SentTx, Trainer, terms_for
from protocol.roles.network import connect, fund
from protocol.runsource import RunSource
from vtrain.errors import VtrainError
from vtrain.intervals import Intervals

if TYPE_CHECKING:  # torch-free at import: the CLI lists commands without loading the engine
    from vtrain.run import Run
    from vtrain.spec import Spec

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = REPO_ROOT / "examples" / "logreg.toml"
ETHER = 10**18

Narrate = Log


class DemoError(VtrainError):
    """The demo's story did not go as the protocol promises (a bug, reported with what happened)."""


@dataclass(frozen=True)
class DemoOptions:
    spec: Path = DEFAULT_SPEC  # the example to train (its steps are overridden by `steps`)
    steps: int = 24  # training steps of every run in the demo
    fault_step: int | None = None  # the cheater's faulty step (default: 2/3 of the way)
    liar_step: int | None = None  # where the liar's leaves go wrong (default: 1/3 of the way)
    fault_kind: str = "poison-batch"
    trainer_device: str = "cpu"
    auditor_device: str | None = None  # default: the first emulated device
    referee_device: str = "cpu"
    rpc: str | None = None  # None: an embedded eth-tester chain
    workdir: Path = Path("demo-runs")  # git-ignored in this repository
    challenge_window: int = 3600
    clock_per_side: int = 1800
    referee_window: int = 3600


@dataclass
class Story:
    name: str
    job_id: int = 0
    outcome: str = ""
    txs: list[dict] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=lambda: {"training": 0.0, "auditing": 0.0, "onchain": 0.0,
                                                                 "replay": 0.0, "total": 0.0})
    fault_step: int | None = None
    isolated_step: int | None = None

    @property
    def gas(self) -> int:
        return sum(t["gas"] for t in self.txs)

    def as_dict(self) -> dict:
        return {"name": self.name, "job": self.job_id, "outcome": self.outcome, "gas": self.gas, "txs": self.txs,
                "seconds": {k: round(v, 3) for k, v in self.seconds.items()}, "fault_step": self.fault_step,
                "isolated_step": self.isolated_step}


class _Stage:
    """The chain, the contract, one funded key per role, the client and the referee's agent.

    Every transaction a role sends is recorded in the current story (for its gas) and the agents'
    log lines are narrated under their role's name.
    """

    ROLES = ("client", "trainer", "cheater", "auditor", "liar", "referee")

    def __init__(self, options: DemoOptions, spec: "Spec", work: Path, narrate: Narrate) -> None:
        self.options, self.work, self.narrate = options, work, narrate
        self.w3 = connect(options.rpc)
        self.chain = "embedded eth-tester chain" if options.rpc is None else options.rpc
        narrate(f"chain: {self.chain} (chain id {self.w3.eth.chain_id}); spec {options.spec.name}, {spec.steps} steps")
        deployer = Account.create()
        fund(self.w3, [deployer.address], 10 * ETHER)
        self.binding = deploy(self.w3, deployer)
        self.accounts = {name: Account.create() for name in self.ROLES}
        fund(self.w3, [a.address for a in self.accounts.values()], 100 * ETHER)
        narrate(f"VerificationGame deployed at {self.binding.address}; roles: "
                + ", ".join(f"{k} {a.address[:10]}…" for k, a in self.accounts.items()))
        self.story: Story | None = None
        self.client = self.role(Client, "client")
        self.terms = terms_for(spec, referee=self.accounts["referee"].address, challenge_window=options.challenge_window,
                               clock_per_side=options.clock_per_side, referee_window=options.referee_window,
                               trainer_bond=ETHER, challenger_bond=ETHER // 2)
        self.sources: dict[int, RunSource] = {}  # job -> where the referee reads the trainer's run
        self.referee_state = self.agent_state("referee")
        self.referee = RefereeAgent(self.role(Referee, "referee", state=self.referee_state), self.referee_state,
                                    self.sources, options.referee_device, log=self.log_as("referee"))

    def role(self, cls: type, who: str, *args: Any, state: AgentState | None = None) -> Any:
        return cls(self.binding, self.accounts[who], *args, journal=state, on_sent=self._on_sent(who))

    def agent_state(self, who: str, job_id: int | None = None) -> AgentState:
        name = who if job_id is None else f"{who}-job{job_id}"
        return AgentState.load(self.work / "agents" / f"{name}.json", role=who, account=self.accounts[who].address,
                               contract=self.binding.address, chain_id=self.w3.eth.chain_id,
                               start_block=self.w3.eth.block_number)

    def log_as(self, who: str) -> Narrate:
        return lambda m: self.narrate(f"  [{who:>8}] {m.split(': ', 1)[-1]}")

    def _on_sent(self, who: str) -> Callable[[SentTx], None]:
        def record(tx: SentTx) -> None:
            if self.story is not None:
                self.story.txs.append({"role": who, "label": tx.label, "gas": tx.gas_used, "hash": tx.hash})
            if who == "client":  # the agents narrate their own transactions
                self.narrate(f"  [{who:>8}] {tx.label} (gas {tx.gas_used})")
        return record

    def play(self, story: Story, title: str, trainer_who: str, run_dir: Path, auditor_who: str,
             audit_dir: Path) -> None:
        """Post a job and let the trainer, the auditor and the referee settle it; fill in `story`."""
        self.story = story
        t0 = time.perf_counter()
        replay_before = _replay_seconds(self.referee_state)
        self.narrate(f"\n== {title}")
        story.job_id, _ = self.client.create_job(self.terms, 2 * ETHER)
        self.sources[story.job_id] = RunSource(run_dir)
        t_state = self.agent_state(trainer_who, story.job_id)
        trainer = TrainerAgent(self.role(Trainer, trainer_who, _open_run(run_dir), state=t_state), t_state,
                               story.job_id, log=self.log_as(trainer_who))
        a_state = self.agent_state(auditor_who, story.job_id)
        auditor = AuditorAgent(self.role(Auditor, auditor_who, state=a_state), a_state, story.job_id, audit_dir,
                               log=self.log_as(auditor_who))
        drive(self.w3, [trainer, auditor, self.referee], [trainer, auditor], self.options.challenge_window,
              on_advance=lambda s: self.narrate(f"  [   chain] {s} s pass"))
        games = [self.binding.game(int(g)) for g in t_state.games]
        story.isolated_step = next((g.hi for g in games if g.hi - g.lo == 1), None)
        ends = ", ".join(f"{_ENDINGS.get(g.status, g.status.name)} game {g.game_id}" for g in games) or "no game"
        story.outcome = f"{self.binding.job(story.job_id).status.name}, {ends}"
        self.narrate(f"  outcome: {story.outcome}")
        sec = story.seconds
        sec["replay"] = _replay_seconds(self.referee_state) - replay_before
        sec["onchain"] = time.perf_counter() - t0 - sec["replay"]
        sec["total"] = sec["training"] + sec["auditing"] + sec["onchain"] + sec["replay"]
        self.story = None


_ENDINGS = {GameStatus.TRAINER_WON: "trainer won", GameStatus.CHALLENGER_WON: "challenger won",
            GameStatus.REFUNDED: "refunded"}


def _train(spec: "Spec", out: Path, device: str, fault: str | None) -> float:
    from vtrain.faults import parse_fault
    from vtrain.spec import to_toml
    from vtrain.train import train

    t0 = time.perf_counter()
    train(spec, out, spec_toml=to_toml(spec), device=device, faults=[parse_fault(fault)] if fault else [])
    return time.perf_counter() - t0


def _audit(run_dir: Path, device: str, out: Path) -> tuple[float, str]:
    from vtrain.audit import audit

    t0 = time.perf_counter()
    report = audit(_open_run(run_dir), device, out=out)
    return time.perf_counter() - t0, "MATCH" if report.matched else str(report.divergence)


def run_demo(options: DemoOptions = DemoOptions(), narrate: Narrate = quiet) -> dict:
    """Run the three stories; return the summary (see the module docstring)."""
    from vtrain.devices import list_devices
    from vtrain.spec import load_spec

    t_start = time.perf_counter()
    spec = dataclasses.replace(load_spec(options.spec), steps=options.steps)
    fault_step = options.fault_step or max(1, 2 * options.steps // 3)
    liar_step = options.liar_step or max(1, options.steps // 3)
    intervals = Intervals(spec.steps, spec.checkpoint_interval)
    auditor_device = options.auditor_device or next(d.name for d in list_devices() if d.name.startswith("emu:"))
    work = Path(options.workdir)
    for sub in ("runs", "audits", "agents"):
        # A fresh story each time: an earlier demo's runs may have other faults, its agents another contract.
        shutil.rmtree(work / sub, ignore_errors=True)
    stage = _Stage(options, spec, work, narrate)

    stories = {name: Story(name) for name in ("honest", "cheater", "liar")}
    stories["cheater"].fault_step, stories["liar"].fault_step = fault_step, liar_step
    runs = {name: work / "runs" / name for name in stories}
    narrate(f"\ntraining on {options.trainer_device}: the honest run, the cheater's with {fault_step}:"
            f"{options.fault_kind}, the liar's with {liar_step}:{options.fault_kind}")
    for name, st in stories.items():
        fault = None if st.fault_step is None else f"{st.fault_step}:{options.fault_kind}"
        st.seconds["training"] = _train(spec, runs[name], options.trainer_device, fault)
    for name in ("honest", "cheater"):  # the liar audits nothing: it challenges with its corrupted run's leaves
        stories[name].seconds["auditing"], verdict = _audit(runs[name], auditor_device, work / "audits" / name)
        narrate(f"  auditor on {auditor_device}: the {name} run -> {verdict}")

    stage.play(stories["honest"], "Story 1: an honest trainer is paid", "trainer", runs["honest"], "auditor",
               work / "audits" / "honest")
    stage.play(stories["cheater"], f"Story 2: a cheating trainer (fault at step {fault_step}) is caught", "cheater",
               runs["cheater"], "auditor", work / "audits" / "cheater")
    stage.play(stories["liar"], f"Story 3: a lying auditor (wrong from step {liar_step}) loses its bond", "trainer",
               runs["honest"], "liar", runs["liar"])
    if stage.client.credit() > 0:  # the voided job's reward came back to the client
        narrate("")
        stage.client.withdraw()
    summary = {
        "chain": stage.chain, "chain_id": stage.w3.eth.chain_id, "contract": stage.binding.address,
        "spec": str(options.spec), "steps": spec.steps, "auditor_device": auditor_device,
        "referee_device": options.referee_device, "fault_step": fault_step,
        "isolated_step": stories["cheater"].isolated_step, "liar_step": liar_step,
        "liar_isolated_step": stories["liar"].isolated_step, "stories": [s.as_dict() for s in stories.values()],
        "checkpoint_interval": spec.checkpoint_interval, "fault_leaf": intervals.leaf_of(fault_step),
        "liar_leaf": intervals.leaf_of(liar_step),
        "balances_wei": {k: stage.w3.eth.get_balance(a.address) - 100 * ETHER for k, a in stage.accounts.items()},
        "seconds": round(time.perf_counter() - t_start, 3),
    }
    _check(summary)
    return summary


def _open_run(path: Path) -> "Run":
    from vtrain.run import Run

    return Run.open(path)


def _replay_seconds(state: AgentState) -> float:
    return sum(g.get("verdict", {}).get("seconds", 0.0) for g in state.games.values())


def _check(summary: dict) -> None:
    """The demo states what the protocol promises; a story that ends otherwise is a bug, not a demo."""
    outcomes = {s["name"]: s["outcome"] for s in summary["stories"]}
    expect = {"honest": "FINAL, no game", "cheater": "VOID, challenger won", "liar": "FINAL, trainer won"}
    for name, prefix in expect.items():
        if not outcomes[name].startswith(prefix):
            raise DemoError(f"story {name} ended as {outcomes[name]!r}, expected {prefix}…")
    if summary["isolated_step"] != summary["fault_leaf"] or summary["liar_isolated_step"] != summary["liar_leaf"]:
        raise DemoError(f"the games isolated leaves {summary['isolated_step']} and {summary['liar_isolated_step']}, "
                        f"but the faults are at steps {summary['fault_step']} and {summary['liar_step']}, in leaves "
                        f"{summary['fault_leaf']} and {summary['liar_leaf']}")
