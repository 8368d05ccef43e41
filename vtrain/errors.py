"""The exception hierarchy of vtrain.

Every error the library raises on purpose derives from `VtrainError`, so the CLI can map them to
exit codes and print one readable line instead of a traceback. Domain subclasses say which part of
the system refused; their messages name the file, step or transaction and what to do next.
"""


class VtrainError(Exception):
    """Root of every deliberate vtrain error."""


class ToolchainError(VtrainError):
    """The Solidity compiler, node, anvil or another external tool is missing or failed."""


class MerkleError(VtrainError):
    """A Merkle tree was asked for something it cannot give (bad index, empty tree)."""
