"""Merkle trees over per-step leaves: RFC 9162 shape, keccak-256, as the on-chain verifier expects.

The tree is pymerkle's (leaf node = H(0x00 ‖ d), inner node = H(0x01 ‖ l ‖ r), no padding, so any
size is allowed). Two things pymerkle does differently from what the contract needs are adapted
here: its indices are 1-based (ours are 0-based step numbers) and its proofs carry the leaf node
and a bit "rule"; the contract takes the RFC 9162 audit path (siblings only, bottom-up), whose
directions follow from (index, size). A root does not fix the size, so the two always travel
together.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from pymerkle import InmemoryTree
from pymerkle.hasher import MerkleHasher

from vtrain.errors import MerkleError

ALGORITHM = "keccak_256"
_HASHER = MerkleHasher(ALGORITHM, security=True)


def leaf_node(leaf: bytes) -> bytes:
    """The tree's leaf node for the 32-byte step leaf `leaf`: keccak256(0x00 ‖ leaf)."""
    return _HASHER.hash_buff(leaf)


def node(left: bytes, right: bytes) -> bytes:
    """An inner node: keccak256(0x01 ‖ left ‖ right)."""
    return _HASHER.hash_pair(left, right)


class MerkleTree:
    """An append-only tree of step leaves (leaf t is the commitment to the state after step t)."""

    def __init__(self, leaves: Iterable[bytes] = ()) -> None:
        self._tree = InmemoryTree(algorithm=ALGORITHM)
        for leaf in leaves:
            self.append(leaf)

    def append(self, leaf: bytes) -> None:
        if len(leaf) != 32:
            raise MerkleError(f"a step leaf must be 32 bytes, got {len(leaf)}")
        self._tree.append_entry(leaf)

    @property
    def size(self) -> int:
        return self._tree.get_size()

    @property
    def root(self) -> bytes:
        if self.size == 0:
            raise MerkleError("an empty tree has no root: append leaf 0 (the initial state) first")
        return self._tree.get_root()

    def proof(self, index: int) -> list[bytes]:
        """RFC 9162 audit path of leaf `index` (0-based): sibling nodes from the leaf level up."""
        if not 0 <= index < self.size:
            raise MerkleError(f"leaf index {index} is outside a tree of size {self.size}")
        return self._tree.prove_inclusion(index + 1).path[1:]


def root_from_proof(leaf: bytes, index: int, size: int, proof: Sequence[bytes]) -> bytes:
    """Recompute the root from a leaf and its audit path (RFC 9162 §2.1.3.2).

    Written out rather than delegated to pymerkle because this is the reference the Solidity
    verifier is tested against: the two must walk (index, size) in exactly the same way.
    """
    if not 0 <= index < size:
        raise MerkleError(f"leaf index {index} is outside a tree of size {size}")
    fn, sn = index, size - 1
    r = leaf_node(leaf)
    for p in proof:
        if sn == 0:
            raise MerkleError("proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node(p, r)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise MerkleError("proof is shorter than the tree is deep")
    return r


def verify_proof(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> bool:
    """True when `proof` shows `leaf` at `index` in the tree of `size` leaves with `root`."""
    try:
        return root_from_proof(leaf, index, size, proof) == root
    except MerkleError:
        return False
