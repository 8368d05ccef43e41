"""Optimizer and learning-rate schedule builders (the only optimisation code that reads the spec).

Optimizers are torch.optim's single-tensor algorithms (foreach=False, fused=False: the definition every
device computes), whose rounded update runs as one fused pass per parameter on CPU (vtrain.fused_optim: the
single-tensor code's values). The learning rate of each
step is a pure function of (spec, step), so a referee replaying one step needs no scheduler state; it is
rounded to the grid so every device uses the same value.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from vtrain.fused_optim import RoundedAdam, RoundedAdamW, RoundedSGD
from vtrain.grid import round_to_grid
from vtrain.spec import Spec


def build_optimizer(spec: Spec, model: nn.Module) -> torch.optim.Optimizer:
    params = [p for _, p in sorted(model.named_parameters())]
    if spec.optimizer == "sgd":
        return RoundedSGD(params, lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay,
                          foreach=False, fused=False)
    cls = RoundedAdam if spec.optimizer == "adam" else RoundedAdamW
    return cls(params, lr=spec.lr, betas=(spec.beta1, spec.beta2), eps=spec.eps,
               weight_decay=spec.weight_decay, foreach=False, fused=False)


def lr_at(spec: Spec, step: int) -> float:
    """Learning rate of step `step` (1-based), on the grid of spec.bits."""
    if spec.schedule == "constant":
        lr = spec.lr
    else:
        warm = spec.warmup_steps if spec.schedule == "warmup-cosine" else 0
        if step <= warm:
            lr = spec.lr * step / warm
        else:
            progress = (step - 1 - warm) / max(1, spec.steps - 1 - warm)
            lr = spec.min_lr + 0.5 * (spec.lr - spec.min_lr) * (1.0 + math.cos(math.pi * progress))
    return float(round_to_grid(torch.tensor(lr, dtype=torch.float64), spec.bits))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
