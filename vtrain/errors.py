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


class UnsupportedOpError(VtrainError):
    """An aten op (or a form of one) that is in no registry class of vtrain.ops: rounded training refuses to
    guess."""

    def __init__(self, op: str, detail: str | None = None):
        self.op = op
        super().__init__(
            f"unsupported op {op} under rounded execution: "
            + (detail or "it is in no class of vtrain.ops (exact, IEEE, device-dependent, composite). Add it to "
               "the registry with its error bound, or avoid it in the model")
        )
