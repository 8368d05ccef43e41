// SPDX-License-Identifier: GPL-3.0-or-later
pragma solidity ^0.8.24;

import {MerkleVerifier} from "../lib/MerkleVerifier.sol";

/// @title MerkleVerifierHarness
/// @notice Test-only: checks many inclusion proofs in one eth_call, so the differential test
///         against the Python tree covers thousands of proofs quickly. Never deployed for real.
contract MerkleVerifierHarness {
    /// @notice One proof to check.
    /// @param root The tree's root.
    /// @param leaf The step leaf.
    /// @param index Its 0-based position.
    /// @param size The tree's size.
    /// @param proof The audit path, bottom-up.
    struct Claim {
        bytes32 root;
        bytes32 leaf;
        uint256 index;
        uint256 size;
        bytes32[] proof;
    }

    /// @notice MerkleVerifier.verify on every claim.
    /// @param claims The proofs to check.
    /// @return ok ok[i] is whether claims[i] holds.
    function verifyAll(Claim[] calldata claims) external pure returns (bool[] memory ok) {
        ok = new bool[](claims.length);
        for (uint256 i; i < claims.length; ++i) {
            Claim calldata c = claims[i];
            ok[i] = MerkleVerifier.verify(c.root, c.leaf, c.index, c.size, c.proof);
        }
    }
}
