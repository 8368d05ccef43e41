"""Crash safety of agents: state written before sending, resumed after a crash, nothing sent twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from protokit import Chain, Runs, make_job

from protocol.agents.agent import TrainerAgent
from protocol.agents.state import AgentState, AgentStateError
from protocol.chain import JobStatus
from protocol.keys import KEY_ENV, KeyConfigError, load_account, load_keystore, write_keystore
from protocol.roles import Trainer, UnfundedError
from vtrain.run import Run


class Crash(Exception):
    pass


class CrashingState(AgentState):
    """Dies at the n-th save, after writing the file or before (a kill at either side of the fsync)."""

    def __init__(self, path: Path, data: dict, die_at: int, write_first: bool) -> None:
        super().__init__(path, data)
        self.saves, self.die_at, self.write_first = 0, die_at, write_first

    def save(self) -> None:
        self.saves += 1
        if self.saves == self.die_at and not self.write_first:
            raise Crash
        super().save()
        if self.saves == self.die_at:
            raise Crash


def _load(chain: Chain, path: Path) -> AgentState:
    return AgentState.load(path, role="trainer", account=chain.keys["trainer"].address, contract=chain.binding.address,
                           chain_id=chain.w3.eth.chain_id, start_block=0)


@pytest.mark.parametrize("die_at, write_first, mined_before_crash", [(1, True, False), (2, False, True)])
def test_a_commit_interrupted_anywhere_is_sent_exactly_once(tester_chain: Chain, runs: Runs, tmp_path: Path,
                                                            die_at: int, write_first: bool,
                                                            mined_before_crash: bool) -> None:
    """(1, True): killed after journaling the signed commit, before broadcasting it;
    (2, False): killed after it was mined, before its outcome was journaled."""
    job = make_job(tester_chain, runs)
    path = tmp_path / "trainer.json"
    first = _load(tester_chain, path)
    crashing = CrashingState(first.path, first.data, die_at, write_first)
    address = tester_chain.keys["trainer"].address
    with pytest.raises(Crash):
        TrainerAgent(Trainer(tester_chain.binding, tester_chain.keys["trainer"], Run.open(runs.honest),
                             journal=crashing), crashing, job).step()
    assert tester_chain.w3.eth.get_transaction_count(address) == (1 if mined_before_crash else 0)
    signed = json.loads(path.read_text())["txs"][f"commit:{job}"]
    assert "raw" in signed and "result" not in signed  # the signed bytes were on disk before they left

    resumed = _load(tester_chain, path)
    agent = TrainerAgent(Trainer(tester_chain.binding, tester_chain.keys["trainer"], Run.open(runs.honest),
                                 journal=resumed), resumed, job)
    agent.step()
    agent.step()
    assert tester_chain.w3.eth.get_transaction_count(address) == 1  # one transaction in all
    job_view = tester_chain.binding.job(job)
    assert job_view.status == JobStatus.COMMITTED and job_view.trainer == address
    mined = tester_chain.w3.eth.get_transaction_by_block(tester_chain.binding.events()[-1].block_number, 0)
    assert "0x" + bytes(mined["hash"]).hex() == signed["hash"]


def test_a_state_file_of_another_agent_is_refused(tester_chain: Chain, tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    _load(tester_chain, path)
    with pytest.raises(AgentStateError, match="belongs to"):
        AgentState.load(path, role="auditor", account=tester_chain.keys["trainer"].address,
                        contract=tester_chain.binding.address, chain_id=tester_chain.w3.eth.chain_id, start_block=0)
    path.write_text("{not json")
    with pytest.raises(AgentStateError, match="not valid JSON"):
        _load(tester_chain, path)


def test_an_unfunded_key_is_refused_before_signing(tester_chain: Chain, runs: Runs) -> None:
    from eth_account import Account

    job = make_job(tester_chain, runs)
    poor = Account.create()
    with pytest.raises(UnfundedError, match=f"{poor.address} has 0 wei"):
        Trainer(tester_chain.binding, poor, Run.open(runs.honest)).commit(job)
    assert tester_chain.binding.job(job).status == JobStatus.OPEN


def test_keys_from_env_and_keystore_never_show_the_key(tmp_path: Path) -> None:
    from eth_account import Account

    acct = Account.create()
    secret = acct.key.hex().removeprefix("0x")
    assert load_account(env={KEY_ENV: secret}).address == acct.address
    with pytest.raises(KeyConfigError) as e:
        load_account(env={KEY_ENV: secret[:-2] + "zz"})
    assert secret[:16] not in str(e.value) and KEY_ENV in str(e.value)
    with pytest.raises(KeyConfigError, match="no signing key"):
        load_account(env={})
    ks = tmp_path / "key.json"
    write_keystore(acct, ks, "pw")
    assert oct(ks.stat().st_mode & 0o777) == "0o600"
    assert load_keystore(ks, password="pw").address == acct.address
    assert load_keystore(ks, prompt=lambda: "pw").address == acct.address
    with pytest.raises(KeyConfigError, match="wrong password"):
        load_keystore(ks, password="nope")
    with pytest.raises(KeyConfigError, match="needs a password"):
        load_keystore(ks)
