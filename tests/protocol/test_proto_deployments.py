"""The deployments book: one entry per chain id, checked against the code really deployed there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from protokit import Chain

from protocol.deployments import Deployment, DeploymentError, code_hash, lookup, record


def test_a_recorded_deployment_is_found_and_a_reset_chain_is_caught(tester_chain: Chain, tmp_path: Path) -> None:
    book = tmp_path / "deployments.json"
    w3, address = tester_chain.w3, tester_chain.binding.address
    with pytest.raises(DeploymentError, match=f"no deployment recorded for chain id {w3.eth.chain_id}"):
        lookup(w3, book)
    record(Deployment(w3.eth.chain_id, address, 1, code_hash(w3, address)), book)
    record(Deployment(1, "0x" + "22" * 20, 5, "0x" + "00" * 32), book)  # another chain's entry is kept apart
    assert lookup(w3, book).address == address
    assert set(json.loads(book.read_text())) == {str(w3.eth.chain_id), "1"}

    # The same chain id after a reset (every fresh anvil is 31337): the address holds no such code.
    from protocol.chain import tester_web3

    with pytest.raises(DeploymentError, match="holds other code \\(was the chain reset\\?\\)"):
        lookup(tester_web3(), book)
    book.write_text("{oops")
    with pytest.raises(DeploymentError, match="is not valid JSON"):
        lookup(w3, book)
