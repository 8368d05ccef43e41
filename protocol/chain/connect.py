"""Connecting to a chain and steering its clock, the same way on eth-tester and on anvil.

Tests and the demo run on the embedded eth-tester chain; anvil (or any JSON-RPC node) is reached
by URL. Time travel and snapshots differ per backend (eth-tester's Python API vs anvil's `evm_*`
RPC methods); the functions here hide that so test and agent code is backend-independent.
"""

from __future__ import annotations

from web3 import EthereumTesterProvider, Web3

from protocol.chain.errors import ChainError


def tester_web3() -> Web3:
    """A Web3 on a fresh embedded eth-tester chain (py-evm), with ten funded, unlocked accounts."""
    return Web3(EthereumTesterProvider())


tester_web3.__test__ = False  # named test*, but not a test: stop pytest collecting it where imported


def rpc_web3(url: str, timeout: float = 30.0) -> Web3:
    """A Web3 on the JSON-RPC node at `url` (anvil, hardhat, a testnet); checks that it answers."""
    w3 = Web3(Web3.HTTPProvider(url, request_kwargs={"timeout": timeout}))
    try:
        w3.eth.chain_id
    except Exception as e:  # noqa: BLE001 - any transport failure means the same to the user
        raise ChainError(f"no Ethereum JSON-RPC node answers at {url}: {e}. Start one with `vtrain node`.") from None
    return w3


def is_tester(w3: Web3) -> bool:
    return isinstance(w3.provider, EthereumTesterProvider)


def latest_timestamp(w3: Web3) -> int:
    """Timestamp of the latest mined block."""
    return w3.eth.get_block("latest")["timestamp"]


def set_next_timestamp(w3: Web3, timestamp: int) -> None:
    """Make the next mined block (the next transaction) carry `timestamp` (must not go back)."""
    if is_tester(w3):
        w3.provider.ethereum_tester.time_travel(timestamp)
    else:
        w3.provider.make_request("evm_setNextBlockTimestamp", [timestamp])


def advance_time(w3: Web3, seconds: int) -> int:
    """Let `seconds` pass after the latest block and mine one block then; returns its timestamp."""
    target = latest_timestamp(w3) + seconds
    set_next_timestamp(w3, target)
    mine(w3)
    return target


def mine(w3: Web3, blocks: int = 1) -> None:
    if is_tester(w3):
        w3.provider.ethereum_tester.mine_blocks(blocks)
    else:
        w3.provider.make_request("anvil_mine", [hex(blocks)])


def snapshot(w3: Web3) -> object:
    """Save the chain state; `revert(w3, snap)` returns to it."""
    if is_tester(w3):
        return w3.provider.ethereum_tester.take_snapshot()
    return w3.provider.make_request("evm_snapshot", [])["result"]


def revert(w3: Web3, snap: object) -> None:
    if is_tester(w3):
        w3.provider.ethereum_tester.revert_to_snapshot(snap)
    elif not w3.provider.make_request("evm_revert", [snap]).get("result"):
        raise ChainError(f"the node refused to revert to snapshot {snap}")
