"""Checkpoint intervals: which optimizer steps each leaf of a run covers, and what the leaf commits to.

With `checkpoint_interval = k` the trainer writes a state and a leaf after steps k, 2k, 3k, ... and
after the last step N, whether or not k divides N: a user expects the final state to be committed,
and a job's client should not have to pick N to suit k. So leaf 0 is the initial state and leaf
i >= 1 covers steps (i-1)k+1 .. min(ik, N); there are ceil(N/k) + 1 leaves, and the last interval
may be shorter than k.

A leaf of an interval commits to the state after its last step and to one log hash and one batch
hash for all of its steps. For k = 1 those are the step's own hashes, so a run with a leaf per step
is byte for byte what it was before intervals existed. For k > 1 they are
keccak256(tag ‖ h_first ‖ … ‖ h_last) over the per-step hashes, in step order; RUN/steps.bin lists
the per-step hashes (vtrain.run), so a reader can name the one step whose log file was changed and
an auditor or a referee can replay the interval step by step.

The leaf's index in leaves.bin and in the Merkle tree is the interval number i (not a step): the
contract's "step" of a dispute is this index, and the state hash pins the step counter anyway.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from vtrain.leaves import ZERO_HASH, LeafRecord, keccak256

INTERVAL_LOG_TAG = b"vtrain.interval.log.v1"
INTERVAL_BATCH_TAG = b"vtrain.interval.batch.v1"


@dataclass(frozen=True)
class Intervals:
    """The leaves of a run of `steps` optimizer steps with a leaf every `k` steps (and after the last)."""

    steps: int
    k: int

    def __post_init__(self) -> None:
        if self.steps < 1 or self.k < 1:
            raise ValueError(f"a run needs steps >= 1 and k >= 1, got steps={self.steps} k={self.k}")

    @property
    def size(self) -> int:
        """Leaves of the whole run, leaf 0 included: ceil(steps / k) + 1."""
        return -(-self.steps // self.k) + 1

    def last_step(self, leaf: int) -> int:
        """The step whose state leaf `leaf` commits (0 for leaf 0)."""
        self._check(leaf)
        return min(leaf * self.k, self.steps)

    def steps_of(self, leaf: int) -> range:
        """The steps interval `leaf` (>= 1) covers; empty for leaf 0."""
        self._check(leaf)
        return range((leaf - 1) * self.k + 1 if leaf else 1, self.last_step(leaf) + 1)

    def leaf_of(self, step: int) -> int:
        """The leaf whose interval contains `step` (0 for the initial state)."""
        if not 0 <= step <= self.steps:
            raise ValueError(f"step {step} is outside 0..{self.steps}")
        return -(-step // self.k)

    def ends_leaf(self, step: int) -> bool:
        """Whether a leaf is written after `step`."""
        return step == self.last_step(self.leaf_of(step))

    def describe(self, leaf: int) -> str:
        """`step 5` for k = 1, `steps 5..8` otherwise: how messages name what a leaf covers."""
        steps = self.steps_of(leaf)
        if self.k == 1 or not steps:
            return f"step {self.last_step(leaf)}"
        return f"steps {steps[0]}..{steps[-1]}"

    def _check(self, leaf: int) -> None:
        if not 0 <= leaf < self.size:
            raise ValueError(f"leaf {leaf} is outside 0..{self.size - 1} (steps={self.steps}, k={self.k})")


def combine(tag: bytes, hashes: Sequence[bytes], k: int) -> bytes:
    """The hash an interval's leaf commits to for its per-step `hashes` (see the module docstring)."""
    if k == 1:
        if len(hashes) != 1:
            raise ValueError(f"with k = 1 an interval is one step, got {len(hashes)} hashes")
        return hashes[0]
    return keccak256(tag + b"".join(hashes))


def interval_record(leaf: int, state_hash: bytes, log_hashes: Sequence[bytes], batch_hashes: Sequence[bytes],
                    k: int) -> LeafRecord:
    """The leaf record of interval `leaf` from the state after its last step and its steps' hashes.

    Steps without a log (resolution "exact") have a zero log hash; an interval of them commits a zero
    log hash too, as a single such step does.
    """
    no_log = all(h == ZERO_HASH for h in log_hashes)
    return LeafRecord(leaf, state_hash, ZERO_HASH if no_log else combine(INTERVAL_LOG_TAG, log_hashes, k),
                      combine(INTERVAL_BATCH_TAG, batch_hashes, k))
