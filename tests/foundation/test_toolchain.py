"""The offline Solidity toolchain: py-solc-x over the npm compiler, the artifact cache, hardhat parity."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from protocol.compile import CONTRACTS_DIR, REPO_ROOT, CompileError, compile_contracts
from vtrain.errors import ToolchainError

GOOD = """// SPDX-License-Identifier: GPL-3.0-or-later
pragma solidity ^0.8.24;
contract Counter { uint256 public n; function bump() external { n += 1; } }
"""


def write_contracts(tmp_path: Path, **files: str) -> Path:
    d = tmp_path / "contracts"
    d.mkdir()
    shutil.copy(CONTRACTS_DIR / "compiler.json", d / "compiler.json")
    for name, text in files.items():
        (d / f"{name}.sol").write_text(text)
    return d


def test_project_contracts_compile_to_foundry_layout(tmp_path):
    artifacts = compile_contracts(out_dir=tmp_path / "out", force=True)
    assert artifacts, "contracts/ holds no contract"
    for art in artifacts.values():
        path = tmp_path / "out" / Path(art.source).name / f"{art.name}.json"
        data = json.loads(path.read_text())
        assert data["abi"] == art.abi
        assert data["bytecode"]["object"] == art.bytecode
        assert data["deployedBytecode"]["object"] == art.deployed_bytecode
        assert art.bytecode.startswith("0x60") or art.bytecode == "0x"


def test_cache_skips_the_compiler_until_a_source_changes(tmp_path, monkeypatch):
    src = write_contracts(tmp_path, Counter=GOOD)
    first = compile_contracts(src, tmp_path / "out")
    import solcx

    def no_compiler(*a, **k):
        raise AssertionError("the compiler ran although nothing changed")

    monkeypatch.setattr(solcx, "compile_standard", no_compiler)
    assert compile_contracts(src, tmp_path / "out") == first
    (src / "Counter.sol").write_text(GOOD.replace("+= 1", "+= 2"))
    with pytest.raises(AssertionError, match="the compiler ran"):
        compile_contracts(src, tmp_path / "out")


def test_compile_error_names_the_file_and_line(tmp_path):
    src = write_contracts(tmp_path, Broken=GOOD.replace("n += 1;", "n += ;"))
    with pytest.raises(CompileError) as info:
        compile_contracts(src, tmp_path / "out")
    assert "contracts/Broken.sol:3" in str(info.value)


def test_missing_node_is_a_clear_toolchain_error(tmp_path, monkeypatch):
    src = write_contracts(tmp_path, Counter=GOOD)
    monkeypatch.setenv("PATH", str(tmp_path))  # no node on PATH
    with pytest.raises(ToolchainError, match="node is not on PATH"):
        compile_contracts(src, tmp_path / "out", force=True)


def test_hardhat_emits_the_same_deployed_bytecode(tmp_path):
    """`npx hardhat compile` (offline, npm solc) and py-solc-x agree byte for byte, metadata included."""
    work = tmp_path / "hh"
    work.mkdir()
    shutil.copytree(CONTRACTS_DIR, work / "contracts")
    for f in ("hardhat.config.js", "package.json"):
        shutil.copy(REPO_ROOT / f, work / f)
    (work / "node_modules").symlink_to(REPO_ROOT / "node_modules")
    env = {**os.environ, "HARDHAT_DISABLE_TELEMETRY_PROMPT": "true"}
    subprocess.run(["npx", "--no-install", "hardhat", "compile", "--quiet"], cwd=work, env=env, check=True,
                   capture_output=True, timeout=180)
    ours = compile_contracts(work / "contracts", work / "out", force=True)
    for art in ours.values():
        hh = json.loads((work / "artifacts" / art.source / f"{art.name}.json").read_text())
        assert hh["deployedBytecode"] == art.deployed_bytecode, art.name
        assert hh["bytecode"] == art.bytecode, art.name


def test_vtrain_help_answers_without_loading_torch_or_web3():
    code = ("import sys; from click.testing import CliRunner; from protocol.cli import main;"
            "r = CliRunner().invoke(main, ['--help']); print(r.output);"
            "assert r.exit_code == 0; assert 'torch' not in sys.modules and 'web3' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "Commands:" in out
