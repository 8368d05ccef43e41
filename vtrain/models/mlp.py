"""A multilayer perceptron: depth hidden layers of ReLU(Linear), optional inverted dropout."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, features: int, hidden: int, depth: int, classes: int, dropout: float = 0.0) -> None:
        super().__init__()
        widths = [features] + [hidden] * depth
        self.hidden = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))
        self.head = nn.Linear(widths[-1], classes)
        self.dropout = dropout

    def dropout_shapes(self) -> list[tuple[int, ...]]:
        """Per-example shapes of the dropout masks, in the order forward uses them."""
        return [(layer.out_features,) for layer in self.hidden]

    def forward(self, x: torch.Tensor, masks: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        for i, layer in enumerate(self.hidden):
            x = torch.relu(layer(x))  # (B, hidden)
            if masks:
                # the mask holds 0 or 1/(1-p) on the grid, drawn from the seed outside the rounded region
                x = x * masks[i]
        return self.head(x)  # (B, classes)
