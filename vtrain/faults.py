"""Deliberate faults, for protocol tests: how a dishonest trainer's run looks.

A faulty run stays self-consistent, as a real cheater's would: its states, logs and leaves agree
with each other; only an honest replay from the spec shows the step where it went wrong.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vtrain.data import keyed_generator
from vtrain.errors import VtrainError
from vtrain.grid import round_to_grid

KINDS = ("poison-batch", "skip-step", "perturb-weights")


class FaultError(VtrainError):
    """A --fault argument is malformed."""


@dataclass(frozen=True)
class Fault:
    step: int
    kind: str   # poison-batch: labels of the step's batch shifted by one class
                # skip-step: the step's update is not applied (the state stays as before it)
                # perturb-weights: after the step, weights move by ~1e-3 (rounded to the grid)


def parse_fault(text: str) -> Fault:
    """Parse STEP:KIND, for example `7:poison-batch`."""
    step, sep, kind = text.partition(":")
    if not sep or not step.strip().isdigit() or int(step) < 1 or kind not in KINDS:
        raise FaultError(f"bad fault {text!r}: expected STEP:KIND with STEP >= 1 and KIND one of {', '.join(KINDS)}")
    return Fault(int(step), kind)


def poison_labels(y: torch.Tensor, classes: int) -> torch.Tensor:
    return (y + 1) % classes


@torch.no_grad()
def perturb_weights(model: nn.Module, seed: int, step: int, bits: int) -> None:
    for name, p in sorted(model.named_parameters()):
        noise = torch.randn(p.shape, generator=keyed_generator(seed, step, "fault:" + name), dtype=torch.float64)
        p.copy_(round_to_grid(p.double() + 1e-3 * noise, bits).to(p.dtype))
