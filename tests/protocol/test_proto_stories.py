"""End-to-end stories on the embedded eth-tester chain: real training, real contract, real agents."""

from __future__ import annotations

import json
from pathlib import Path

from protokit import (CLOCK, ETHER, FAULT_STEP, LIAR_STEP, REFEREE_WINDOW, STEPS, Chain, Runs, auditor_agent, game_end,
                      make_job, referee_agent, trainer_agent)

from protocol.agents.driver import drive
from protocol.chain import EndReason, GameStatus, JobStatus
from protocol.runsource import RunSource

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


def test_auditor_audits_a_served_run_and_wins_against_a_cheater(tester_chain: Chain, runs: Runs, tmp_path: Path,
                                                                serve) -> None:
    """The auditor fetches the cheater's run over HTTP, audits it itself, challenges and wins."""
    job = make_job(tester_chain, runs)
    url, _ = serve(runs.cheater, tmp_path)
    trainer = trainer_agent(tester_chain, tmp_path, "cheater", runs.cheater, job)
    auditor = auditor_agent(tester_chain, tmp_path, "auditor", tmp_path / "audit", job, RunSource(url, tmp_path / "dl"),
                       runs.auditor_device)
    referee = referee_agent(tester_chain, tmp_path, {job: RunSource(url, tmp_path / "ref")})
    drive(tester_chain.w3, [trainer, auditor, referee], [trainer, auditor], CLOCK // 2)
    game_id = auditor.state.notes["game"]
    game = tester_chain.binding.game(game_id)
    assert (game.lo, game.hi) == (FAULT_STEP - 1, FAULT_STEP)
    assert game_end(tester_chain, game_id) == (GameStatus.CHALLENGER_WON, EndReason.REFEREE)
    assert tester_chain.binding.job(job).status == JobStatus.VOID
    assert referee.state.games[str(game_id)]["verdict"]["trainer_wins"] is False
    assert tester_chain.binding.credit(auditor.role.address) == 0  # claimed and withdrawn


def test_a_trainer_that_stops_answering_loses_on_its_clock(tester_chain: Chain, runs: Runs, tmp_path: Path) -> None:
    job = make_job(tester_chain, runs)
    trainer = trainer_agent(tester_chain, tmp_path, "trainer", runs.honest, job)
    liar = auditor_agent(tester_chain, tmp_path, "liar", runs.liar, job)
    for _ in range(2):  # commit, challenge, one move each... then the trainer goes silent
        trainer.tick()
        liar.tick()
    game_id = liar.state.notes["game"]
    assert tester_chain.binding.game(game_id).status == GameStatus.ACTIVE
    drive(tester_chain.w3, [liar], [liar], CLOCK // 3)
    # Even an honest trainer loses a game it does not play: the liar wins on time.
    assert game_end(tester_chain, game_id) == (GameStatus.CHALLENGER_WON, EndReason.TIMEOUT)
    assert tester_chain.binding.job(job).status == JobStatus.VOID


def test_a_referee_that_never_answers_refunds_the_challenger(tester_chain: Chain, runs: Runs, tmp_path: Path) -> None:
    job = make_job(tester_chain, runs)
    trainer = trainer_agent(tester_chain, tmp_path, "cheater", runs.cheater, job)
    auditor = auditor_agent(tester_chain, tmp_path, "auditor", runs.audit_cheater, job)
    before = tester_chain.w3.eth.get_balance(auditor.role.address)
    drive(tester_chain.w3, [trainer, auditor], [trainer, auditor], REFEREE_WINDOW // 2)
    game_id = auditor.state.notes["game"]
    assert tester_chain.binding.game(game_id).hi == FAULT_STEP
    assert game_end(tester_chain, game_id) == (GameStatus.REFUNDED, EndReason.REFEREE_MISSED_DEADLINE)
    spent = before - tester_chain.w3.eth.get_balance(auditor.role.address)
    assert 0 < spent < ETHER // 100  # only gas: the bond came back
    # With no verdict the commitment stands: the trainer's bond was never at stake in a refunded game.
    assert tester_chain.binding.job(job).status == JobStatus.FINAL


def test_two_challengers_one_right_one_lying(tester_chain: Chain, runs: Runs, tmp_path: Path) -> None:
    """A cheater faces an honest auditor and a liar at once: each game isolates its own step, the
    cheater wins the liar's bond (its step LIAR_STEP is honest) and loses its commitment to the auditor."""
    job = make_job(tester_chain, runs)
    trainer = trainer_agent(tester_chain, tmp_path, "cheater", runs.cheater, job)
    auditor = auditor_agent(tester_chain, tmp_path, "auditor", runs.audit_cheater, job)
    liar = auditor_agent(tester_chain, tmp_path, "liar", runs.liar, job)
    referee = referee_agent(tester_chain, tmp_path, {job: RunSource(runs.cheater)})
    drive(tester_chain.w3, [trainer, auditor, liar, referee], [trainer, auditor, liar], CLOCK // 2)
    games = {who: a.state.notes["game"] for who, a in (("auditor", auditor), ("liar", liar))}
    assert set(trainer.state.games) == {str(g) for g in games.values()}
    assert tester_chain.binding.game(games["auditor"]).hi == FAULT_STEP
    assert tester_chain.binding.game(games["liar"]).hi == LIAR_STEP
    assert game_end(tester_chain, games["auditor"])[0] == GameStatus.CHALLENGER_WON
    assert game_end(tester_chain, games["liar"])[0] == GameStatus.TRAINER_WON
    assert tester_chain.binding.job(job).status == JobStatus.VOID
    for agent in (trainer, auditor, liar):  # everyone collected what the contract owed it
        assert tester_chain.binding.credit(agent.role.address) == 0
    # All the contract still holds is the voided job's reward, owed back to the client.
    assert tester_chain.binding.balance() == tester_chain.binding.credit(tester_chain.keys["client"].address) == 2 * ETHER
