"""Seeded randomness: data order, initialisation and dropout masks depend only on (seed, step, site)."""

from __future__ import annotations

import torch

from enginekit import emulated_devices, example
from vtrain.data import batch_indices, keyed_generator, load_dataset
from vtrain.grid import round_to_grid
from vtrain.models import build_model, dropout_masks
from vtrain.optim import lr_at
from vtrain.train import TrainingSession


def test_epochs_are_permutations_and_steps_are_reproducible():
    n, b = 1797, 32
    per_epoch = n // b
    seen = torch.cat([batch_indices(5, t, b, n) for t in range(1, per_epoch + 1)])
    assert seen.unique().numel() == per_epoch * b            # no example twice within an epoch
    assert torch.equal(batch_indices(5, 7, b, n), batch_indices(5, 7, b, n))
    assert not torch.equal(batch_indices(5, 7, b, n), batch_indices(6, 7, b, n))
    assert not torch.equal(batch_indices(5, 1, b, n), batch_indices(5, per_epoch + 1, b, n))   # new epoch


def test_generator_streams_are_keyed():
    def draw(*key):
        return torch.rand(4, generator=keyed_generator(*key))
    assert torch.equal(draw(1, 2, "a"), draw(1, 2, "a"))
    assert len({tuple(draw(*k).tolist()) for k in [(1, 2, "a"), (1, 2, "b"), (1, 3, "a"), (2, 2, "a")]}) == 4


def test_inputs_init_and_masks_are_on_the_grid():
    for name in ("cnn", "scale/mlp"):
        spec = example(name)
        data = load_dataset(spec.dataset, getattr(torch, spec.dtype))
        assert torch.equal(round_to_grid(data.x, spec.bits), data.x)
        model = build_model(spec, data)
        for p in model.parameters():
            assert torch.equal(round_to_grid(p.detach(), spec.bits), p.detach())
        assert lr_at(spec, 1) == float(round_to_grid(torch.tensor(lr_at(spec, 1), dtype=torch.float64), spec.bits))
    spec = example("mlp")
    model = build_model(spec, load_dataset("digits", torch.float64))
    masks = dropout_masks(model, 32, spec.seed, 3, spec.bits)
    assert len(masks) == spec.depth and all(m.shape == (32, spec.hidden) for m in masks)
    assert torch.equal(masks[0], dropout_masks(model, 32, spec.seed, 3, spec.bits)[0])
    assert not torch.equal(masks[0], dropout_masks(model, 32, spec.seed, 4, spec.bits)[0])
    zeros = sum(int((m == 0).sum()) for m in masks) / sum(m.numel() for m in masks)
    assert 0.05 < zeros < 0.15     # p = 0.1


def test_initial_leaf_is_the_same_on_every_device():
    spec = example("cnn")
    leaves = {TrainingSession(spec, d).record().leaf for d in ["cpu", *emulated_devices()]}
    assert len(leaves) == 1


def test_schedules():
    spec = example("cnn")   # warmup-cosine, 10 warm-up steps
    lrs = [lr_at(spec, t) for t in range(1, spec.steps + 1)]
    assert lrs[0] < lrs[9] and abs(lrs[9] - spec.lr) < 1e-6 * spec.lr
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:])) and lrs[-1] < 0.01 * spec.lr
