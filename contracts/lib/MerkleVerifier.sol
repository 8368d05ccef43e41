// SPDX-License-Identifier: GPL-3.0-or-later
pragma solidity ^0.8.24;

/// @title MerkleVerifier
/// @notice Inclusion proofs for RFC 9162 Merkle trees over keccak-256, exactly the trees that
///         `vtrain.merkle.MerkleTree` (pymerkle) builds: leaf node = keccak256(0x00 ‖ leaf),
///         inner node = keccak256(0x01 ‖ left ‖ right), no padding, so any size is valid.
/// @dev A proof is the RFC 9162 audit path: sibling nodes from the leaf level up. Its directions
///      are not part of the proof; they follow from (index, size) as in RFC 9162 §2.1.3.2, so a
///      proof is bound to the leaf's position, never only to membership (unlike sorted-pair proofs).
///      `vtrain.merkle.root_from_proof` is the Python twin; the tests hold the two equal.
library MerkleVerifier {
    /// @notice The deepest tree a proof may describe: sizes are uint48 (step counts), so a path
    ///         has at most 48 siblings (a tree of 2^48 leaves has depth 48).
    uint256 internal constant MAX_DEPTH = 48;

    /// @notice True when `proof` shows `leaf` at 0-based `index` in the tree of `size` leaves
    ///         whose root is `root`; false for any malformed proof (wrong length, index >= size).
    /// @param root The tree's root.
    /// @param leaf The 32-byte step leaf (not the leaf node).
    /// @param index The leaf's 0-based position.
    /// @param size The number of leaves in the tree.
    /// @param proof The audit path, bottom-up.
    /// @return ok Whether the proof is valid.
    function verify(bytes32 root, bytes32 leaf, uint256 index, uint256 size, bytes32[] calldata proof)
        internal
        pure
        returns (bool ok)
    {
        (bool wellFormed, bytes32 computed) = rootOf(leaf, index, size, proof);
        return wellFormed && computed == root;
    }

    /// @notice The root that `proof` implies for `leaf` at `index` in a tree of `size` leaves.
    /// @return wellFormed False when the proof cannot describe such a tree (then `r` is zero).
    /// @return r The implied root.
    function rootOf(bytes32 leaf, uint256 index, uint256 size, bytes32[] calldata proof)
        internal
        pure
        returns (bool wellFormed, bytes32 r)
    {
        // INVARIANT: the loop below runs at most MAX_DEPTH times whatever the caller sends.
        if (index >= size || proof.length > MAX_DEPTH) return (false, bytes32(0));
        uint256 fn = index;
        uint256 sn = size - 1;
        r = leafNode(leaf);
        for (uint256 i; i < proof.length; ++i) {
            if (sn == 0) return (false, bytes32(0)); // longer than the tree is deep
            if (fn & 1 == 1 || fn == sn) {
                r = innerNode(proof[i], r);
                // The last node of a level with no right sibling is promoted unchanged: skip the
                // levels on which it has none. Each pass halves fn, so this ends within 256 passes.
                if (fn & 1 == 0) {
                    while (fn & 1 == 0 && fn != 0) {
                        fn >>= 1;
                        sn >>= 1;
                    }
                }
            } else {
                r = innerNode(r, proof[i]);
            }
            fn >>= 1;
            sn >>= 1;
        }
        if (sn != 0) return (false, bytes32(0)); // shorter than the tree is deep
        return (true, r);
    }

    /// @notice The leaf node keccak256(0x00 ‖ leaf).
    function leafNode(bytes32 leaf) internal pure returns (bytes32 h) {
        assembly ("memory-safe") {
            // Hash in scratch space [0x00, 0x21): 33 bytes fit below the free-memory pointer.
            mstore(0x00, 0)
            mstore(0x01, leaf)
            h := keccak256(0x00, 0x21)
        }
    }

    /// @notice The inner node keccak256(0x01 ‖ left ‖ right).
    function innerNode(bytes32 left, bytes32 right) internal pure returns (bytes32 h) {
        assembly ("memory-safe") {
            // 65 bytes at the free-memory pointer, which is not advanced: the memory is scratch.
            let p := mload(0x40)
            mstore8(p, 0x01)
            mstore(add(p, 0x01), left)
            mstore(add(p, 0x21), right)
            h := keccak256(p, 0x41)
        }
    }
}
