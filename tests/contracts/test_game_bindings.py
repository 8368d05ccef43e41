"""The Python binding: a typed method per contract function, errors decoded on both backends."""

from __future__ import annotations

import re

import pytest
from eth_tester.exceptions import TransactionFailed
from web3.exceptions import ContractCustomError

from gamekit import leaves
from protocol.chain import GameStatus, Side, TreeProver, VerificationGame
from protocol.chain.errors import REVERT_CLASSES, ChainError, NotYourTurn, RevertDecoder, TransactionError, revert_data


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def test_every_contract_function_has_a_binding_method(artifacts):
    functions = {f["name"] for f in artifacts["VerificationGame"].abi if f["type"] == "function"}
    renamed = {"getJob": "job", "getGame": "game", "credits": "credit"}
    missing = [f for f in functions if not callable(getattr(VerificationGame, renamed.get(f, snake(f)), None))]
    assert not missing, f"functions without a binding method: {missing}"


def test_every_custom_error_has_a_python_class_and_no_class_is_stale(artifacts):
    errors = {e["name"] for e in artifacts["VerificationGame"].abi if e["type"] == "error"}
    assert errors == set(REVERT_CLASSES)
    with pytest.raises(ChainError, match="has no Python class"):
        RevertDecoder([{"type": "error", "name": "Brandnew", "inputs": []}])


def test_revert_data_is_found_in_both_backends_exceptions(artifacts):
    decoder = RevertDecoder(artifacts["VerificationGame"].abi)
    data = decoder.selectors()["NotYourTurn"] + (7).to_bytes(32, "big") + (1).to_bytes(32, "big")
    tester = TransactionFailed(f"execution reverted: {data!r}")
    node = ContractCustomError("0x" + data.hex(), data="0x" + data.hex())
    for exc in (tester, node):
        assert revert_data(exc) == data
        err = decoder.from_exception(exc, "move")
        assert isinstance(err, NotYourTurn) and err.fields == {"gameId": 7, "turn": Side.CHALLENGER}
        assert str(err) == (
            "VerificationGame.move reverted with NotYourTurn(gameId=7, turn=CHALLENGER): "
            "The sender is not the side to move in this game."
        )
    assert isinstance(decoder.decode(b"\xde\xad\xbe\xef", "move"), TransactionError)
    assert decoder.from_exception(ValueError("unrelated"), "move") is None


def test_events_are_decoded_with_enums_in_chain_order(world):
    start = world.w3.eth.block_number + 1
    job_id, honest = world.committed_job(4)
    bad = TreeProver(leaves(4, diverge_at=2))
    game_id = world.game.challenge_tree(job_id, bad, world.auditor).value
    world.game.move_tree(game_id, honest, world.trainer)
    names = [e.name for e in world.game.events(start)]
    assert names == ["JobCreated", "Committed", "Challenged", "Moved"]
    moved = world.game.events(start)[-1]
    assert moved["mover"] is Side.TRAINER and (moved["start"], moved["end"]) == (0, 4)
    assert world.game.game(game_id).status is GameStatus.ACTIVE
