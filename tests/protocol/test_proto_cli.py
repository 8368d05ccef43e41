"""The chain CLI against a real anvil: deployment through an RPC URL with a locally signed key, cast
reading the job back, and every kind of bad input answered with one clear line and an exit code."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from protokit import CAST, ETHER, FAULT_STEP, REPO, Runs
from eth_account import Account

from protocol.anvil import free_port
from protocol.keys import write_keystore
from protocol.roles import read_audit_leaves as read_leaves
from protocol.roles.network import connect, fund
from vtrain.spec import to_toml



def vt(*args: str, env: dict, input: str | None = None) -> Result:
    """Run `vtrain ARGS` in this process (as the console script would) with `env` as the environment."""
    from protocol.cli import main

    clean = {k: None for k in os.environ if k.startswith("VTRAIN_")}
    return CliRunner().invoke(main, list(args), env={**clean, **env}, input=input, catch_exceptions=False)


def one_clear_line(p: Result) -> str:
    """Failures print exactly one `error:` line on stderr and no traceback."""
    assert "Traceback" not in p.stderr, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    return lines[0]


@pytest.mark.anvil
def test_deploy_create_commit_and_cast_reads_the_job_back(anvil, runs: Runs, tmp_path: Path) -> None:
    w3 = connect(anvil.url)
    deployer, trainer, referee = Account.create(), Account.create(), Account.create()
    fund(w3, [deployer.address, trainer.address], 10 * ETHER)
    deps = tmp_path / "deployments.json"
    env = dict(VTRAIN_PRIVATE_KEY=deployer.key.hex(), VTRAIN_DEPLOYMENTS=str(deps), VTRAIN_RPC_URL=anvil.url)

    p = vt("deploy", "--json", "--chain-id", "31337", env=env)
    assert p.exit_code == 0, p.stderr
    address = json.loads(p.stdout)["address"]
    assert json.loads(deps.read_text())["31337"]["address"] == address
    assert deployer.key.hex().removeprefix("0x") not in p.stdout + p.stderr

    spec = tmp_path / "spec.toml"
    spec.write_text(to_toml(runs.spec))
    p = vt("job", "create", str(spec), "--referee", referee.address, "--reward", "1.5", "--json", env=env)
    assert p.exit_code == 0, p.stderr
    job = json.loads(p.stdout)["job"]
    assert job == 1

    # cast, the Foundry tool, reads the job back from the deployed contract through the same RPC.
    sig = ("getJob(uint256)((bytes32,bytes32,address,uint48,uint32,uint32,uint32,uint96,uint96),address,uint8,uint32,"
           "uint32,uint256,address,uint40,bytes32,bytes32)")
    out = subprocess.run([str(CAST), "call", address, sig, "1", "--rpc-url", anvil.url], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert "0x" + runs.spec.hash.hex() in out
    assert deployer.address in out and referee.address in out
    assert "1500000000000000000" in out  # the escrowed reward

    tenv = {**env, "VTRAIN_PRIVATE_KEY": trainer.key.hex()}
    p = vt("commit", str(runs.honest), "--job", "1", "--json", env=tenv)
    assert p.exit_code == 0, p.stderr
    p = vt("status", "--job", "1", "--json", env=env)
    status = json.loads(p.stdout)
    assert status["status"] == "COMMITTED" and status["trainer"] == trainer.address and status["games"] == []
    p = vt("status", "--job", "1", env=env)
    assert "COMMITTED" in p.stdout and "no games" in p.stdout

    # A second commit is refused before sending (exit 2); a call the contract rejects is sent to
    # estimation, reverts, and its custom error is decoded (exit 3).
    p = vt("commit", str(runs.honest), "--job", "1", env=tenv)
    assert p.exit_code == 2 and "committed, not open" in one_clear_line(p)
    p = vt("job", "finalize", "1", env=tenv)
    assert p.exit_code == 3
    assert "ChallengeWindowOpen(jobId=1" in one_clear_line(p)
    assert w3.eth.get_transaction_count(trainer.address) == 1  # only the commit was ever sent


@pytest.mark.anvil
def test_bad_input_is_one_clear_line(anvil, runs: Runs, tmp_path: Path) -> None:
    w3 = connect(anvil.url)
    rich, poor = Account.create(), Account.create()
    fund(w3, [rich.address], 10 * ETHER)
    deps = tmp_path / "deployments.json"
    env = dict(VTRAIN_PRIVATE_KEY=rich.key.hex(), VTRAIN_DEPLOYMENTS=str(deps), VTRAIN_RPC_URL=anvil.url)

    p = vt("status", "--job", "1", "--chain-id", "1", env=env)
    assert p.exit_code == 2 and "chain id 31337, not 1" in one_clear_line(p)

    p = vt("status", "--job", "1", env=env)
    assert p.exit_code == 2 and "no deployment recorded for chain id 31337" in one_clear_line(p)

    p = vt("deploy", env={**env, "VTRAIN_PRIVATE_KEY": poor.key.hex()})
    assert p.exit_code == 3
    line = one_clear_line(p)
    assert poor.address in line and "fund" in line.lower() or "insufficient funds" in line.lower()
    assert not deps.exists()  # nothing recorded for a deployment that did not happen

    p = vt("deploy", env={k: v for k, v in env.items() if k != "VTRAIN_PRIVATE_KEY"})
    assert p.exit_code == 2 and "no signing key" in one_clear_line(p)

    down = f"http://127.0.0.1:{free_port()}"
    p = vt("status", "--job", "1", "--rpc", down, env=env)
    assert p.exit_code == 3
    assert f"no Ethereum JSON-RPC node answers at {down} after 4 tries" in one_clear_line(p)

    p = vt("commit", str(runs.honest), "--job", "1", "--contract", rich.address, env=env)
    assert p.exit_code == 2 and f"no contract at {rich.address}" in one_clear_line(p)

    p = vt("commit", str(tmp_path / "nowhere"), "--job", "1", env=env)
    assert p.exit_code == 2 and "nowhere: not a run directory" in one_clear_line(p)

    p = vt("job", "create", str(REPO / "examples" / "logreg.toml"), "--referee", "0x123", env=env)
    assert p.exit_code == 2 and "'0x123' is not an address" in p.stderr and "Traceback" not in p.stderr

    # A keystore instead of a raw key: the password from a hidden prompt, or from the environment.
    ks = tmp_path / "key.json"
    write_keystore(rich, ks, "s3cret")
    no_key = {k: v for k, v in env.items() if k != "VTRAIN_PRIVATE_KEY"}
    p = vt("deploy", "--keystore", str(ks), env={**no_key, "VTRAIN_KEYSTORE_PASSWORD": "wrong"})
    assert p.exit_code == 2 and "wrong password" in one_clear_line(p)
    p = vt("deploy", "--keystore", str(ks), "--json", env=no_key, input="s3cret\n")
    assert p.exit_code == 0, p.stderr
    assert "s3cret" not in p.stdout + p.stderr and json.loads(p.stdout)["address"] in deps.read_text()


@pytest.mark.anvil
def test_challenge_resolve_and_withdraw_from_the_command_line(anvil_chain, runs: Runs, tmp_path: Path) -> None:
    """The cheater's job disputed with the one-shot commands; the bisection moves are the agents' job."""
    from protocol.chain import GameStatus, JobStatus
    from protocol.roles import Auditor, Client, Trainer, terms_for
    from vtrain.run import Run

    chain = anvil_chain
    terms = terms_for(runs.spec, referee=chain.keys["referee"].address, challenge_window=3600, clock_per_side=600,
                      referee_window=3600, trainer_bond=ETHER, challenger_bond=ETHER // 2)
    job = Client(chain.binding, chain.keys["client"]).create_job(terms, ETHER)[0]
    Trainer(chain.binding, chain.keys["cheater"], Run.open(runs.cheater)).commit(job)
    env = dict(VTRAIN_RPC_URL=chain.rpc, VTRAIN_DEPLOYMENTS=str(tmp_path / "none.json"))

    def as_(who: str, *args: str) -> Result:
        return vt(*args, "--contract", chain.binding.address, env={**env, "VTRAIN_PRIVATE_KEY": chain.keys[who].key.hex()})

    p = as_("auditor", "challenge", "--job", str(job), "--audit", str(runs.cheater))
    assert p.exit_code == 2 and "nothing to challenge" in one_clear_line(p)  # the cheater's own leaves agree
    p = as_("auditor", "challenge", "--job", str(job), "--audit", str(runs.audit_cheater), "--json")
    assert p.exit_code == 0, p.stderr
    game = json.loads(p.stdout)["game"]
    sides = {"TRAINER": Trainer(chain.binding, chain.keys["cheater"], Run.open(runs.cheater)),
             "CHALLENGER": Auditor(chain.binding, chain.keys["auditor"], read_leaves(runs.audit_cheater))}
    while chain.binding.game(game).status == GameStatus.ACTIVE:
        sides[chain.binding.game(game).turn.name].respond(game)

    p = as_("auditor", "resolve", "--game", str(game), "--run", str(runs.cheater))
    assert p.exit_code == 2 and f"names referee {chain.keys['referee'].address}" in one_clear_line(p)
    p = as_("referee", "resolve", "--game", str(game), "--run", str(runs.cheater), "--json")
    assert p.exit_code == 0, p.stderr
    verdict = json.loads(p.stdout)
    assert verdict["step"] == FAULT_STEP and verdict["trainer_wins"] is False
    assert chain.binding.job(job).status == JobStatus.VOID

    p = as_("auditor", "withdraw", "--claim", str(game), "--json")
    assert p.exit_code == 0, p.stderr
    assert [t["label"] for t in json.loads(p.stdout)["txs"]] == [f"claim share of game {game}",
                                                                 f"withdraw {ETHER // 2 + ETHER} wei"]
    p = as_("auditor", "withdraw")
    assert p.exit_code == 2 and "nothing to withdraw" in one_clear_line(p)
    p = vt("status", "--job", str(job), "--contract", chain.binding.address, "--json", env=env)
    games = json.loads(p.stdout)["games"]
    assert games[0]["status"] == "CHALLENGER_WON" and games[0]["isolated_step"] == FAULT_STEP


@pytest.mark.parametrize("args, message", [
    (["watch", "--role", "trainer", "--state", "s.json"], "--role trainer needs --job"),
    (["watch", "--role", "auditor", "--job", "1", "--state", "s.json"], "needs --run (to audit) or --audit"),
    (["watch", "--role", "referee", "--run", "one=http://x/", "--state", "s.json"], "expected JOB=DIR_OR_URL"),
    (["demo", "--steps", "4", "--fault-step", "9"], "fault steps must lie in 1..4"),
    (["job", "create", "examples/logreg.toml", "--referee", "0x" + "11" * 20, "--reward", "-1"], "not a non-negative"),
    (["status", "--job", "1"], "the embedded chain starts empty in every command"),
])
def test_usage_errors_exit_2_without_a_traceback(args: list[str], message: str, tmp_path: Path) -> None:
    p = vt(*args, env={"VTRAIN_PRIVATE_KEY": Account.create().key.hex()})
    assert p.exit_code == 2 and message in p.stderr and "Traceback" not in p.stderr
