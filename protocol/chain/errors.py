"""Chain errors: every VerificationGame custom error as a Python exception with decoded arguments.

Reverts reach Python differently per backend (eth-tester raises `TransactionFailed` with the
revert bytes in its message, a JSON-RPC node such as anvil makes web3 raise `ContractCustomError`
carrying hex data); `decode_revert` reads the 4-byte selector either way and returns the matching
`ContractRevert` subclass, whose message names the function called and says what went wrong.
"""

from __future__ import annotations

import ast
from typing import Any

from eth_abi import decode as abi_decode
from eth_utils import keccak, to_checksum_address

from protocol.chain.types import enum_for
from vtrain.errors import VtrainError


class ChainError(VtrainError):
    """A chain interaction failed (connection, transaction, revert)."""


class TransactionError(ChainError):
    """A transaction failed without a decodable custom error (out of gas, unknown revert data)."""


class ContractRevert(ChainError):
    """The contract reverted with one of its custom errors.

    `function` is the contract function that was called, `fields` the error's decoded arguments
    (enums as Python enums), `selector` its 4-byte selector.
    """

    selector: bytes = b""

    def __init__(self, function: str, args: dict[str, Any]) -> None:
        self.function = function
        self.fields = args
        shown = ", ".join(f"{k}={_show(v)}" for k, v in args.items())
        hint = (type(self).__doc__ or "").strip().splitlines()[0]
        super().__init__(f"VerificationGame.{function} reverted with {type(self).__name__}({shown}): {hint}")


def _show(v: Any) -> str:
    if isinstance(v, bytes):
        return "0x" + v.hex()
    if hasattr(v, "name") and isinstance(v, int):
        return v.name
    return str(v)


# One class per Solidity custom error, named identically; the docstring's first line is the hint.
class JobNotFound(ContractRevert):
    """No job has this id."""


class GameNotFound(ContractRevert):
    """No game has this id."""


class WrongJobStatus(ContractRevert):
    """The job's status does not allow this call."""


class WrongGameStatus(ContractRevert):
    """The game's status does not allow this call."""


class NoSteps(ContractRevert):
    """A job needs at least one training step."""


class NoReferee(ContractRevert):
    """A job needs a non-zero referee address."""


class ZeroTerm(ContractRevert):
    """Windows, clock and bonds of a job must all be positive."""


class WrongValue(ContractRevert):
    """The value sent is not exactly the required amount (bond)."""


class WrongSize(ContractRevert):
    """The tree size must be num_steps + 1."""


class InvalidProof(ContractRevert):
    """The Merkle proof does not show this leaf at this index under the sender's root."""


class InvalidChildren(ContractRevert):
    """The revealed children do not hash to the revealer's node [start, end) of the game."""


class ChallengeWindowClosed(ContractRevert):
    """The challenge window has closed; no new game can start."""


class ChallengeWindowOpen(ContractRevert):
    """The challenge window is still open; wait until closesAt to finalize."""


class GamesOpen(ContractRevert):
    """Games of this job are still open; they must end first."""


class SameFinalLeaf(ContractRevert):
    """The challenger's final leaf equals the trainer's: there is nothing to dispute."""


class NotYourTurn(ContractRevert):
    """The sender is not the side to move in this game."""


class ClockExpired(ContractRevert):
    """The side to move has run out of time; the game can only be timed out."""


class ClockNotExpired(ContractRevert):
    """The side to move still has time left; timeout is not allowed yet."""


class Unauthorized(ContractRevert):
    """Only the job's client or referee may make this call."""


class RefereeDeadlinePassed(ContractRevert):
    """The referee's deadline has passed; the game can only be refunded."""


class RefereeDeadlineNotPassed(ContractRevert):
    """The referee still has time to resolve; refund is not allowed yet."""


class NoShare(ContractRevert):
    """No share to claim: the challenger did not win, already claimed, or games are still open."""


class NothingToWithdraw(ContractRevert):
    """The sender has no credit to withdraw."""


class TransferFailed(ContractRevert):
    """Sending the withdrawal failed: the recipient rejected the ether."""


REVERT_CLASSES: dict[str, type[ContractRevert]] = {cls.__name__: cls for cls in ContractRevert.__subclasses__()}


class RevertDecoder:
    """Maps the custom errors of one ABI, by selector, to `ContractRevert` subclasses."""

    def __init__(self, abi: list[dict]) -> None:
        self._errors: dict[bytes, tuple[type[ContractRevert], list[dict]]] = {}
        for item in abi:
            if item["type"] != "error":
                continue
            cls = REVERT_CLASSES.get(item["name"])
            if cls is None:
                raise ChainError(f"the ABI's custom error {item['name']} has no Python class in protocol/chain/errors.py: add one")
            inputs = item["inputs"]
            selector = keccak(text=f"{item['name']}({','.join(i['type'] for i in inputs)})")[:4]
            self._errors[selector] = (cls, inputs)

    def selectors(self) -> dict[str, bytes]:
        """Error name -> 4-byte selector."""
        return {cls.__name__: sel for sel, (cls, _) in self._errors.items()}

    def decode(self, data: bytes, function: str) -> ChainError:
        """The exception for revert `data` of a call to `function`."""
        known = self._errors.get(bytes(data[:4]))
        if known is None:
            return TransactionError(f"VerificationGame.{function} reverted with unknown data 0x{bytes(data).hex() or '(empty)'}")
        cls, inputs = known
        values = abi_decode([i["type"] for i in inputs], bytes(data[4:]))
        args = {}
        for i, v in zip(inputs, values):
            enum = enum_for(i.get("internalType"))
            if enum is not None:
                v = enum(v)
            elif i["type"] == "address":
                v = to_checksum_address(v)
            args[i["name"]] = v
        error = cls(function, args)
        error.selector = bytes(data[:4])
        return error

    def from_exception(self, exc: BaseException, function: str) -> ChainError | None:
        """Decode a backend's revert exception; None when `exc` carries no revert data."""
        data = revert_data(exc)
        return None if data is None else self.decode(data, function)


def revert_data(exc: BaseException) -> bytes | None:
    """The raw revert data inside a web3 or eth-tester exception, if any."""
    data = getattr(exc, "data", None)
    if isinstance(data, dict):
        data = data.get("data")
    if isinstance(data, str) and data.startswith("0x"):
        return bytes.fromhex(data[2:])
    message = str(exc.args[0]) if exc.args else ""
    # eth-tester: "execution reverted: b'...'" (the bytes' repr).
    prefix = "execution reverted: "
    if message.startswith(prefix):
        rest = message[len(prefix):]
        if rest.startswith(("b'", 'b"')):
            return ast.literal_eval(rest)
        if rest.startswith("0x"):
            return bytes.fromhex(rest[2:])
    return None
