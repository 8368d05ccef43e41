"""Reaching a chain: the embedded eth-tester chain or a JSON-RPC URL, with retries on a flaky link.

A node that does not answer is retried with exponential back-off (web3's HTTP retry for reads,
and here for the first contact), then reported as one clear `ChainUnavailableError` naming the
URL. Local chains (eth-tester, anvil) have funded, unlocked accounts; `fund` uses them to give
fresh local keys ether, which is how the demo and the tests get one key per role.
"""

from __future__ import annotations

from typing import Iterable

import requests
from web3 import Web3
from web3.providers.rpc.utils import REQUEST_RETRY_ALLOWLIST, ExceptionRetryConfiguration

from protocol.chain import tester_web3
from protocol.chain.errors import ChainError

RPC_ENV = "VTRAIN_RPC_URL"


class ChainUnavailableError(ChainError):
    """The JSON-RPC node cannot be reached (after retries)."""


class WrongChainError(ChainError):
    """The node is on another chain than the one asked for."""


def connect(rpc: str | None, *, retries: int = 3, backoff_s: float = 0.2, timeout_s: float = 10.0,
            expect_chain_id: int | None = None) -> Web3:
    """A Web3 on `rpc` (None: a fresh embedded eth-tester chain), checked to answer."""
    if rpc is None:
        return tester_web3()
    if not rpc.startswith(("http://", "https://")):
        raise ChainUnavailableError(f"--rpc {rpc!r} is not an http(s):// URL")
    retries = max(1, retries)  # web3's retry loop does not make even one request with 0
    # Resending the same signed bytes is idempotent (same hash), so raw sends may be retried too.
    retry = ExceptionRetryConfiguration(errors=(requests.ConnectionError, requests.HTTPError, requests.Timeout),
                                        retries=retries, backoff_factor=backoff_s,
                                        method_allowlist=[*REQUEST_RETRY_ALLOWLIST, "eth_sendRawTransaction",
                                                          "eth_getLogs"])
    w3 = Web3(Web3.HTTPProvider(rpc, request_kwargs={"timeout": timeout_s}, exception_retry_configuration=retry))
    try:
        chain_id = w3.eth.chain_id  # retried by the provider with back-off
    except Exception as e:  # noqa: BLE001 - any transport failure means the node is not there
        raise ChainUnavailableError(f"no Ethereum JSON-RPC node answers at {rpc} after {retries + 1} tries "
                                    f"({e.__class__.__name__}); is it running? (`vtrain node` starts one)") from None
    if expect_chain_id is not None and chain_id != expect_chain_id:
        raise WrongChainError(f"the node at {rpc} is on chain id {chain_id}, not {expect_chain_id}: "
                              f"check --rpc / --chain-id")
    return w3


def fund(w3: Web3, addresses: Iterable[str], wei: int) -> None:
    """Send `wei` to each address from the node's first unlocked account (local chains only)."""
    nodes = w3.eth.accounts
    if not nodes:
        raise ChainError("this node has no unlocked accounts to fund keys from: fund them yourself "
                         "(the demo needs eth-tester or a local anvil)")
    hashes = [w3.eth.send_transaction({"from": nodes[0], "to": a, "value": wei}) for a in addresses]
    for h in hashes:
        w3.eth.wait_for_transaction_receipt(h)
