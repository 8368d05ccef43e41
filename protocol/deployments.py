"""A small JSON book of where the contract is deployed, per chain id, so later commands find it.

The file maps chain id -> {"address", "block", "code_hash"}. Chain ids are not unique across
resets (every fresh anvil is 31337), so a lookup also checks that the recorded address still holds
the recorded runtime code; a stale entry is reported with what to do rather than used.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from web3 import Web3

from vtrain.errors import VtrainError

DEPLOYMENTS_ENV = "VTRAIN_DEPLOYMENTS"
DEFAULT_FILE = "vtrain-deployments.json"


class DeploymentError(VtrainError):
    """No usable deployment of the contract is recorded for this chain."""


@dataclass(frozen=True)
class Deployment:
    chain_id: int
    address: str  # checksummed
    block: int  # block of deployment: event scans start here
    code_hash: str  # keccak of the runtime code, to detect a reset chain


def default_path() -> Path:
    return Path(os.environ.get(DEPLOYMENTS_ENV, DEFAULT_FILE))


def _read(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError:
        raise DeploymentError(f"deployments file {path} is not valid JSON: fix or delete it, then run `vtrain deploy`") from None
    if not isinstance(data, dict):
        raise DeploymentError(f"deployments file {path} must hold a JSON object keyed by chain id")
    return data


def record(deployment: Deployment, path: Path | None = None) -> None:
    """Add or replace the entry for the deployment's chain id (atomic write)."""
    path = Path(path or default_path())
    data = _read(path)
    data[str(deployment.chain_id)] = {k: v for k, v in asdict(deployment).items() if k != "chain_id"}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)


def lookup(w3: Web3, path: Path | None = None) -> Deployment:
    """The recorded deployment for `w3`'s chain, checked to still be there."""
    path = Path(path or default_path())
    chain_id = w3.eth.chain_id
    entry = _read(path).get(str(chain_id))
    if entry is None:
        raise DeploymentError(f"no deployment recorded for chain id {chain_id} in {path}: run `vtrain deploy` first "
                              f"(or pass --contract ADDRESS)")
    dep = Deployment(chain_id=chain_id, **entry)
    code = bytes(w3.eth.get_code(dep.address))
    if Web3.keccak(code).hex().removeprefix("0x") != dep.code_hash.removeprefix("0x"):
        raise DeploymentError(f"{path} records the contract at {dep.address} on chain {chain_id}, but that address holds "
                              f"other code (was the chain reset?): run `vtrain deploy` again")
    return dep


def code_hash(w3: Web3, address: str) -> str:
    return "0x" + Web3.keccak(bytes(w3.eth.get_code(address))).hex().removeprefix("0x")
