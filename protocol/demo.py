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
moves and the referee's replay, and the fault step next to the step the game isolated.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from eth_account import Account
from web3 import Web3

from protocol.agents.agent import AuditorAgent, RefereeAgent, TrainerAgent
from protocol.agents.driver import drive
from protocol.agents.state import AgentState
from protocol.chain import GameStatus, VerificationGame, deploy
from protocol.roles import Auditor, Client, Referee, SentTx, Trainer, terms_for
from protocol.roles.network import connect, fund
from protocol.runsource import RunSource
from vtrain.errors import VtrainError

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SPEC = REPO_ROOT / "examples" / "logreg.toml"
ETHER = 10**18

Narrate = Callable[[str], None]


def _silent(_: str) -> None:
    pass


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
    workdir: Path = Path("vtrain-demo")
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


class _Cast:
    """The demo's accounts and role objects; every transaction is reported to the current story."""

    ROLES = ("client", "trainer", "cheater", "auditor", "liar", "referee")

    def __init__(self, w3: Web3, binding: VerificationGame, narrate: Narrate) -> None:
        self.w3, self.binding, self.narrate = w3, binding, narrate
        self.accounts = {name: Account.create() for name in self.ROLES}
        self.story: Story | None = None

    def on_sent(self, who: str) -> Callable[[SentTx], None]:
        def record(tx: SentTx) -> None:
            if self.story is not None:
                self.story.txs.append({"role": who, "label": tx.label, "gas": tx.gas_used, "hash": tx.hash})
            if who == "client":  # the agents narrate their own transactions
                self.narrate(f"  [{who:>8}] {tx.label} (gas {tx.gas_used})")
        return record

    def role(self, cls: type, who: str, *args, state: AgentState | None = None):  # noqa: ANN001
        return cls(self.binding, self.accounts[who], *args, journal=state, on_sent=self.on_sent(who))


def _train(spec, out: Path, device: str, fault: str | None) -> float:  # noqa: ANN001
    from vtrain.faults import parse_fault
    from vtrain.spec import to_toml
    from vtrain.train import train

    t0 = time.perf_counter()
    train(spec, out, spec_toml=to_toml(spec), device=device, faults=[parse_fault(fault)] if fault else [])
    return time.perf_counter() - t0


def run_demo(options: DemoOptions = DemoOptions(), narrate: Narrate = _silent) -> dict:
    """Run the three stories; return the summary (see the module docstring)."""
    from vtrain.devices import list_devices
    from vtrain.spec import load_spec

    t_start = time.perf_counter()
    spec = dataclasses.replace(load_spec(options.spec), steps=options.steps)
    fault_step = options.fault_step or max(1, 2 * options.steps // 3)
    liar_step = options.liar_step or max(1, options.steps // 3)
    auditor_device = options.auditor_device or next(d.name for d in list_devices() if d.name.startswith("emu:"))
    work = Path(options.workdir)
    work.mkdir(parents=True, exist_ok=True)

    w3 = connect(options.rpc)
    chain = "embedded eth-tester chain" if options.rpc is None else options.rpc
    narrate(f"chain: {chain} (chain id {w3.eth.chain_id}); spec {options.spec.name} with {spec.steps} steps")
    deployer = Account.create()
    fund(w3, [deployer.address], 10 * ETHER)
    binding = deploy(w3, deployer)
    cast = _Cast(w3, binding, narrate)
    fund(w3, [a.address for a in cast.accounts.values()], 100 * ETHER)
    narrate(f"VerificationGame deployed at {binding.address}; roles: "
            + ", ".join(f"{k} {a.address[:10]}…" for k, a in cast.accounts.items()))

    client = cast.role(Client, "client")
    referee_state = AgentState.load(work / "agents" / "referee.json", role="referee",
                                    account=cast.accounts["referee"].address, contract=binding.address,
                                    chain_id=w3.eth.chain_id, start_block=w3.eth.block_number)
    sources: dict[int, RunSource] = {}
    referee = RefereeAgent(cast.role(Referee, "referee", state=referee_state), referee_state, sources,
                           options.referee_device, log=lambda m: narrate(f"  [ referee] {m.removeprefix('referee: ')}"))
    terms = terms_for(spec, referee=cast.accounts["referee"].address, challenge_window=options.challenge_window,
                      clock_per_side=options.clock_per_side, referee_window=options.referee_window,
                      trainer_bond=ETHER, challenger_bond=ETHER // 2)

    def agent_state(who: str, job_id: int) -> AgentState:
        return AgentState.load(work / "agents" / f"{who}-job{job_id}.json", role=who,
                               account=cast.accounts[who].address, contract=binding.address,
                               chain_id=w3.eth.chain_id, start_block=w3.eth.block_number)

    def log_as(who: str) -> Narrate:
        return lambda m: narrate(f"  [{who:>8}] {m.split(': ', 1)[-1]}")

    def story(name: str, title: str, trainer_who: str, run_dir: Path, auditor_who: str, audit_dir: Path,
              train_s: float, audit_s: float) -> Story:
        st = Story(name)
        cast.story = st
        t0 = time.perf_counter()
        narrate(f"\n== {title}")
        st.job_id, _ = client.create_job(terms, 2 * ETHER)
        sources[st.job_id] = RunSource(run_dir)
        replay_before = _replay_seconds(referee_state)
        t_state = agent_state(trainer_who, st.job_id)
        trainer = TrainerAgent(cast.role(Trainer, trainer_who, _open_run(run_dir), state=t_state), t_state, st.job_id,
                               log=log_as(trainer_who))
        a_state = agent_state(auditor_who, st.job_id)
        auditor = AuditorAgent(cast.role(Auditor, auditor_who, state=a_state), a_state, st.job_id, audit_dir,
                               log=log_as(auditor_who))
        drive(w3, [trainer, auditor, referee], [trainer, auditor], options.challenge_window,
              on_advance=lambda s: narrate(f"  [   chain] {s} s pass"))
        job = binding.job(st.job_id)
        games = [binding.game(int(g)) for g in t_state.games]
        st.isolated_step = next((g.hi for g in games if g.hi - g.lo == 1), None)
        winners = {GameStatus.TRAINER_WON: "trainer won", GameStatus.CHALLENGER_WON: "challenger won",
                   GameStatus.REFUNDED: "refunded"}
        ends = ", ".join(f"{winners.get(g.status, g.status.name)} game {g.game_id}" for g in games) or "no game"
        st.outcome = f"{job.status.name}, {ends}"
        narrate(f"  outcome: {st.outcome}")
        st.seconds.update(training=train_s, auditing=audit_s, replay=_replay_seconds(referee_state) - replay_before)
        onchain = time.perf_counter() - t0 - st.seconds["replay"]
        st.seconds["onchain"] = onchain
        st.seconds["total"] = train_s + audit_s + onchain + st.seconds["replay"]
        return st

    from vtrain.audit import audit

    def do_audit(run_dir: Path, out: Path) -> tuple[float, object]:
        t0 = time.perf_counter()
        report = audit(_open_run(run_dir), auditor_device, out=out)
        return time.perf_counter() - t0, report

    narrate(f"\ntraining: honest run on {options.trainer_device}, cheater's run with {fault_step}:{options.fault_kind}, "
            f"liar's run with {liar_step}:{options.fault_kind}")
    honest_dir, cheat_dir, liar_dir = work / "runs" / "honest", work / "runs" / "cheater", work / "runs" / "liar"
    t_honest = _train(spec, honest_dir, options.trainer_device, None)
    t_cheat = _train(spec, cheat_dir, options.trainer_device, f"{fault_step}:{options.fault_kind}")
    t_liar = _train(spec, liar_dir, options.trainer_device, f"{liar_step}:{options.fault_kind}")
    narrate(f"  trained 3 runs of {spec.steps} steps in {t_honest:.1f} s, {t_cheat:.1f} s, {t_liar:.1f} s")

    a_honest_s, rep = do_audit(honest_dir, work / "audits" / "honest")
    narrate(f"  auditor on {auditor_device}: honest run -> {'MATCH' if rep.matched else rep.divergence}")
    a_cheat_s, rep_c = do_audit(cheat_dir, work / "audits" / "cheater")
    narrate(f"  auditor on {auditor_device}: cheater's run -> {rep_c.divergence or 'MATCH'}")

    stories = [
        story("honest", "Story 1: an honest trainer is paid", "trainer", honest_dir, "auditor",
              work / "audits" / "honest", t_honest, a_honest_s),
        story("cheater", f"Story 2: a cheating trainer (fault at step {fault_step}) is caught", "cheater", cheat_dir,
              "auditor", work / "audits" / "cheater", t_cheat, a_cheat_s),
        # The liar "audits" nothing: it challenges with the leaves of its own corrupted run.
        story("liar", f"Story 3: a lying auditor (wrong from step {liar_step}) loses its bond", "trainer", honest_dir,
              "liar", liar_dir, t_liar, 0.0),
    ]
    stories[1].fault_step, stories[2].fault_step = fault_step, liar_step
    cast.story = None
    if client.credit() > 0:  # the voided job's reward came back to the client
        narrate(f"\n  [  client] {client.withdraw().label}")
    summary = {
        "chain": chain, "chain_id": w3.eth.chain_id, "contract": binding.address, "spec": str(options.spec),
        "steps": spec.steps, "auditor_device": auditor_device, "referee_device": options.referee_device,
        "fault_step": fault_step, "isolated_step": stories[1].isolated_step,
        "liar_step": liar_step, "liar_isolated_step": stories[2].isolated_step,
        "stories": [s.as_dict() for s in stories],
        "balances_wei": {k: w3.eth.get_balance(a.address) - 100 * ETHER for k, a in cast.accounts.items()},
        "seconds": round(time.perf_counter() - t_start, 3),
    }
    _check(summary)
    return summary


def _open_run(path: Path):  # noqa: ANN202
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
    if summary["isolated_step"] != summary["fault_step"] or summary["liar_isolated_step"] != summary["liar_step"]:
        raise DemoError(f"the games isolated steps {summary['isolated_step']} and {summary['liar_isolated_step']}, "
                        f"but the faults are at {summary['fault_step']} and {summary['liar_step']}")
