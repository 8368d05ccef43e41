"""The four roles over web3.py: client, trainer, auditor, referee (DESIGN.md §3).

Each role is an account acting on one deployed VerificationGame; transactions are signed locally
and, for agents, journaled before they are sent (protocol.roles.tx).
"""

from protocol.roles.base import Role, RoleError
from protocol.roles.client import Client, initial_leaf, terms_for
from protocol.roles.player import Auditor, Trainer, read_audit_leaves
from protocol.roles.referee import Referee, Verdict
from protocol.roles.tx import SentTx, Transactor, UnfundedError

__all__ = ["Auditor", "Client", "Referee", "Role", "RoleError", "SentTx", "Trainer", "Transactor", "UnfundedError",
           "Verdict", "initial_leaf", "read_audit_leaves", "terms_for"]
