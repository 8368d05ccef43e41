"""Small rounded training runs for the numerics tests (real torch training on sklearn's digits)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.datasets import load_digits

from vtrain import ops
from vtrain.devices import get_device
from vtrain.fused_optim import RoundedAdam, RoundedAdamW, RoundedSGD
from vtrain.grid import round_to_grid
from vtrain.rounding import RoundedExecution
from vtrain.roundlog import StepLog

_DIGITS = load_digits()


def make_model(kind: str, dtype: torch.dtype, bits: int) -> nn.Module:
    torch.manual_seed(0)
    if kind == "mlp":
        model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    elif kind == "logreg":
        model = nn.Sequential(nn.Linear(64, 10))
    else:
        model = nn.Sequential(nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
                              nn.Linear(32, 10))
    model = model.to(dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(round_to_grid(p, bits))
    return model


def make_optimizer(kind: str, model: nn.Module, fused: bool = False) -> torch.optim.Optimizer:
    """torch's optimizer (every op of its update dispatched), or with `fused` vtrain's (what training uses:
    the same update in one pass per parameter on CPU)."""
    adam, adamw, sgd = (RoundedAdam, RoundedAdamW, RoundedSGD) if fused else \
        (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)
    if kind == "mlp":
        return adam(model.parameters(), lr=3e-3, foreach=False)
    if kind == "cnn":
        return adamw(model.parameters(), lr=3e-3, weight_decay=1e-2, foreach=False)
    return sgd(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4, foreach=False)


def batch(step: int, dtype: torch.dtype, size: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    idx = (torch.arange(size) + step * size) % len(_DIGITS.target)
    x = torch.tensor(_DIGITS.data[idx.numpy()] / 16, dtype=dtype)  # k/16: exact on every grid
    return x, torch.tensor(_DIGITS.target[idx.numpy()])


def run(kind: str, device: str, mode: str, steps: int, *, dtype: torch.dtype = torch.float32, bits: int = 19,
        logs: list[StepLog] | None = None, policy: str = "bound") -> tuple[nn.Module, list[StepLog], list[dict]]:
    """Train `steps` steps under RoundedExecution; returns the model, the step logs and the stats."""
    model = make_model(kind, dtype, bits)
    opt = make_optimizer(kind, model)
    out_logs, stats = [], []
    for t in range(steps):
        x, y = batch(t, dtype)
        with RoundedExecution(bits=bits, device=get_device(device), mode=mode, policy=policy, step=t,
                              replay_log=None if logs is None else logs[t]) as rx:
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
        out_logs.append(rx.log)
        stats.append(rx.stats)
    model.optimizer = opt  # kept with the model: the training state is weights and optimizer state
    return model, out_logs, stats


def _state(model: nn.Module) -> list[torch.Tensor]:
    tensors = list(model.parameters())
    opt = getattr(model, "optimizer", None)
    if opt is not None:
        for p in model.parameters():
            tensors += [v for v in opt.state[p].values() if isinstance(v, torch.Tensor)]
    return tensors


def params_equal(a: nn.Module, b: nn.Module) -> bool:
    """Weights and optimizer state bit-identical."""
    sa, sb = _state(a), _state(b)
    return len(sa) == len(sb) and all(torch.equal(p, q) for p, q in zip(sa, sb))


def without_grains(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounded execution without vtrain.grains' whole-op test: every op's band is computed, as before it."""
    monkeypatch.setattr(ops, "_TABLE", {op: dataclasses.replace(s, exact_all=None) for op, s in ops._TABLE.items()})
