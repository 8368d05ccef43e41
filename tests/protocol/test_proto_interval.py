"""Disputes over a run with checkpoint interval k = 4: the game isolates a leaf (an interval of steps),
the referee fetches the state of the leaf before it and the interval's logs, and the honest side wins."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from protokit import (CLOCK, ETHER, REFEREE_WINDOW, REPO, WINDOW, Chain, auditor_agent, game_end, referee_agent,
                      trainer_agent)

from protocol.agents.driver import drive
from protocol.chain import EndReason, GameStatus, JobStatus
from protocol.roles import Client, terms_for
from protocol.runsource import RunSource, RunSourceError, TamperedRunError

K = 4
STEPS = 14        # leaves after steps 0, 4, 8, 12, 14: a tree of 5 leaves
FAULT_STEP = 6    # the cheater's fault, in leaf 2 (steps 5..8)
LIAR_STEP = 2     # where the liar's run goes wrong, in leaf 1 (steps 1..4)


@pytest.fixture(scope="module")
def interval_runs(tmp_path_factory) -> dict:
    import torch

    from vtrain.audit import audit
    from vtrain.devices import list_devices
    from vtrain.faults import parse_fault
    from vtrain.run import Run
    from vtrain.spec import load_spec, to_toml
    from vtrain.train import train

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("interval")
    spec = dataclasses.replace(load_spec(REPO / "examples" / "logreg.toml"), steps=STEPS, checkpoint_interval=K)
    dirs = {"spec": spec}
    for name, fault in (("honest", None), ("cheater", f"{FAULT_STEP}:poison-batch"),
                        ("liar", f"{LIAR_STEP}:poison-batch")):
        dirs[name] = root / name
        train(spec, dirs[name], spec_toml=to_toml(spec), faults=[parse_fault(fault)] if fault else [])
    device = next(d.name for d in list_devices() if d.name.startswith("emu:"))
    report = audit(Run.open(dirs["cheater"]), device, out=root / "audit-cheater")
    assert report.divergence is not None and report.divergence.step == 2
    dirs["audit_cheater"] = root / "audit-cheater"
    return dirs


def test_terms_count_leaves_not_steps(interval_runs: dict) -> None:
    terms = terms_for(interval_runs["spec"], referee="0x" + "11" * 20, challenge_window=WINDOW, clock_per_side=CLOCK,
                      referee_window=REFEREE_WINDOW, trainer_bond=ETHER, challenger_bond=ETHER // 2)
    assert (terms.num_steps, terms.size) == (4, 5)


def test_a_served_interval_run_names_a_tampered_log_and_its_step(interval_runs: dict, tmp_path: Path,
                                                                 serve) -> None:
    url, served = serve(interval_runs["honest"], tmp_path)
    run = RunSource(url, tmp_path / "ok").fetch_for_replay(2)
    assert run.size == 5 and run.steps == STEPS and len(run.step_hashes) == STEPS
    path = served / "logs" / "000007.vlog"
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(TamperedRunError, match=rf"{url}logs/000007.vlog: does not hash to what leaf 2 commits to "
                                               r"\(step 7\)"):
        RunSource(url, tmp_path / "bad").fetch_for_replay(2)
    (served / "steps.bin").unlink()
    with pytest.raises(RunSourceError, match=rf"{url}steps.bin: not found"):
        RunSource(url, tmp_path / "none").open()


def test_a_k4_dispute_isolates_the_interval_and_the_honest_side_wins(tester_chain: Chain, interval_runs: dict,
                                                                     tmp_path: Path, serve) -> None:
    """A cheater faces an honest auditor and a liar: each game isolates the leaf holding its fault, and
    the referee, replaying that interval from the cheater's run served over HTTP, rules for the honest side."""
    runs = interval_runs
    terms = terms_for(runs["spec"], referee=tester_chain.keys["referee"].address, challenge_window=WINDOW,
                      clock_per_side=CLOCK, referee_window=REFEREE_WINDOW, trainer_bond=ETHER,
                      challenger_bond=ETHER // 2)
    job = Client(tester_chain.binding, tester_chain.keys["client"]).create_job(terms, 2 * ETHER)[0]
    url, _ = serve(runs["cheater"], tmp_path)
    trainer = trainer_agent(tester_chain, tmp_path, "cheater", runs["cheater"], job)
    auditor = auditor_agent(tester_chain, tmp_path, "auditor", runs["audit_cheater"], job)
    liar = auditor_agent(tester_chain, tmp_path, "liar", runs["liar"], job)
    referee = referee_agent(tester_chain, tmp_path, {job: RunSource(url, tmp_path / "ref")})
    drive(tester_chain.w3, [trainer, auditor, liar, referee], [trainer, auditor, liar], CLOCK // 2)
    games = {who: a.state.notes["game"] for who, a in (("auditor", auditor), ("liar", liar))}
    assert tester_chain.binding.game(games["auditor"]).hi == 2   # steps 5..8 hold FAULT_STEP
    assert tester_chain.binding.game(games["liar"]).hi == 1      # steps 1..4 hold LIAR_STEP
    assert game_end(tester_chain, games["auditor"]) == (GameStatus.CHALLENGER_WON, EndReason.REFEREE)
    assert game_end(tester_chain, games["liar"]) == (GameStatus.TRAINER_WON, EndReason.REFEREE)
    assert tester_chain.binding.job(job).status == JobStatus.VOID
    verdicts = {g: referee.state.games[str(g)]["verdict"] for g in games.values()}
    assert verdicts[games["auditor"]]["trainer_wins"] is False and verdicts[games["liar"]]["trainer_wins"] is True
    # the referee fetched only what the two intervals need: states of leaves 0 and 1, logs of steps 1..8
    fetched = sorted(p.relative_to(tmp_path / "ref").as_posix() for p in (tmp_path / "ref").rglob("*.v*"))
    assert fetched == ["logs/" + f"{t:06d}.vlog" for t in range(1, 9)] + ["states/000000.vst", "states/000004.vst"]
    assert (tmp_path / "ref" / "steps.bin").is_file()
