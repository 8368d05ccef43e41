"""Multinomial logistic regression: one linear layer; the loss applies the softmax."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


class LogisticRegression(nn.Module):
    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, classes)

    def forward(self, x: torch.Tensor, masks: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        return self.linear(x)  # (B, features) -> (B, classes) logits
