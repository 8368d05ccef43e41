"""A ResNet-style CNN (He et al. 2016, the CIFAR variant): a 3x3 stem, stages of basic residual
blocks with batch norm (width doubling and stride 2 from the second stage on, 1x1 projection
shortcuts where the shape changes), global average pooling and a linear head. The batch norms are
vtrain.models.norms' written-out form (under rounded execution their elementwise ops in training run fused to the
same values, vtrain.fused_norms).
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.nn import functional as F

from vtrain.models.norms import BatchNorm2d


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = BatchNorm2d(cout)
        self.shortcut = None
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.shortcut is None else self.shortcut(x)))


class ResNet(nn.Module):
    def __init__(self, image_shape: tuple[int, int, int], width: int, stages: int, blocks: int,
                 classes: int) -> None:
        super().__init__()
        self.image_shape = image_shape
        self.conv1 = nn.Conv2d(image_shape[0], width, 3, padding=1, bias=False)
        self.bn1 = BatchNorm2d(width)
        layers, cin = [], width
        for s in range(stages):
            cout = width << s
            for b in range(blocks):
                layers.append(BasicBlock(cin, cout, 2 if s > 0 and b == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor, masks: Sequence[torch.Tensor] = ()) -> torch.Tensor:
        x = x.reshape(x.shape[0], *self.image_shape)     # (B, features) -> (B, 3, H, W)
        x = F.relu(self.bn1(self.conv1(x)))              # (B, width, H, W)
        x = self.layers(x)                               # (B, width * 2^(stages-1), H', W')
        return self.fc(x.mean((2, 3)))                   # (B, classes)
