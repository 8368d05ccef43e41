"""Model families and the one builder that reads the spec.

Models are plain nn.Modules with flat constructor arguments; `forward(x, masks)` takes the
dropout masks drawn by the caller from the seed (empty for models without dropout), so that no
random op ever runs inside the rounded execution.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from vtrain.data import Dataset, keyed_generator
from vtrain.grid import round_to_grid
from vtrain.models.cnn import CNN
from vtrain.models.gpt2 import GPT2
from vtrain.models.logreg import LogisticRegression
from vtrain.models.mlp import MLP
from vtrain.models.norms import BatchNorm2d, LayerNorm
from vtrain.models.resnet import ResNet
from vtrain.spec import Spec

__all__ = ["CNN", "GPT2", "MLP", "LogisticRegression", "ResNet", "build_model", "dropout_masks"]


def build_model(spec: Spec, data: Dataset) -> nn.Module:
    """The spec's model in the work dtype, initialised from the seed onto the grid."""
    if spec.model == "gpt2":
        model: nn.Module = GPT2(data.num_classes, spec.context, spec.d_model, spec.layers, spec.heads, spec.dropout)
    elif spec.model == "resnet":
        model = ResNet(data.image_shape, spec.width, spec.stages, spec.blocks, data.num_classes)
    elif spec.model == "logreg":
        model = LogisticRegression(data.x.shape[1], data.num_classes)
    elif spec.model == "mlp":
        model = MLP(data.x.shape[1], spec.hidden, spec.depth, data.num_classes, spec.dropout)
    else:
        model = CNN(data.image_shape, spec.channels1, spec.channels2, data.num_classes)
    model = model.to(getattr(torch, spec.dtype))
    _init_on_grid(model, spec.seed, spec.bits)
    return model


@torch.no_grad()
def _init_on_grid(model: nn.Module, seed: int, bits: int) -> None:
    # torch's default init draws from the global generator; ours draws each parameter from its own
    # keyed generator, U(-1/sqrt(fan_in), 1/sqrt(fan_in)) like nn.Linear's, biases zero, then rounds;
    # normalisation layers keep their gain of 1 and bias of 0
    norms = {name for name, m in model.named_modules() if isinstance(m, (LayerNorm, BatchNorm2d))}
    for name, p in sorted(model.named_parameters()):
        if name.rpartition(".")[0] in norms:
            continue
        if name.endswith("bias"):
            p.zero_()
            continue
        fan_in = p[0].numel()
        bound = 1.0 / math.sqrt(fan_in)
        w = torch.rand(p.shape, generator=keyed_generator(seed, 0, "init:" + name), dtype=torch.float64)
        p.copy_(round_to_grid(w.mul_(2 * bound).sub_(bound), bits).to(p.dtype))


def dropout_masks(model: nn.Module, batch: int, seed: int, step: int, bits: int) -> list[torch.Tensor]:
    """Inverted-dropout masks (0 or 1/(1-p) rounded to the grid) for `step`, one per dropout site.

    Each mask has shape (batch, *site shape): example i's mask is row i, so a shard of the batch
    takes the same rows of every mask whatever the number of processes.
    """
    p = getattr(model, "dropout", 0.0)
    if not p:
        return []
    dtype = next(model.parameters()).dtype
    scale = round_to_grid(torch.tensor(1.0 / (1.0 - p), dtype=torch.float64), bits)
    masks = []
    for site, shape in enumerate(model.dropout_shapes()):
        u = torch.rand((batch, *shape), generator=keyed_generator(seed, step, f"dropout:{site}"),
                       dtype=torch.float64)
        masks.append(torch.where(u >= p, scale, torch.zeros((), dtype=torch.float64)).to(dtype))
    return masks
