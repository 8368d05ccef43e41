"""The families learn: the loss falls over the 50 steps of the examples, and the rounded FP64 run
ends within a few percent of plain float32 training (native torch, no rounding) of the same spec."""

from __future__ import annotations

import dataclasses

import pytest

from familykit import family_spec
from vtrain.run import Run
from vtrain.train import TrainingSession

TAIL = 10   # compare the mean loss of the last steps: single batches are noisy


@pytest.mark.parametrize("family", ["gpt2-tiny", "resnet-tiny"])
def test_loss_falls_and_tracks_plain_float32(family_runs, family_data, family):
    spec = family_spec(family, family_data)
    rounded = [m["loss"] for m in Run.open(family_runs.get(spec, "cpu")).metrics()]
    plain_spec = dataclasses.replace(spec, dtype="float32")
    s = TrainingSession(plain_spec)
    plain = [s.step(t, "none").loss for t in range(1, spec.steps + 1)]
    head, tail = sum(rounded[:TAIL]) / TAIL, sum(rounded[-TAIL:]) / TAIL
    plain_tail = sum(plain[-TAIL:]) / TAIL
    print(f"{family}: rounded fp64 loss {head:.4f} -> {tail:.4f}; plain fp32 final {plain_tail:.4f}")
    assert tail < 0.8 * head
    assert abs(tail - plain_tail) <= 0.05 * plain_tail
