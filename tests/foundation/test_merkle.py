"""The Python Merkle tree: RFC 9162 proofs for every index of every small size, and tamper checks."""

import hashlib

import pytest

from vtrain.errors import MerkleError
from vtrain.merkle import MerkleTree, leaf_node, node, root_from_proof, verify_proof


def leaves(n: int) -> list[bytes]:
    return [hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(n)]


def test_small_trees_match_the_rfc_9162_definition():
    a, b, c = leaves(3)
    assert MerkleTree([a]).root == leaf_node(a)
    assert MerkleTree([a, b]).root == node(leaf_node(a), leaf_node(b))
    # RFC 9162: split at the largest power of two below n, so 3 leaves = node(node(a, b), c).
    assert MerkleTree([a, b, c]).root == node(node(leaf_node(a), leaf_node(b)), leaf_node(c))


@pytest.mark.parametrize("size", range(1, 65))
def test_every_proof_verifies_and_only_at_its_own_index(size):
    ls = leaves(size)
    tree = MerkleTree(ls)
    bigger = MerkleTree(leaves(size + 1))
    for i in range(size):
        proof = tree.proof(i)
        assert root_from_proof(ls[i], i, size, proof) == tree.root
        assert not verify_proof(ls[i], (i + 1) % size, size, proof, tree.root) or size == 1
        # A root does not fix the size: the size travels with it, and a proof against the tree one
        # leaf larger (same leaf, same index) must not verify.
        assert not verify_proof(ls[i], i, size + 1, proof, bigger.root)
        bad_leaf = bytes([ls[i][0] ^ 1]) + ls[i][1:]
        assert not verify_proof(bad_leaf, i, size, proof, tree.root)
        for j in range(len(proof)):
            tampered = list(proof)
            tampered[j] = bytes([proof[j][0] ^ 0x80]) + proof[j][1:]
            assert not verify_proof(ls[i], i, size, tampered, tree.root)


def test_bad_requests_raise_merkle_errors():
    tree = MerkleTree()
    with pytest.raises(MerkleError, match="empty tree"):
        tree.root
    with pytest.raises(MerkleError, match="32 bytes"):
        tree.append(b"short")
    tree.append(leaves(1)[0])
    with pytest.raises(MerkleError, match="outside a tree of size 1"):
        tree.proof(1)
    with pytest.raises(MerkleError, match="outside"):
        root_from_proof(leaves(1)[0], 5, 3, [])
