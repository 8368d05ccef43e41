"""Shared pieces of the protocol tests: constants, real runs, chains, anvil, and agent builders.

Imported by name (`from protokit import ...`), never through `conftest`, so these tests do not
depend on which directory's conftest module happens to be loaded.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from eth_account import Account

from protocol.agents.agent import AuditorAgent, RefereeAgent, TrainerAgent
from protocol.agents.state import AgentState
from protocol.chain import EndReason, GameStatus
from protocol.roles import Auditor, Client, Referee, Trainer, terms_for
from protocol.runsource import RunSource
from vtrain.run import Run

REPO = Path(__file__).resolve().parents[2]
CAST = REPO / "node_modules" / "@foundry-rs" / "cast-linux-amd64" / "bin" / "cast"
VTRAIN = [str(Path(sys.executable).parent / "vtrain")]
STEPS = 8
FAULT_STEP = 6
LIAR_STEP = 3
ETHER = 10**18
CLOCK_RESERVE_S = 600  # chess-clock seconds per side where real time passes (anvil tests)
CLOCK = 600  # per side, on chains whose clock the tests move
WINDOW = 3600
REFEREE_WINDOW = 1800
ROLES = ("client", "trainer", "cheater", "auditor", "liar", "referee", "anyone")


@dataclass(frozen=True)
class Runs:
    spec: object
    honest: Path  # the trainer's run
    cheater: Path  # the same spec with FAULT_STEP:poison-batch
    liar: Path  # with LIAR_STEP:poison-batch (a lying auditor's leaves)
    audit_honest: Path  # an auditor's replay of `honest` on an emulated device
    audit_cheater: Path  # and of `cheater`
    auditor_device: str


def train_runs(root: Path) -> Runs:
    """Really train the three runs of a small spec and audit two of them on an emulated device."""
    import torch

    from vtrain.audit import audit
    from vtrain.devices import list_devices
    from vtrain.faults import parse_fault
    from vtrain.spec import load_spec, to_toml
    from vtrain.train import train

    torch.set_num_threads(1)
    spec = dataclasses.replace(load_spec(REPO / "examples" / "logreg.toml"), steps=STEPS)
    dirs = {}
    for name, fault in (("honest", None), ("cheater", f"{FAULT_STEP}:poison-batch"), ("liar", f"{LIAR_STEP}:poison-batch")):
        dirs[name] = root / name
        train(spec, dirs[name], spec_toml=to_toml(spec), faults=[parse_fault(fault)] if fault else [])
    device = next(d.name for d in list_devices() if d.name.startswith("emu:"))
    for name in ("honest", "cheater"):
        audit(Run.open(dirs[name]), device, out=root / f"audit-{name}")
    return Runs(spec, dirs["honest"], dirs["cheater"], dirs["liar"], root / "audit-honest", root / "audit-cheater", device)


@dataclass
class Chain:
    """A chain with the contract deployed and one funded local key per role."""

    w3: object
    binding: object
    keys: dict  # role name -> LocalAccount
    rpc: str | None


def make_chain(w3, rpc: str | None) -> Chain:  # noqa: ANN001
    from protocol.chain import deploy
    from protocol.roles.network import fund

    keys = {name: Account.create() for name in ROLES}
    fund(w3, [k.address for k in keys.values()], 100 * ETHER)
    return Chain(w3, deploy(w3, keys["client"]), keys, rpc)


def vtrain_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VTRAIN_")}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


# ---------------------------------------------------------------- agents in this process


def make_job(chain: Chain, runs: Runs, clock: int = CLOCK) -> int:
    client = Client(chain.binding, chain.keys["client"])
    terms = terms_for(runs.spec, referee=chain.keys["referee"].address, challenge_window=WINDOW, clock_per_side=clock,
                      referee_window=REFEREE_WINDOW, trainer_bond=ETHER, challenger_bond=ETHER // 2)
    return client.create_job(terms, 2 * ETHER)[0]


def agent_state(chain: Chain, tmp: Path, who: str) -> AgentState:
    return AgentState.load(tmp / f"{who}.json", role=who, account=chain.keys[who].address,
                           contract=chain.binding.address, chain_id=chain.w3.eth.chain_id, start_block=0)


def trainer_agent(chain: Chain, tmp: Path, who: str, run: Path, job: int) -> TrainerAgent:
    st = agent_state(chain, tmp, who)
    return TrainerAgent(Trainer(chain.binding, chain.keys[who], Run.open(run), journal=st), st, job)


def auditor_agent(chain: Chain, tmp: Path, who: str, audit_dir: Path, job: int, source: RunSource | None = None,
                  device: str = "cpu") -> AuditorAgent:
    st = agent_state(chain, tmp, who)
    return AuditorAgent(Auditor(chain.binding, chain.keys[who], journal=st), st, job, audit_dir, source, device)


def referee_agent(chain: Chain, tmp: Path, sources: dict) -> RefereeAgent:
    st = agent_state(chain, tmp, "referee")
    return RefereeAgent(Referee(chain.binding, chain.keys["referee"], journal=st), st, sources)


def game_end(chain: Chain, game_id: int) -> tuple[GameStatus, EndReason]:
    """(outcome, reason) of the one GameEnded event of `game_id`."""
    ev = [e for e in chain.binding.events() if e.name == "GameEnded" and e["gameId"] == game_id]
    assert len(ev) == 1
    return ev[0]["outcome"], ev[0]["reason"]
