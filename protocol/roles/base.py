"""What every role shares: an account acting on one deployed VerificationGame.

A role reads the contract through the typed binding of `protocol.chain` (views, events, custom
error decoding) and sends through its own `Transactor` (local signing, at most once per action
with a journal). Calls anyone may make — timeout, refund, finalize, claimShare, withdraw — live
here, so every agent can end a game its opponent abandoned and collect what it is owed.
"""

from __future__ import annotations

from typing import Any, Callable

from eth_account.signers.local import LocalAccount

from protocol.chain import Game, GameStatus, Job, JobStatus, VerificationGame
from protocol.roles.tx import Journal, SentTx, Transactor
from vtrain.errors import VtrainError


class RoleError(VtrainError):
    """A role was asked to do something the job or game does not allow (checked before sending)."""


class Role:
    """`account` acting on the deployed contract `binding`."""

    def __init__(self, binding: VerificationGame, account: LocalAccount, *, journal: Journal | None = None,
                 on_sent: Callable[[SentTx], None] | None = None) -> None:
        self.binding = binding
        self.w3 = binding.w3
        self.contract = binding.contract
        self.tx = Transactor(binding.w3, account, binding.tx.decoder.from_exception, journal, on_sent=on_sent)

    @property
    def address(self) -> str:
        return self.tx.address

    # ---------------------------------------------------------------- views

    def job(self, job_id: int) -> Job:
        job = self.binding.job(job_id)
        if job.status == JobStatus.NONE:
            raise RoleError(f"job {job_id} does not exist on contract {self.binding.address}")
        return job

    def game(self, game_id: int) -> Game:
        game = self.binding.game(game_id)
        if game.status == GameStatus.NONE:
            raise RoleError(f"game {game_id} does not exist on contract {self.binding.address}")
        return game

    def games_of_job(self, job_id: int, challenger: str | None = None, from_block: int = 0) -> list[int]:
        """Ids of the games challenging job `job_id` (optionally by one challenger), from Challenged events."""
        filters: dict[str, Any] = {"jobId": job_id}
        if challenger is not None:
            filters["challenger"] = challenger
        logs = self.contract.events.Challenged.get_logs(from_block=from_block, argument_filters=filters)
        return sorted({int(log["args"]["gameId"]) for log in logs})

    def credit(self, account: str | None = None) -> int:
        return int(self.binding.credit(account or self.address))

    def now(self) -> int:
        """The chain's clock: the latest block's timestamp."""
        return int(self.w3.eth.get_block("latest")["timestamp"])

    # ---------------------------------------------------------------- calls anyone may make

    def timeout(self, game_id: int) -> SentTx:
        return self._send("timeout", game_id, label=f"timeout game {game_id}", key=f"timeout:{game_id}")

    def refund(self, game_id: int) -> SentTx:
        return self._send("refund", game_id, label=f"refund game {game_id}", key=f"refund:{game_id}")

    def finalize(self, job_id: int) -> SentTx:
        return self._send("finalize", job_id, label=f"finalize job {job_id}", key=f"finalize:{job_id}")

    def claim_share(self, game_id: int) -> SentTx:
        return self._send("claimShare", game_id, label=f"claim share of game {game_id}", key=f"claim:{game_id}")

    def withdraw(self) -> SentTx:
        amount = self.credit()
        if amount == 0:
            raise RoleError(f"{self.address} has no credit on contract {self.binding.address}: nothing to withdraw")
        # Keyed by the account's mined nonce: after a crash, a withdrawal still in flight has the
        # same key (and is awaited); once it is mined the credit is zero and nothing is re-sent.
        nonce = self.w3.eth.get_transaction_count(self.address)
        return self._send("withdraw", label=f"withdraw {amount} wei", key=f"withdraw:{nonce}")

    def _send(self, fn_name: str, *args: Any, label: str, key: str | None = None, value: int = 0) -> SentTx:
        return self.tx.send(getattr(self.contract.functions, fn_name)(*args), label=label, key=key, value=value)


def ended(status: GameStatus) -> bool:
    return status >= GameStatus.TRAINER_WON

