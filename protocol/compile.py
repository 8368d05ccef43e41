"""Compile the Solidity sources in `contracts/` offline, with a cache, into Foundry-layout artifacts.

The compiler is the npm WASM build of solc behind `scripts/solc` (py-solc-x cannot download one
here). The settings below are the single source of truth: `hardhat.config.js` reads the same
values from `contracts/compiler.json`, so both tool chains emit identical bytecode.
Artifacts go to `out/<File>.sol/<Contract>.json` with `abi`, `bytecode.object` and
`deployedBytecode.object`, the layout cast, forge and ethers understand.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from vtrain.errors import ToolchainError

REPO_ROOT = Path(__file__).resolve().parent.parent
CONTRACTS_DIR = REPO_ROOT / "contracts"
OUT_DIR = REPO_ROOT / "out"
SOLC_SHIM = REPO_ROOT / "scripts" / "solc"
COMPILER_CONFIG = CONTRACTS_DIR / "compiler.json"

CACHE_FILE = "vtrain-compile-cache.json"


@dataclass(frozen=True)
class Artifact:
    """One compiled contract."""

    source: str  # source unit name, e.g. "contracts/VerificationGame.sol"
    name: str
    abi: list
    bytecode: str  # 0x-prefixed creation code
    deployed_bytecode: str  # 0x-prefixed runtime code


class CompileError(ToolchainError):
    """solc rejected a contract; the message carries its diagnostics."""


def compiler_settings() -> dict:
    """The solc version and settings every tool chain must use (from contracts/compiler.json)."""
    with open(COMPILER_CONFIG) as f:
        return json.load(f)


def _sources(contracts_dir: Path, root: Path) -> dict[str, str]:
    files = sorted(p for p in contracts_dir.rglob("*.sol") if "node_modules" not in p.parts)
    if not files:
        raise CompileError(f"no .sol files under {contracts_dir}")
    return {p.relative_to(root).as_posix(): p.read_text() for p in files}


def _standard_input(sources: dict[str, str], settings: dict) -> dict:
    return {
        "language": "Solidity",
        "sources": {name: {"content": text} for name, text in sources.items()},
        "settings": {
            **settings,
            "outputSelection": {"*": {"*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"]}},
        },
    }


def _solc_binary() -> str:
    if shutil.which("node") is None:
        raise ToolchainError("node is not on PATH: install Node.js 20 (apt-get install nodejs) and run scripts/setup.sh")
    if not (REPO_ROOT / "node_modules" / "solc").is_dir():
        raise ToolchainError("the npm solc compiler is missing: run scripts/setup.sh (it runs npm ci)")
    return str(SOLC_SHIM)


def compile_contracts(
    contracts_dir: Path = CONTRACTS_DIR, out_dir: Path = OUT_DIR, force: bool = False
) -> dict[str, Artifact]:
    """Compile every contract under `contracts_dir`; return artifacts by contract name.

    Recompiles only when the sources or settings changed (keyed by their hash); writes
    `out_dir/<File>.sol/<Contract>.json`. Raises `CompileError` with solc's messages on failure.
    """
    import solcx  # slow import; keep `vtrain --help` fast

    root = contracts_dir.resolve().parent
    config = compiler_settings()
    std_input = _standard_input(_sources(contracts_dir.resolve(), root), config["settings"])
    key = hashlib.sha256(json.dumps([config, std_input], sort_keys=True).encode()).hexdigest()
    cache = out_dir / CACHE_FILE
    if not force and cache.is_file():
        cached = json.loads(cache.read_text())
        if cached.get("key") == key:
            return {name: Artifact(**a) for name, a in cached["artifacts"].items()}

    try:
        output = solcx.compile_standard(std_input, solc_binary=_solc_binary(), allow_paths=[str(root)], base_path=str(root))
    except solcx.exceptions.SolcError as e:
        raise CompileError(f"solc failed to compile {contracts_dir}:\n{e.message if hasattr(e, 'message') else e}") from None

    artifacts: dict[str, Artifact] = {}
    for source, contracts in output["contracts"].items():
        for name, c in contracts.items():
            if name in artifacts:
                raise CompileError(f"two contracts are named {name} ({artifacts[name].source} and {source}): rename one")
            art = Artifact(
                source=source,
                name=name,
                abi=c["abi"],
                bytecode="0x" + c["evm"]["bytecode"]["object"],
                deployed_bytecode="0x" + c["evm"]["deployedBytecode"]["object"],
            )
            artifacts[name] = art
            _write_json(out_dir / Path(source).name / f"{name}.json", {
                "abi": art.abi,
                "bytecode": {"object": art.bytecode},
                "deployedBytecode": {"object": art.deployed_bytecode},
            })
    _write_json(cache, {"key": key, "artifacts": {n: a.__dict__ for n, a in artifacts.items()}})
    return artifacts


def _write_json(path: Path, data: dict) -> None:
    # Atomic: a crash mid-write never leaves a half artifact that a later run trusts.
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
