"""A small convolutional net: two 3x3 convolutions with ReLU, 2x2 average pooling, a linear head."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F


class CNN(nn.Module):
    def __init__(self, image_shape: tuple[int, int, int], channels1: int, channels2: int, classes: int) -> None:
        super().__init__()
        c, h, w = image_shape
        self.image_shape = image_shape
        self.conv1 = nn.Conv2d(c, channels1, 3, padding=1)
        self.conv2 = nn.Conv2d(channels1, channels2, 3, padding=1)
        self.head = nn.Linear(channels2 * (h // 2) * (w // 2), classes)

    def forward(self, x: torch.Tensor, masks: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        x = x.reshape(x.shape[0], *self.image_shape)  # (B, features) -> (B, C, H, W)
        x = torch.relu(self.conv1(x))                   # (B, c1, H, W)
        x = torch.relu(self.conv2(x))                   # (B, c2, H, W)
        x = F.avg_pool2d(x, 2)                          # (B, c2, H/2, W/2)
        return self.head(x.flatten(1))                  # (B, classes)
