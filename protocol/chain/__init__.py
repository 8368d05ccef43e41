"""Chain side: connect to eth-tester or a JSON-RPC node, deploy and drive the VerificationGame.

    from protocol.chain import tester_web3, deploy, JobTerms, TreeProver
    w3 = tester_web3(); client, trainer, auditor, referee = w3.eth.accounts[:4]
    game = deploy(w3, client)
    job_id = game.create_job(JobTerms(...), reward=10**18, sender=client).value
    game.commit_tree(job_id, TreeProver(leaves), trainer)
"""

from protocol.chain.connect import advance_time, latest_timestamp, revert, rpc_web3, set_next_timestamp, snapshot, tester_web3
from protocol.chain.errors import ChainError, ContractRevert, TransactionError
from protocol.chain.game import VerificationGame, deploy
from protocol.chain.prover import TreeProver
from protocol.chain.types import EndReason, Event, Game, GameStatus, Job, JobStatus, JobTerms, Side, TxResult

__all__ = [
    "advance_time", "latest_timestamp", "revert", "rpc_web3", "set_next_timestamp", "snapshot", "tester_web3",
    "ChainError", "ContractRevert", "TransactionError", "VerificationGame", "deploy", "TreeProver",
    "EndReason", "Event", "Game", "GameStatus", "Job", "JobStatus", "JobTerms", "Side", "TxResult",
]  # fmt: skip
