"""The stories on a real anvil with each role's agent in its own process (`vtrain watch`).

The trainer's run is served over HTTP (a static file server), the auditor and the referee fetch it
from there. One agent is killed (SIGKILL) in the middle of its game and started again on the same
state file: it resumes, sends nothing twice, and still wins.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from eth_account import Account
from protokit import CLOCK_RESERVE_S, ETHER, FAULT_STEP, LIAR_STEP, VTRAIN, WINDOW, Chain, Runs, make_job, vtrain_env

from protocol.chain import GameStatus, JobStatus, advance_time
from protocol.roles.network import fund

pytestmark = pytest.mark.anvil


class Agents:
    """`vtrain watch` processes, each with its own key, logging to files under `tmp`."""

    def __init__(self, chain: Chain, tmp: Path) -> None:
        self.chain, self.tmp, self.procs = chain, tmp, {}

    def start(self, name: str, key: Account, *args: str) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "a")
        env = vtrain_env(VTRAIN_PRIVATE_KEY=key.key.hex(), VTRAIN_RPC_URL=self.chain.rpc)
        proc = subprocess.Popen([*VTRAIN, "watch", "--contract", self.chain.binding.address, "--poll", "0.1",
                                 "--state", str(self.tmp / f"{name}.json"), *args], env=env, stdout=log,
                                stderr=subprocess.STDOUT)
        self.procs[name] = proc
        return proc

    def wait(self, *names: str, timeout: float = 90) -> None:
        for n in names:
            try:
                rc = self.procs[n].wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pytest.fail(f"agent {n} did not finish:\n{self.log(n)}")
            assert rc == 0, f"agent {n} exited {rc}:\n{self.log(n)}"

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
                p.wait(timeout=10)


def _until(predicate, timeout: float = 60, what: str = "") -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.mark.slow  # ~35 s: three processes importing torch and web3 on 2 cores
def test_cheater_story_in_processes_with_the_auditor_killed_mid_game(anvil_chain: Chain, runs: Runs,
                                                                       tmp_path: Path, serve) -> None:
    chain = anvil_chain
    job = make_job(chain, runs, clock=CLOCK_RESERVE_S)
    url, _ = serve(runs.cheater, tmp_path)
    agents = Agents(chain, tmp_path)
    try:
        agents.start("referee", chain.keys["referee"], "--role", "referee", "--run", f"{job}={url}")
        agents.start("cheater", chain.keys["cheater"], "--role", "trainer", "--job", str(job), "--run",
                     str(runs.cheater))
        auditor = agents.start("auditor", chain.keys["auditor"], "--role", "auditor", "--job", str(job), "--run", url,
                               "--audit", str(tmp_path / "audit"), "-d", runs.auditor_device)
        # Kill the auditor right after its challenge is mined: the trainer answers, and the game
        # waits for an auditor that is gone.
        _until(lambda: chain.binding.game_count() >= 1, what="the challenge")
        auditor.send_signal(signal.SIGKILL)
        auditor.wait()
        _until(lambda: chain.binding.game(1).turn.name == "CHALLENGER", what="the trainer's first move")
        sent_before = chain.w3.eth.get_transaction_count(chain.keys["auditor"].address)
        assert chain.binding.game(1).status == GameStatus.ACTIVE

        agents.start("auditor", chain.keys["auditor"], "--role", "auditor", "--job", str(job), "--run", url,
                     "--audit", str(tmp_path / "audit"), "-d", runs.auditor_device)
        agents.wait("auditor", "cheater")
    finally:
        agents.stop_all()
    game = chain.binding.game(1)
    assert game.status == GameStatus.CHALLENGER_WON and (game.lo, game.hi) == (FAULT_STEP - 1, FAULT_STEP)
    assert chain.binding.job(job).status == JobStatus.VOID
    # Sent nothing twice: every transaction of the auditor is one distinct journaled action.
    state = json.loads((tmp_path / "auditor.json").read_text())
    sent = chain.w3.eth.get_transaction_count(chain.keys["auditor"].address)
    assert sent == len(state["txs"]) > sent_before >= 1
    assert all(chain.w3.eth.get_transaction_receipt(t["hash"])["status"] == 1 for t in state["txs"].values())
    assert "resolve game 1: step" in agents.log("referee")
    assert chain.binding.credit(chain.keys["auditor"].address) == 0  # bond and share withdrawn
    # Agents answer at once: the trainer used seconds of its clock (the auditor also its downtime).
    assert game.trainer_left > CLOCK_RESERVE_S - 20


@pytest.mark.slow
def test_honest_and_liar_stories_in_processes(anvil_chain: Chain, runs: Runs, tmp_path: Path, serve) -> None:
    chain = anvil_chain
    honest_job, liar_job = make_job(chain, runs, clock=CLOCK_RESERVE_S), make_job(chain, runs, clock=CLOCK_RESERVE_S)
    url, _ = serve(runs.honest, tmp_path)
    second_trainer = Account.create()  # one process per key: two trainers must not share a nonce
    fund(chain.w3, [second_trainer.address], 10 * ETHER)
    agents = Agents(chain, tmp_path)
    try:
        agents.start("referee", chain.keys["referee"], "--role", "referee", "--run", f"{liar_job}={url}")
        agents.start("trainer1", chain.keys["trainer"], "--role", "trainer", "--job", str(honest_job), "--run",
                     str(runs.honest))
        agents.start("trainer3", second_trainer, "--role", "trainer", "--job", str(liar_job), "--run", str(runs.honest))
        agents.start("auditor", chain.keys["auditor"], "--role", "auditor", "--job", str(honest_job), "--run", url,
                     "--audit", str(tmp_path / "audit"), "-d", runs.auditor_device)
        agents.start("liar", chain.keys["liar"], "--role", "auditor", "--job", str(liar_job), "--audit",
                     str(runs.liar))
        agents.wait("auditor", "liar")
        assert "nothing to challenge" in agents.log("auditor")
        _until(lambda: chain.binding.game(1).status == GameStatus.TRAINER_WON, what="the referee's verdict")
        advance_time(chain.w3, WINDOW)  # let the challenge windows close; the trainers finalize
        agents.wait("trainer1", "trainer3")
    finally:
        agents.stop_all()
    assert chain.binding.game(1).hi == LIAR_STEP
    assert chain.binding.job(honest_job).status == chain.binding.job(liar_job).status == JobStatus.FINAL
    assert chain.binding.credit(chain.keys["trainer"].address) == chain.binding.credit(second_trainer.address) == 0
    assert chain.w3.eth.get_balance(second_trainer.address) > 10 * ETHER + 2 * ETHER  # reward + the liar's bond, net of gas
