"""Step leaves: the 32-byte commitments the Merkle tree is built over.

Leaf t = keccak256(b"vtrain.leaf.v1" ‖ uint64be(t) ‖ state_hash ‖ log_hash ‖ batch_hash), where the
state hash covers the whole training state after step t (vtrain.state), the log hash is the content
hash of step t's rounding log and the batch hash fixes which examples step t used. Leaf 0 is the
initial state, with a zero log hash and a zero batch hash: the spec alone determines it.

With a checkpoint interval k > 1, t is the leaf's index (interval t) and the log and batch hashes
combine those of the interval's steps (vtrain.intervals); for k = 1 index and step coincide.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable

import sha3

LEAF_TAG = b"vtrain.leaf.v1"
BATCH_TAG = b"vtrain.batch.v1"
ZERO_HASH = bytes(32)


def keccak256(data: bytes) -> bytes:
    """Ethereum's keccak-256 (not NIST SHA3-256): the hash the contract recomputes."""
    return sha3.keccak_256(data).digest()


def batch_hash(indices: Iterable[int]) -> bytes:
    """keccak256(b"vtrain.batch.v1" ‖ uint64be(i) for each example index, in batch order)."""
    idx = [int(i) for i in indices]
    return keccak256(BATCH_TAG + struct.pack(f">{len(idx)}Q", *idx))


def leaf_hash(step: int, state_hash: bytes, log_hash: bytes, batch: bytes) -> bytes:
    for name, h in (("state_hash", state_hash), ("log_hash", log_hash), ("batch_hash", batch)):
        if len(h) != 32:
            raise ValueError(f"{name} must be 32 bytes, got {len(h)}")
    return keccak256(LEAF_TAG + struct.pack(">Q", step) + state_hash + log_hash + batch)


@dataclass(frozen=True)
class LeafRecord:
    """One step's leaf together with the three hashes it is made of.

    Keeping the parts lets a reader say *which* file of a step was tampered with, not only that
    the step's leaf no longer matches.
    """

    step: int            # the leaf's index: the step itself when checkpoint_interval = 1
    state_hash: bytes
    log_hash: bytes
    batch_hash: bytes

    @property
    def leaf(self) -> bytes:
        return leaf_hash(self.step, self.state_hash, self.log_hash, self.batch_hash)

    def to_bytes(self) -> bytes:
        return self.leaf + self.state_hash + self.log_hash + self.batch_hash


RECORD_SIZE = 128


def hex0x(b: bytes) -> str:
    return "0x" + b.hex()
