"""Getting the trainer's run from a directory or an HTTP server: every file checked, a bad one named."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from protokit import LIAR_STEP, STEPS, WINDOW, Chain, Runs, auditor_agent, make_job, referee_agent, trainer_agent

from protocol.agents.driver import drive
from protocol.chain import GameStatus
from protocol.runsource import RunSource, RunSourceError, TamperedRunError, check_commitment
from vtrain.run import Run


def _flip_byte(path: Path, at: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))


def test_a_served_run_is_fetched_and_checked(runs: Runs, tmp_path: Path, serve) -> None:
    url, served = serve(runs.honest, tmp_path)
    source = RunSource(url, tmp_path / "cache")
    run = source.fetch_for_audit()
    honest = Run.open(runs.honest)
    assert run.root == honest.root and run.size == STEPS + 1
    check_commitment(run, honest.root, honest.size, honest.spec_hash)
    assert source.fetch_for_replay(4).read_state(3) == honest.read_state(3)

    _flip_byte(served / "logs" / "000005.vlog")
    with pytest.raises(TamperedRunError, match=rf"{url}logs/000005.vlog: does not hash to what leaf 5 commits to"):
        RunSource(url, tmp_path / "cache2").fetch_for_audit()
    (served / "states" / "000003.vst").unlink()
    with pytest.raises(RunSourceError, match=rf"{url}states/000003.vst: not found \(HTTP 404\)"):
        RunSource(url, tmp_path / "cache3").fetch_for_replay(4)
    assert not (tmp_path / "cache2" / "logs" / "000005.vlog").exists()  # a bad copy is not kept


def test_a_run_directory_with_a_bad_file_is_named(runs: Runs, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(runs.honest, copy)
    _flip_byte(copy / "states" / "000002.vst", 40)
    with pytest.raises(TamperedRunError, match=r"states/000002.vst: does not hash to what leaf 2 commits to"):
        RunSource(copy).fetch_leaves([2])
    with pytest.raises(RunSourceError, match="does not exist"):
        RunSource(tmp_path / "missing")
    other = Run.open(runs.cheater)
    with pytest.raises(TamperedRunError, match="leaves.bin: its Merkle root"):
        check_commitment(Run.open(runs.honest), other.root, other.size)


def test_the_referee_rules_against_a_trainer_whose_files_contradict_its_commitment(
        tester_chain: Chain, runs: Runs, tmp_path: Path, serve) -> None:
    """An honest trainer that serves a corrupted log of the disputed step loses: it must serve what it committed."""
    job = make_job(tester_chain, runs)
    url, served = serve(runs.honest, tmp_path)
    _flip_byte(served / "logs" / f"{LIAR_STEP:06d}.vlog")
    trainer = trainer_agent(tester_chain, tmp_path, "trainer", runs.honest, job)
    liar = auditor_agent(tester_chain, tmp_path, "liar", runs.liar, job)
    referee = referee_agent(tester_chain, tmp_path, {job: RunSource(url, tmp_path / "ref")})
    drive(tester_chain.w3, [trainer, liar, referee], [trainer, liar], WINDOW)
    game_id = liar.state.notes["game"]
    assert tester_chain.binding.game(game_id).status == GameStatus.CHALLENGER_WON
    reason = referee.state.games[str(game_id)]["verdict"]["reason"]
    assert f"logs/{LIAR_STEP:06d}.vlog: does not hash to what leaf {LIAR_STEP} commits to" in reason


def test_a_referee_without_the_data_does_not_judge(tester_chain: Chain, runs: Runs, tmp_path: Path, serve) -> None:
    """Missing data is not evidence: the referee keeps the game open (and retries) instead of guessing."""
    job = make_job(tester_chain, runs)
    url, served = serve(runs.honest, tmp_path)
    (served / "states" / f"{LIAR_STEP - 1:06d}.vst").unlink()
    logs: list[str] = []
    trainer = trainer_agent(tester_chain, tmp_path, "trainer", runs.honest, job)
    liar = auditor_agent(tester_chain, tmp_path, "liar", runs.liar, job)
    referee = referee_agent(tester_chain, tmp_path, {job: RunSource(url, tmp_path / "ref")})
    referee.log = logs.append
    for _ in range(6):
        for agent in (trainer, liar, referee):
            agent.tick()
    game_id = liar.state.notes["game"]
    assert tester_chain.binding.game(game_id).status == GameStatus.ISOLATED
    assert any(f"states/{LIAR_STEP - 1:06d}.vst: not found (HTTP 404)" in m for m in logs)
