"""Typed binding of the VerificationGame contract: one method per contract function.

Every transaction method takes `sender` (an unlocked node account address, or a local
`eth_account` account whose key signs here and never leaves the process), waits for the receipt
and returns a `TxResult` with the gas used and the decoded events; a revert raises the matching
`protocol.chain.errors.ContractRevert` subclass on every backend. Views return the dataclasses of
`protocol.chain.types`. The `*_tree` helpers drive a game from a `Prover` (the party's own
tree), computing the reveals and proofs from the on-chain state (protocol.chain.bisection).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence, Union

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.contract import Contract

from protocol.chain.connect import is_tester
from protocol.chain.errors import ChainError, RevertDecoder, TransactionError
from protocol.chain.bisection import plan_move
from protocol.chain.prover import Prover
from protocol.chain.types import Event, Game, GameStatus, Job, JobStatus, JobTerms, Side, TxResult, enum_for

Sender = Union[str, LocalAccount]

CONTRACT_NAME = "VerificationGame"
GAS_MARGIN = 1.25  # over eth_estimateGas: storage refunds and the 63/64 rule make estimates tight
TESTER_GAS_CAP = 10_000_000  # well above any VerificationGame call, below eth-tester's block gas limit


def load_artifact(name: str = CONTRACT_NAME):
    """The compiled artifact (compiles contracts/ on first use, cached by source hash)."""
    from protocol.compile import compile_contracts

    return compile_contracts()[name]


def _address(sender: Sender) -> str:
    return sender.address if isinstance(sender, LocalAccount) else Web3.to_checksum_address(sender)


class Transactor:
    """Sends contract transactions and turns reverts into decoded `ChainError`s."""

    def __init__(self, w3: Web3, contract: Contract) -> None:
        self.w3 = w3
        self.contract = contract
        self.decoder = RevertDecoder(contract.abi)

    def call(self, function: str, *args: Any) -> Any:
        try:
            return getattr(self.contract.functions, function)(*args).call()
        except Exception as e:  # noqa: BLE001 - re-raised decoded, or unchanged
            raise self._decoded(e, function) from None

    def send(self, function: str, *args: Any, sender: Sender, value: int = 0) -> TxResult:
        fn = getattr(self.contract.functions, function)(*args)
        params: dict[str, Any] = {"from": _address(sender), "value": value}
        try:
            params["gas"] = self._gas_limit(fn, params)
            if isinstance(sender, LocalAccount):
                params["nonce"] = self.w3.eth.get_transaction_count(sender.address, "pending")
                tx = fn.build_transaction(params)
                tx_hash = self.w3.eth.send_raw_transaction(sender.sign_transaction(tx).raw_transaction)
            else:
                tx_hash = fn.transact(params)
        except Exception as e:  # noqa: BLE001 - re-raised decoded, or unchanged
            raise self._decoded(e, function) from None
        receipt = self.w3.eth.wait_for_transaction_receipt(tx_hash)
        if receipt["status"] != 1:
            raise TransactionError(
                f"VerificationGame.{function} transaction 0x{bytes(tx_hash).hex()} failed in block {receipt['blockNumber']} "
                f"after {receipt['gasUsed']} gas without revert data (out of gas?)"
            )
        return TxResult(
            function=function,
            tx_hash=bytes(tx_hash),
            block_number=receipt["blockNumber"],
            gas_used=receipt["gasUsed"],
            events=self.decode_logs(receipt["logs"]),
        )

    def _gas_limit(self, fn: Any, params: dict) -> int:
        # Both paths execute the call first, on the pending block (whose timestamp is the one
        # the transaction will get, also after time travel), so a revert surfaces with its data
        # instead of being mined. eth-tester's estimate_gas is a binary search over ~15
        # executions, so there one eth_call and a fixed cap are 3x faster.
        if is_tester(self.w3):
            fn.call(params, block_identifier="pending")
            return TESTER_GAS_CAP
        return int(fn.estimate_gas(params, block_identifier="pending") * GAS_MARGIN)

    def decode_logs(self, logs: Sequence[Any]) -> list[Event]:
        events = []
        for log in logs:
            if Web3.to_checksum_address(log["address"]) != self.contract.address:
                continue
            for abi_event in self.contract.events:
                try:
                    decoded = abi_event.process_log(log)
                except Exception:  # noqa: BLE001 - not this event's topic; try the next
                    continue
                events.append(_event(decoded, abi_event.abi))
                break
        return events

    def _decoded(self, exc: Exception, function: str) -> Exception:
        decoded = self.decoder.from_exception(exc, function)
        return decoded if decoded is not None else exc


def _event(decoded: Any, abi: dict) -> Event:
    args = dict(decoded["args"])
    for i in abi["inputs"]:
        enum = enum_for(i.get("internalType"))
        if enum is not None:
            args[i["name"]] = enum(args[i["name"]])
    return Event(name=decoded["event"], args=args, block_number=decoded["blockNumber"], tx_hash=bytes(decoded["transactionHash"]))


class VerificationGame:
    """The deployed VerificationGame at `address` on `w3`."""

    def __init__(self, w3: Web3, address: str, abi: list[dict] | None = None) -> None:
        self.w3 = w3
        self.contract = w3.eth.contract(address=Web3.to_checksum_address(address), abi=abi or load_artifact().abi)
        self.tx = Transactor(w3, self.contract)

    @property
    def address(self) -> str:
        return self.contract.address

    @classmethod
    def deploy(cls, w3: Web3, sender: Sender, artifact=None) -> "VerificationGame":
        """Deploy a fresh VerificationGame from `sender`; returns its binding."""
        art = artifact or load_artifact()
        factory = w3.eth.contract(abi=art.abi, bytecode=art.bytecode)
        params: dict[str, Any] = {"from": _address(sender)}
        try:
            params["gas"] = int(factory.constructor().estimate_gas(params) * GAS_MARGIN)
            if isinstance(sender, LocalAccount):
                params["nonce"] = w3.eth.get_transaction_count(sender.address, "pending")
                tx = factory.constructor().build_transaction(params)
                tx_hash = w3.eth.send_raw_transaction(sender.sign_transaction(tx).raw_transaction)
            else:
                tx_hash = factory.constructor().transact(params)
        except Exception as e:  # noqa: BLE001 - wrap transport/funds errors with context
            raise ChainError(f"deploying {CONTRACT_NAME} from {_address(sender)} failed: {e}") from None
        receipt = w3.eth.wait_for_transaction_receipt(tx_hash)
        if receipt["status"] != 1 or not receipt["contractAddress"]:
            raise TransactionError(f"deploying {CONTRACT_NAME} failed in block {receipt['blockNumber']}")
        return cls(w3, receipt["contractAddress"], art.abi)

    # ------------------------------------------------------------- transactions

    def create_job(self, terms: JobTerms, reward: int, sender: Sender) -> TxResult:
        """Post a job with `reward` wei in escrow; result.value is the job id."""
        r = self.tx.send("createJob", terms.as_tuple(), sender=sender, value=reward)
        return replace(r, value=r.event("JobCreated")["jobId"])

    def cancel_job(self, job_id: int, sender: Sender) -> TxResult:
        return self.tx.send("cancelJob", job_id, sender=sender)

    def commit(
        self, job_id: int, root: bytes, size: int, final_leaf: bytes, final_proof: Sequence[bytes],
        leaf0_proof: Sequence[bytes], sender: Sender, bond: int | None = None,
    ) -> TxResult:  # fmt: skip
        """Commit (root, size) with the proofs of the final leaf and of leaf 0; `bond` defaults to
        the job's trainer bond."""
        value = self.job(job_id).terms.trainer_bond if bond is None else bond
        return self.tx.send(
            "commit", job_id, root, size, final_leaf, list(final_proof), list(leaf0_proof), sender=sender, value=value
        )

    def challenge(
        self, job_id: int, root: bytes, final_leaf: bytes, final_proof: Sequence[bytes], leaf0_proof: Sequence[bytes],
        children: tuple[bytes, bytes], sender: Sender, bond: int | None = None,
    ) -> TxResult:  # fmt: skip
        """Open a game against the job's commitment, revealing the root's `children`; result.value
        is the game id."""
        value = self.job(job_id).terms.challenger_bond if bond is None else bond
        r = self.tx.send(
            "challenge", job_id, root, final_leaf, list(final_proof), list(leaf0_proof), *children, sender=sender,
            value=value,
        )  # fmt: skip
        return replace(r, value=r.event("Challenged")["gameId"])

    def move(
        self, game_id: int, children: tuple[bytes, bytes], next_children: tuple[bytes, bytes], pre_leaf: bytes,
        pre_proof: Sequence[bytes], sender: Sender,
    ) -> TxResult:  # fmt: skip
        """Reveal the own children of the disputed node and of the next one (see the contract's `move`)."""
        return self.tx.send("move", game_id, list(children), list(next_children), pre_leaf, list(pre_proof), sender=sender)

    def timeout(self, game_id: int, sender: Sender) -> TxResult:
        return self.tx.send("timeout", game_id, sender=sender)

    def resolve(self, game_id: int, trainer_wins: bool, sender: Sender) -> TxResult:
        return self.tx.send("resolve", game_id, trainer_wins, sender=sender)

    def refund(self, game_id: int, sender: Sender) -> TxResult:
        return self.tx.send("refund", game_id, sender=sender)

    def finalize(self, job_id: int, sender: Sender) -> TxResult:
        return self.tx.send("finalize", job_id, sender=sender)

    def claim_share(self, game_id: int, sender: Sender) -> TxResult:
        return self.tx.send("claimShare", game_id, sender=sender)

    def withdraw(self, sender: Sender) -> TxResult:
        return self.tx.send("withdraw", sender=sender)

    # ------------------------------------------------------------- driving a game from a tree

    def commit_tree(self, job_id: int, prover: Prover, sender: Sender) -> TxResult:
        last = prover.size - 1
        return self.commit(job_id, prover.root, prover.size, prover.leaf(last), prover.proof(last), prover.proof(0), sender)

    def challenge_tree(self, job_id: int, prover: Prover, sender: Sender) -> TxResult:
        last = prover.size - 1
        return self.challenge(
            job_id, prover.root, prover.leaf(last), prover.proof(last), prover.proof(0), prover.root_children(), sender
        )

    def move_tree(self, game_id: int, prover: Prover, sender: Sender) -> TxResult:
        """Make the next move of `game_id` from `prover`'s tree (the caller must be to move)."""
        g = self.game(game_id)
        return self.move(*plan_move(g.start, g.end, g.opponent_children, prover).args(game_id), sender)

    # ------------------------------------------------------------- views

    def job(self, job_id: int) -> Job:
        """The job (status NONE when it does not exist)."""
        t, client, status, open_games, winners, reward, trainer, committed_at, root, final_leaf = self.tx.call("getJob", job_id)
        return Job(
            job_id=job_id, terms=JobTerms(*t), client=client, status=JobStatus(status), open_games=open_games,
            winners=winners, reward=reward, trainer=trainer, committed_at=committed_at, root=bytes(root),
            final_leaf=bytes(final_leaf),
        )  # fmt: skip

    def game(self, game_id: int) -> Game:
        """The game (status NONE when it does not exist), its clock unpacked."""
        (challenger, job_id, status, claimed, root, start, end, size, clock, node, left, right) = self.tx.call(
            "getGame", game_id
        )
        # Clock layout (contracts/lib/Clock.sol): turn 8 | since 40 | trainerLeft 32 | challengerLeft 32.
        m32, m40 = (1 << 32) - 1, (1 << 40) - 1
        return Game(
            game_id=game_id, challenger=challenger, job_id=job_id, status=GameStatus(status), share_claimed=claimed,
            root=bytes(root), start=start, end=end, size=size, turn=Side(clock >> 104), since=(clock >> 64) & m40,
            trainer_left=(clock >> 32) & m32, challenger_left=clock & m32, node=bytes(node), left=bytes(left),
            right=bytes(right),
        )  # fmt: skip

    def credit(self, account: str) -> int:
        """Wei `account` may withdraw now."""
        return self.tx.call("credits", Web3.to_checksum_address(account))

    def time_left(self, game_id: int) -> tuple[Side, int, int]:
        """(side to move, its seconds left at the latest block, the other side's seconds)."""
        turn, mover_left, other_left = self.tx.call("timeLeft", game_id)
        return Side(turn), mover_left, other_left

    def referee_deadline(self, game_id: int) -> int:
        return self.tx.call("refereeDeadline", game_id)

    def verify_inclusion(self, root: bytes, leaf: bytes, index: int, size: int, proof: Sequence[bytes]) -> bool:
        return self.tx.call("verifyInclusion", root, leaf, index, size, list(proof))

    def job_count(self) -> int:
        return self.tx.call("jobCount")

    def game_count(self) -> int:
        return self.tx.call("gameCount")

    def balance(self) -> int:
        """The contract's ether balance in wei."""
        return self.w3.eth.get_balance(self.address)

    def events(self, from_block: int = 0, to_block: int | str = "latest") -> list[Event]:
        """Every event this contract emitted in the block range, decoded, in chain order."""
        logs = self.w3.eth.get_logs({"address": self.address, "fromBlock": from_block, "toBlock": to_block})
        return self.tx.decode_logs(logs)


def deploy(w3: Web3, sender: Sender) -> VerificationGame:
    """Deploy a VerificationGame; returns its binding."""
    return VerificationGame.deploy(w3, sender)
