"""A party's own tree of step leaves, answering the reveals a game asks for."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

from vtrain.merkle import MerkleTree, leaf_node, node


def split_point(width: int) -> int:
    """The largest power of two smaller than `width` (RFC 9162's k), for width >= 2."""
    return 1 << ((width - 1).bit_length() - 1)


class Prover(ABC):
    """What a game asks of a tree: leaves, inclusion proofs, subtree hashes and node children.

    Subclasses give `size`, `root`, `leaf`, `proof` and `subtree` (MTH of a leaf range).
    """

    size: int
    root: bytes

    @abstractmethod
    def leaf(self, index: int) -> bytes:
        """The raw 32-byte step leaf at `index`."""

    @abstractmethod
    def proof(self, index: int) -> list[bytes]:
        """RFC 9162 audit path of leaf `index`."""

    @abstractmethod
    def subtree(self, start: int, width: int) -> bytes:
        """MTH of leaves [start, start + width): the hash of that node of the tree."""

    def reveal(self, index: int) -> tuple[bytes, list[bytes]]:
        """(leaf, proof) at `index`."""
        return self.leaf(index), self.proof(index)

    def children(self, start: int, end: int) -> tuple[bytes, bytes]:
        """The (left, right) children of node [start, end) as VerificationGame.move takes them:
        a child of one leaf is the raw leaf, any other its subtree hash."""
        width = end - start
        if width < 2 or start < 0 or end > self.size:
            raise ValueError(f"[{start}, {end}) is not an inner node's range in a tree of size {self.size}")
        k = split_point(width)
        return self._child(start, k), self._child(start + k, width - k)

    def root_children(self) -> tuple[bytes, bytes]:
        """The root's children as VerificationGame.challenge takes them (zeros for a tree of two
        leaves, whose only step the challenge isolates at once)."""
        return self.children(0, self.size) if self.size > 2 else (bytes(32), bytes(32))

    def _child(self, start: int, width: int) -> bytes:
        return self.leaf(start) if width == 1 else self.subtree(start, width)


class TreeProver(Prover):
    """Leaves 0..n of one party's run with their Merkle tree."""

    def __init__(self, leaves: Sequence[bytes]) -> None:
        self.leaves = list(leaves)
        self.tree = MerkleTree(self.leaves)
        self._nodes: dict[tuple[int, int], bytes] = {}

    @property
    def root(self) -> bytes:
        return self.tree.root

    @property
    def size(self) -> int:
        return self.tree.size

    def leaf(self, index: int) -> bytes:
        return self.leaves[index]

    def proof(self, index: int) -> list[bytes]:
        return self.tree.proof(index)

    def subtree(self, start: int, width: int) -> bytes:
        key = (start, width)
        if key not in self._nodes:
            if width == 1:
                self._nodes[key] = leaf_node(self.leaves[start])
            else:
                k = split_point(width)
                self._nodes[key] = node(self.subtree(start, k), self.subtree(start + k, width - k))
        return self._nodes[key]


class PiecewiseProver(Prover):
    """A tree of `size` leaves equal to `before` below index `split` and to `after` from it on.

    Roots, subtree hashes and proofs come from RFC 9162's recursive definitions (MTH and PATH),
    memoised: a subtree whose leaves are all equal has a hash that depends only on its width, so
    a tree of 2^24 leaves needs O(log² n) hashes instead of 2^24. Two such trees with the same
    `before` and different `after` first differ exactly at `split`, which is what the gas
    benchmark needs for large games; the hashes are real (the contract checks them), and tests
    hold the class equal to `TreeProver` on small sizes.
    """

    def __init__(self, size: int, before: bytes, after: bytes, split: int) -> None:
        if not 0 <= split <= size or size < 1:
            raise ValueError(f"split {split} must lie in [0, {size}] and size must be positive")
        self.size, self.before, self.after, self.split = size, before, after, split
        self._uniform: dict[tuple[bytes, int], bytes] = {}
        self.root = self.subtree(0, size)

    def leaf(self, index: int) -> bytes:
        return self.before if index < self.split else self.after

    def proof(self, index: int) -> list[bytes]:
        if not 0 <= index < self.size:
            raise ValueError(f"leaf index {index} is outside a tree of size {self.size}")
        return self._path(index, 0, self.size)

    def subtree(self, start: int, width: int) -> bytes:
        if start + width <= self.split:
            return self._uniform_hash(self.before, width)
        if start >= self.split:
            return self._uniform_hash(self.after, width)
        k = split_point(width)
        return node(self.subtree(start, k), self.subtree(start + k, width - k))

    def _uniform_hash(self, leaf: bytes, width: int) -> bytes:
        key = (leaf, width)
        if key not in self._uniform:
            if width == 1:
                self._uniform[key] = leaf_node(leaf)
            else:
                k = split_point(width)
                self._uniform[key] = node(self._uniform_hash(leaf, k), self._uniform_hash(leaf, width - k))
        return self._uniform[key]

    def _path(self, index: int, start: int, width: int) -> list[bytes]:
        """PATH(index, leaves [start, start + width)), bottom-up, as RFC 9162 §2.1.3.1."""
        if width == 1:
            return []
        k = split_point(width)
        if index - start < k:
            return self._path(index, start, k) + [self.subtree(start + k, width - k)]
        return self._path(index, start + k, width - k) + [self.subtree(start, k)]
