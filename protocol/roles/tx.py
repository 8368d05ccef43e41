"""Sending a contract call as a locally signed transaction, at most once per action.

Every role signs with its own key and sends raw transactions, so nothing depends on the node
holding accounts (anvil's defaults, a testnet RPC). With a journal (an agent's state file), the
signed bytes are written to disk *before* they are broadcast under a key naming the action
("move:game=3:hi=17"); a restarted agent that meets the same action again rebroadcasts the same
bytes or waits for their receipt, so one action is never paid for twice. A call that would revert
is caught at gas estimation and raised as the contract's decoded custom error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Protocol

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.exceptions import TimeExhausted

from protocol.chain.errors import ChainError, TransactionError
from vtrain.errors import VtrainError


class UnfundedError(ChainError):
    """The sending account cannot pay for the value and gas of a transaction."""


class Journal(Protocol):
    """Where an agent keeps its signed transactions (protocol.agents.state.AgentState)."""

    txs: dict[str, dict]

    def save(self) -> None: ...


@dataclass(frozen=True)
class SentTx:
    label: str  # what the transaction did, e.g. "commit job 1"
    hash: str
    gas_used: int
    block: int
    status: int  # 1 success, 0 reverted


# (exception, contract function name) -> the decoded custom error, or None (protocol.chain.errors)
Decoder = Callable[[BaseException, str], BaseException | None]


class Transactor:
    """Signs and sends contract calls for one account; waits for their receipts."""

    def __init__(self, w3: Web3, account: LocalAccount, decode: Decoder, journal: Journal | None = None,
                 receipt_timeout_s: float = 120.0, on_sent: Callable[[SentTx], None] | None = None) -> None:
        self.w3 = w3
        self.account = account
        self.decode = decode
        self.journal = journal
        self.receipt_timeout_s = receipt_timeout_s
        self.on_sent = on_sent  # observer for narration and gas accounting (demo, benchmarks)
        self._chain_id: int | None = None

    @property
    def address(self) -> str:
        return self.account.address

    def send(self, fn: Any, *, label: str, value: int = 0, key: str | None = None) -> SentTx:
        """Send `fn` (a bound web3 ContractFunction) with `value` wei; return its mined result.

        Raises the decoded custom error when the call would revert, `TransactionError` when it reverted
        after being mined. With a journal and a `key`, an action already sent is not sent again.
        """
        if self.journal is not None and key is not None and key in self.journal.txs:
            entry = self.journal.txs[key]
            if "result" in entry:
                return SentTx(**entry["result"])
            return self._complete(entry, key, fn, value)
        tx = self._build(fn, value, label)
        signed = self.account.sign_transaction(tx)
        entry = {"label": label, "nonce": tx["nonce"], "raw": "0x" + bytes(signed.raw_transaction).hex(),
                 "hash": "0x" + bytes(signed.hash).hex()}
        if self.journal is not None and key is not None:
            self.journal.txs[key] = entry
            self.journal.save()  # before the bytes leave the process
        return self._complete(entry, key, fn, value)

    def call(self, fn: Any, label: str) -> Any:
        """A read-only call, with the contract's errors decoded."""
        try:
            return fn.call({"from": self.address})
        except Exception as e:  # noqa: BLE001 - web3 and the backends raise many types; decode what we can
            raise self._decoded(e, fn.fn_name, label) from None

    def _build(self, fn: Any, value: int, label: str) -> dict:
        if self._chain_id is None:
            self._chain_id = self.w3.eth.chain_id
        params = {"from": self.address, "value": value, "chainId": self._chain_id,
                  "nonce": self.w3.eth.get_transaction_count(self.address, "pending")}
        try:
            tx = fn.build_transaction(params)  # estimates gas: a reverting call fails here, before signing
        except Exception as e:  # noqa: BLE001
            decoded = self.decode(e, fn.fn_name)
            if decoded is None and any(s in str(e).lower() for s in ("insufficient funds", "cannot afford")):
                raise self._unfunded(label, value) from None
            raise self._decoded(e, fn.fn_name, label) from None
        # Estimation is exact on these chains but state may move between estimate and inclusion
        # (another side's move in the same block); a margin keeps a valid call from running out.
        tx["gas"] = int(tx["gas"] * 1.25) + 10_000
        fee = tx["gas"] * tx.get("maxFeePerGas", tx.get("gasPrice", 0))
        if self.w3.eth.get_balance(self.address) < value + fee:
            raise self._unfunded(label, value + fee)
        return tx

    def _unfunded(self, label: str, need: int) -> UnfundedError:
        have = self.w3.eth.get_balance(self.address)
        return UnfundedError(f"{label}: account {self.address} has {have} wei, not enough for the value "
                             f"({need} wei) and gas: fund it first")

    def _complete(self, entry: dict, key: str | None, fn: Any, value: int) -> SentTx:
        receipt = self._receipt(entry["hash"])
        if receipt is None:
            try:
                self.w3.eth.send_raw_transaction(entry["raw"])
            except Exception as e:  # noqa: BLE001
                # Already in the pool (a rebroadcast after a restart) is fine; anything else is not,
                # unless the transaction was mined meanwhile.
                if self._receipt(entry["hash"]) is None and "known" not in str(e).lower():
                    if "nonce" in str(e).lower():
                        self._forget(key)
                        raise TransactionError(f"{entry['label']}: transaction {entry['hash']} was replaced or dropped "
                                               f"(its nonce {entry['nonce']} is used); the action will be re-evaluated") from None
                    raise self._decoded(e, fn.fn_name, entry["label"]) from None
            try:
                receipt = self.w3.eth.wait_for_transaction_receipt(entry["hash"], timeout=self.receipt_timeout_s,
                                                                   poll_latency=0.05)
            except TimeExhausted:
                raise TransactionError(f"{entry['label']}: transaction {entry['hash']} not mined after "
                                       f"{self.receipt_timeout_s:.0f} s; it is kept and will be awaited again") from None
        result = SentTx(label=entry["label"], hash=entry["hash"], gas_used=int(receipt["gasUsed"]),
                          block=int(receipt["blockNumber"]), status=int(receipt["status"]))
        if self.journal is not None and key is not None:
            entry["result"] = asdict(result)
            entry.pop("raw", None)  # done: the bytes are no longer needed
            self.journal.save()
        if self.on_sent is not None:
            self.on_sent(result)
        if result.status != 1:
            raise self._revert_reason(fn, value, result)
        return result

    def _receipt(self, tx_hash: str) -> Any:
        try:
            return self.w3.eth.get_transaction_receipt(tx_hash)
        except Exception as e:  # noqa: BLE001 - "not found" is an exception type that differs by backend
            if "not found" in str(e).lower() or e.__class__.__name__ in ("TransactionNotFound",):
                return None
            raise

    def _forget(self, key: str | None) -> None:
        if self.journal is not None and key is not None:
            self.journal.txs.pop(key, None)
            self.journal.save()

    def _revert_reason(self, fn: Any, value: int, result: SentTx) -> BaseException:
        # Re-run the call on the state before its block to learn which custom error it hit.
        try:
            fn.call({"from": self.address, "value": value}, block_identifier=result.block - 1)
        except Exception as e:  # noqa: BLE001
            err = self._decoded(e, fn.fn_name, result.label)
            return TransactionError(f"{result.label}: transaction {result.hash} reverted in block {result.block}: {err}")
        return TransactionError(f"{result.label}: transaction {result.hash} reverted in block {result.block}")

    def _decoded(self, e: BaseException, function: str, label: str) -> BaseException:
        decoded = self.decode(e, function)
        if decoded is not None:
            return decoded
        if isinstance(e, VtrainError):
            return e
        return TransactionError(f"{label}: {e.__class__.__name__}: {e}")

