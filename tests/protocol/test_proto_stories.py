"""End-to-end stories on the embedded eth-tester chain: real training, real contract, real agents."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import ETHER, FAULT_STEP, LIAR_STEP, STEPS, Chain, Runs

from protocol.agents.agent import AuditorAgent, RefereeAgent, TrainerAgent
from protocol.agents.driver import drive
from protocol.agents.state import AgentState
from protocol.chain import EndReason, GameStatus, JobStatus
from protocol.roles import Auditor, Client, Referee, Trainer, terms_for
from protocol.runsource import RunSource
from vtrain.run import Run

CLOCK = 600
WINDOW = 3600
REFEREE_WINDOW = 1800


def test_demo_runs_the_three_stories(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from protocol.cli import main

    args = ["demo", "--json", "--steps", str(STEPS), "--fault-step", str(FAULT_STEP), "--liar-step", str(LIAR_STEP),
            "--workdir", str(tmp_path)]
    result = CliRunner().invoke(main, args, env={"VTRAIN_RPC_URL": None}, catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["fault_step"] == summary["isolated_step"] == FAULT_STEP
    assert summary["liar_step"] == summary["liar_isolated_step"] == LIAR_STEP
    outcomes = [s["outcome"] for s in summary["stories"]]
    assert outcomes == ["FINAL, no game", "VOID, challenger won game 1", "FINAL, trainer won game 2"]
    bal = summary["balances_wei"]
    # Net of gas (< 0.01 ether each): the honest trainer earned two rewards and the liar's bond,
    # the auditor the cheater's bond, the liar and the cheater lost theirs, the client paid two rewards.
    gas = ETHER // 100
    assert 4.5 * ETHER - gas < bal["trainer"] < 4.5 * ETHER
    assert 1 * ETHER - gas < bal["auditor"] < 1 * ETHER
    assert -0.5 * ETHER - gas < bal["liar"] < -0.5 * ETHER
    assert -1 * ETHER - gas < bal["cheater"] < -1 * ETHER
    assert -4 * ETHER - gas < bal["client"] < -4 * ETHER
    resolutions = [t["label"] for s in summary["stories"] for t in s["txs"] if t["role"] == "referee"]
    assert resolutions == [f"resolve game 1: step {FAULT_STEP}, challenger wins",
                           f"resolve game 2: step {LIAR_STEP}, trainer wins"]
    for s in summary["stories"]:
        assert s["gas"] == sum(t["gas"] for t in s["txs"]) > 0
        assert set(s["seconds"]) == {"training", "auditing", "onchain", "replay", "total"}


def _job(chain: Chain, runs: Runs) -> int:
    client = Client(chain.binding, chain.keys["client"])
    terms = terms_for(runs.spec, referee=chain.keys["referee"].address, challenge_window=WINDOW, clock_per_side=CLOCK,
                      referee_window=REFEREE_WINDOW, trainer_bond=ETHER, challenger_bond=ETHER // 2)
    return client.create_job(terms, 2 * ETHER)[0]


def _state(chain: Chain, tmp: Path, who: str) -> AgentState:
    return AgentState.load(tmp / f"{who}.json", role=who, account=chain.keys[who].address,
                           contract=chain.binding.address, chain_id=chain.w3.eth.chain_id, start_block=0)


def _trainer(chain: Chain, tmp: Path, who: str, run: Path, job: int) -> TrainerAgent:
    st = _state(chain, tmp, who)
    return TrainerAgent(Trainer(chain.binding, chain.keys[who], Run.open(run), journal=st), st, job)


def _auditor(chain: Chain, tmp: Path, who: str, audit_dir: Path, job: int, source: RunSource | None = None,
             device: str = "cpu") -> AuditorAgent:
    st = _state(chain, tmp, who)
    return AuditorAgent(Auditor(chain.binding, chain.keys[who], journal=st), st, job, audit_dir, source, device)


def _referee(chain: Chain, tmp: Path, sources: dict) -> RefereeAgent:
    st = _state(chain, tmp, "referee")
    return RefereeAgent(Referee(chain.binding, chain.keys["referee"], journal=st), st, sources)


def _ended(chain: Chain, game_id: int) -> tuple[GameStatus, EndReason]:
    ev = [e for e in chain.binding.events() if e.name == "GameEnded" and e["gameId"] == game_id]
    assert len(ev) == 1
    return ev[0]["outcome"], ev[0]["reason"]


def test_auditor_audits_a_served_run_and_wins_against_a_cheater(tester_chain: Chain, runs: Runs, tmp_path: Path,
                                                                serve) -> None:
    """The auditor fetches the cheater's run over HTTP, audits it itself, challenges and wins."""
    job = _job(tester_chain, runs)
    url, _ = serve(runs.cheater, tmp_path)
    trainer = _trainer(tester_chain, tmp_path, "cheater", runs.cheater, job)
    auditor = _auditor(tester_chain, tmp_path, "auditor", tmp_path / "audit", job, RunSource(url, tmp_path / "dl"),
                       runs.auditor_device)
    referee = _referee(tester_chain, tmp_path, {job: RunSource(url, tmp_path / "ref")})
    drive(tester_chain.w3, [trainer, auditor, referee], [trainer, auditor], CLOCK // 2)
    game_id = auditor.state.notes["game"]
    game = tester_chain.binding.game(game_id)
    assert (game.lo, game.hi) == (FAULT_STEP - 1, FAULT_STEP)
    assert _ended(tester_chain, game_id) == (GameStatus.CHALLENGER_WON, EndReason.REFEREE)
    assert tester_chain.binding.job(job).status == JobStatus.VOID
    assert referee.state.games[str(game_id)]["verdict"]["trainer_wins"] is False
    assert tester_chain.binding.credit(auditor.role.address) == 0  # claimed and withdrawn


def test_a_trainer_that_stops_answering_loses_on_its_clock(tester_chain: Chain, runs: Runs, tmp_path: Path) -> None:
    job = _job(tester_chain, runs)
    trainer = _trainer(tester_chain, tmp_path, "trainer", runs.honest, job)
    liar = _auditor(tester_chain, tmp_path, "liar", runs.liar, job)
    for _ in range(2):  # commit, challenge, one move each... then the trainer goes silent
        trainer.tick()
        liar.tick()
    game_id = liar.state.notes["game"]
    assert tester_chain.binding.game(game_id).status == GameStatus.ACTIVE
    drive(tester_chain.w3, [liar], [liar], CLOCK // 3)
    # Even an honest trainer loses a game it does not play: the liar wins on time.
    assert _ended(tester_chain, game_id) == (GameStatus.CHALLENGER_WON, EndReason.TIMEOUT)
    assert tester_chain.binding.job(job).status == JobStatus.VOID


def test_a_referee_that_never_answers_refunds_the_challenger(tester_chain: Chain, runs: Runs, tmp_path: Path) -> None:
    job = _job(tester_chain, runs)
    trainer = _trainer(tester_chain, tmp_path, "cheater", runs.cheater, job)
    auditor = _auditor(tester_chain, tmp_path, "auditor", runs.audit_cheater, job)
    before = tester_chain.w3.eth.get_balance(auditor.role.address)
    drive(tester_chain.w3, [trainer, auditor], [trainer, auditor], REFEREE_WINDOW // 2)
    game_id = auditor.state.notes["game"]
    assert tester_chain.binding.game(game_id).hi == FAULT_STEP
    assert _ended(tester_chain, game_id) == (GameStatus.REFUNDED, EndReason.REFEREE_MISSED_DEADLINE)
    spent = before - tester_chain.w3.eth.get_balance(auditor.role.address)
    assert 0 < spent < ETHER // 100  # only gas: the bond came back
    # With no verdict the commitment stands: the trainer's bond was never at stake in a refunded game.
    assert tester_chain.binding.job(job).status == JobStatus.FINAL
