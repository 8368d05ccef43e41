"""The on-chain RFC 9162 verifier against the Python tree (vtrain.merkle), differentially.

Every proof of every index of trees of sizes 1..64 must verify on-chain; one-bit tampering with
the leaf, a sibling or the root, a wrong index, a wrong size, and a proof one node too long or too
short must be rejected exactly when the Python reference rejects them. Claims are checked in
batches through MerkleVerifierHarness (one eth_call per tree size).
"""

from __future__ import annotations

import hashlib

import pytest

from protocol.chain import tester_web3
from protocol.chain.prover import PiecewiseProver, TreeProver, split_point
from vtrain.merkle import MerkleTree, leaf_node, node, verify_proof

MAX_SIZE = 64


def flip(b: bytes, bit: int = 0) -> bytes:
    return bytes([b[0] ^ (1 << bit)]) + b[1:]


@pytest.fixture(scope="module")
def harness(artifacts):
    w3 = tester_web3()
    art = artifacts["MerkleVerifierHarness"]
    tx = w3.eth.contract(abi=art.abi, bytecode=art.bytecode).constructor().transact({"from": w3.eth.accounts[0]})
    address = w3.eth.wait_for_transaction_receipt(tx)["contractAddress"]
    return w3.eth.contract(address=address, abi=art.abi)


def tree_of(size: int) -> tuple[list[bytes], MerkleTree]:
    leaves = [hashlib.sha3_256(f"{size}:{i}".encode()).digest() for i in range(size)]
    return leaves, MerkleTree(leaves)


def check(harness, claims: list[tuple]) -> list[bool]:
    return harness.functions.verifyAll([list(c) for c in claims]).call()


def test_every_proof_of_every_tree_up_to_64_verifies(harness):
    for size in range(1, MAX_SIZE + 1):
        leaves, tree = tree_of(size)
        claims = [(tree.root, leaves[i], i, size, tree.proof(i)) for i in range(size)]
        assert check(harness, claims) == [True] * size, f"size {size}"


def mutations(size: int) -> list[tuple[str, tuple]]:
    """Tampered claims for the edge and middle leaves of a tree of `size` (every index would
    multiply the test's time by ten for no new path shape)."""
    leaves, tree = tree_of(size)
    out = []
    for i in sorted({0, 1, size // 2, size - 2, size - 1} & set(range(size))):
        root, leaf, proof = tree.root, leaves[i], tree.proof(i)
        out.append(("leaf bit", (root, flip(leaf), i, size, proof)))
        out.append(("root bit", (flip(root, 7), leaf, i, size, proof)))
        for j in range(len(proof)):
            out.append(("sibling bit", (root, leaf, i, size, proof[:j] + [flip(proof[j], 3)] + proof[j + 1 :])))
        out.append(("index past end", (root, leaf, size, size, proof)))
        out.append(("deeper tree", (root, leaf, i, 2 * size + 1, proof)))
        out.append(("one more leaf", (root, leaf, i, size + 1, proof)))
        if size > 1:
            out.append(("other index", (root, leaf, (i + 1) % size, size, proof)))
            out.append(("longer proof", (root, leaf, i, size, proof + [proof[-1]])))
            out.append(("shorter proof", (root, leaf, i, size, proof[:-1])))
            if i < size - 1:
                out.append(("one leaf fewer", (root, leaf, i, size - 1, proof)))
    return out


def test_tampered_claims_are_rejected_exactly_as_the_python_tree_rejects_them(harness):
    rejected_by_kind: dict[str, list[bool]] = {}
    for size in range(1, MAX_SIZE + 1):
        cases = mutations(size)
        onchain = check(harness, [c for _, c in cases])
        for (kind, c), got in zip(cases, onchain):
            expected = verify_proof(c[1], c[2], c[3], c[4], c[0])
            assert got == expected, f"size {size}: {kind} {c[2]}/{c[3]}: chain {got}, python {expected}"
            rejected_by_kind.setdefault(kind, []).append(not got)
    # Bit flips, other positions, other depths and mis-shaped proofs are always rejected.
    for kind in ("leaf bit", "root bit", "sibling bit", "index past end", "other index", "deeper tree",
                 "longer proof", "shorter proof"):  # fmt: skip
        assert all(rejected_by_kind[kind]), kind
    # RFC 9162 trees grow at the right edge only, so a size off by one often has the same path
    # for a leaf and both implementations accept it alike (the root still fixes the tree: the
    # contract always pairs a root with the job's size). It must still fail where the path differs.
    for kind in ("one more leaf", "one leaf fewer"):
        assert any(rejected_by_kind[kind]), kind


def nodes(size: int) -> list[tuple[int, int]]:
    """Every inner node [start, end) of an RFC 9162 tree of `size` leaves."""
    out, todo = [], [(0, size)]
    while todo:
        start, end = todo.pop()
        if end - start > 1:
            out.append((start, end))
            k = split_point(end - start)
            todo += [(start, start + k), (start + k, end)]
    return out


def test_tree_prover_nodes_and_children_are_the_python_trees():
    """Every node hash is the root of MerkleTree over its leaf range; children of one leaf are raw."""
    for size in range(2, 34):
        leaves, tree = tree_of(size)
        p = TreeProver(leaves)
        assert p.subtree(0, size) == p.root == tree.root
        for start, end in nodes(size):
            assert p.subtree(start, end - start) == MerkleTree(leaves[start:end]).root
            left, right = p.children(start, end)
            k = split_point(end - start)
            assert left == (leaves[start] if k == 1 else MerkleTree(leaves[start : start + k]).root)
            assert right == (leaves[start + k] if end - start - k == 1 else MerkleTree(leaves[start + k : end]).root)
            lnode = leaf_node(left) if k == 1 else left
            rnode = leaf_node(right) if end - start - k == 1 else right
            assert node(lnode, rnode) == p.subtree(start, end - start)
    with pytest.raises(ValueError, match="not an inner node"):
        TreeProver(tree_of(4)[0]).children(2, 3)


def test_piecewise_prover_matches_the_python_tree(harness):
    """The benchmark's memoised big-tree prover is the same tree as MerkleTree and TreeProver
    (sizes 1..64): roots, proofs, and every node's children."""
    a, b = hashlib.sha3_256(b"a").digest(), hashlib.sha3_256(b"b").digest()
    for size in range(1, MAX_SIZE + 1):
        for split in sorted({0, 1, size // 2, size - 1, size}):
            p = PiecewiseProver(size, a, b, split)
            full = TreeProver([p.leaf(i) for i in range(size)])
            assert p.root == full.tree.root
            assert [p.proof(i) for i in range(size)] == [full.proof(i) for i in range(size)]
            assert [p.children(*n) for n in nodes(size)] == [full.children(*n) for n in nodes(size)]


def test_game_exposes_the_same_verifier(world):
    leaves, tree = tree_of(13)
    assert world.game.verify_inclusion(tree.root, leaves[5], 5, 13, tree.proof(5))
    assert not world.game.verify_inclusion(tree.root, leaves[5], 6, 13, tree.proof(5))
