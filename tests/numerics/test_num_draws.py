"""Random draws under rounded execution come from the seed: the same masks and noise on every device (vtrain.draws)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from vtrain.data import keyed_generator
from vtrain.draws import Stream
from vtrain.devices import get_device
from vtrain.errors import UnsupportedOpError
from vtrain.grid import round_to_grid
from vtrain.rounding import RoundedExecution

aten = torch.ops.aten


def _uniform(seed: int, step: int, k: int, shape: tuple) -> torch.Tensor:
    """The k-th draw of a step, as vtrain.draws documents it."""
    return torch.rand(shape, generator=keyed_generator(seed, step, f"draw:{k}"), dtype=torch.float64)


def _seeded(seed: int | None = 5, step: int = 3, bits: int = 32) -> RoundedExecution:
    return RoundedExecution(bits=bits, device=get_device("cpu"), mode="record", step=step, seed=seed)


def test_bernoulli_draws_are_ones_below_p_from_the_seeds_stream_in_the_order_drawn() -> None:
    x = torch.empty(4, 6, dtype=torch.float64)
    probs = torch.linspace(0.05, 0.95, 24, dtype=torch.float64).reshape(4, 6)
    with _seeded():
        first = x.bernoulli_(0.3).clone()
        second = torch.bernoulli(x, 0.7)
        third = torch.bernoulli(probs)
        fourth = x.bernoulli_(probs[0]).clone()  # (a probability per column, broadcast)
    assert torch.equal(first, (_uniform(5, 3, 0, (4, 6)) < 0.3).double())
    assert torch.equal(second, (_uniform(5, 3, 1, (4, 6)) < 0.7).double())
    assert torch.equal(third, (_uniform(5, 3, 2, (4, 6)) < probs).double())
    assert torch.equal(fourth, (_uniform(5, 3, 3, (4, 6)) < probs[0]).double())
    assert not torch.equal(first, (_uniform(5, 3, 1, (4, 6)) < 0.3).double())  # (each draw its own stream)


def test_native_dropout_keeps_with_probability_one_minus_p_and_scales_by_one_rounded_product() -> None:
    x = round_to_grid(torch.randn(5, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64), 32)
    with _seeded(seed=9, step=1):
        out, mask = torch.native_dropout(x, 0.3, True)
        same, ones = torch.native_dropout(x, 0.3, False)
        zeros, _ = torch.native_dropout(x, 1.0, True)
    keep = _uniform(9, 1, 0, (5, 7)) < 0.7
    assert torch.equal(mask, keep) and torch.equal(ones, torch.ones_like(keep)) and torch.equal(same, x)
    assert torch.equal(out, round_to_grid((x * keep.double()) * (1 / 0.7), 32))
    assert not zeros.any()


def test_dropout_modules_draw_the_same_masks_on_every_device_and_other_masks_at_other_steps() -> None:
    x = round_to_grid(torch.randn(8, 6, 4, 4, generator=torch.Generator().manual_seed(1)), 19)
    drops = [nn.Dropout(0.4), nn.Dropout2d(0.4), nn.AlphaDropout(0.4)]

    def masked(device: str, step: int) -> list[torch.Tensor]:
        with RoundedExecution(bits=19, device=get_device(device), mode="record", step=step, seed=2):
            return [d(x) for d in drops]

    want = masked("cpu", 1)
    assert all(torch.equal(a, b) for dev in ("emu:splitk8-tree", "emu:lanes8-butterfly")
               for a, b in zip(want, masked(dev, 1)))
    assert not any(torch.equal(a, b) for a, b in zip(want, masked("cpu", 2)))
    assert all(not torch.equal(a, x) for a in want)  # (every module dropped something)


def test_noise_draws_are_the_seeds_stream_rounded_onto_the_grid_in_the_dtype_asked() -> None:
    x = torch.zeros(3, 4, dtype=torch.float64)
    with _seeded(seed=8, step=2):
        normal, uniform = torch.randn_like(x), torch.rand_like(x)
        made, made32 = torch.randn(2, 5, dtype=torch.float64), torch.rand(2, 5, dtype=torch.float32)
        shifted = torch.empty(3, 4, dtype=torch.float64).normal_(1.5, 0.25)
        spread = torch.empty(6, dtype=torch.float64).uniform_(-2.0, 3.0)
    kinds = [("normal", (3, 4)), ("uniform", (3, 4)), ("normal", (2, 5)), ("uniform", (2, 5)), ("normal", (3, 4)),
             ("uniform", (6,))]  # (the step's draws in order)
    draws = [_uniform(8, 2, k, shape) if kind == "uniform" else
             torch.randn(shape, generator=keyed_generator(8, 2, f"draw:{k}"), dtype=torch.float64)
             for k, (kind, shape) in enumerate(kinds)]
    grid = [round_to_grid(d, 32) for d in draws]
    assert torch.equal(normal, grid[0]) and torch.equal(uniform, grid[1]) and torch.equal(made, grid[2])
    assert made32.dtype == torch.float32 and torch.equal(made32.double(), grid[3])
    assert torch.equal(shifted, round_to_grid(round_to_grid(grid[4] * 0.25, 32) + 1.5, 32))
    assert torch.equal(spread, round_to_grid(round_to_grid(grid[5] * 5.0, 32) - 2.0, 32))
    # a uniform value that rounds up to 1 stays below it: the grid's largest value under 1
    ends = Stream(0, 0, 32).on_grid(torch.tensor([1 - 2.0**-30, 0.5], dtype=torch.float64), below_one=True)
    assert ends.tolist() == [1 - 2.0**-24, 0.5]
    assert Stream(0, 0, 19).on_grid(torch.tensor([1 - 2.0**-13]), below_one=True).tolist() == [1 - 2.0**-11]


def test_draws_without_a_seed_or_with_a_generator_of_their_own_are_refused_by_name() -> None:
    x = torch.zeros(3, 3, dtype=torch.float64)
    with pytest.raises(UnsupportedOpError, match=r"aten.bernoulli_.float.*give RoundedExecution a seed"):
        with _seeded(seed=None):
            nn.Dropout(0.5)(x)
    with pytest.raises(UnsupportedOpError, match=r"aten.bernoulli.p.*a generator of its own"):
        with _seeded():
            torch.bernoulli(x, 0.5, generator=torch.Generator())


def test_exponential_noise_is_minus_log1p_of_minus_a_grid_uniform_over_lambda_each_operation_rounded() -> None:
    x = torch.empty(3, 4, dtype=torch.float64)
    with _seeded(seed=9, step=4):
        got = x.exponential_(2.5).clone()
        gumbel = [torch.nn.functional.gumbel_softmax(torch.zeros(2, 5, dtype=torch.float64), tau=0.5)]
    u = Stream(9, 4, 32).on_grid(_uniform(9, 4, 0, (3, 4)), below_one=True)
    want = round_to_grid(-round_to_grid(torch.log1p(-u), 32) / 2.5, 32)
    assert torch.equal(got, want) and (got >= 0).all()
    for device in ("emu:splitk8-tree", "emu:lanes8-butterfly"):  # (F.gumbel_softmax's noise: the same on every device)
        with RoundedExecution(bits=32, device=get_device(device), mode="record", step=4, seed=9):
            torch.empty(3, 4, dtype=torch.float64).exponential_(2.5)
            gumbel.append(torch.nn.functional.gumbel_softmax(torch.zeros(2, 5, dtype=torch.float64), tau=0.5))
    assert all(torch.equal(g, gumbel[0]) for g in gumbel[1:])


def test_rrelu_draws_its_slopes_from_the_seed_in_training_and_takes_their_mean_in_evaluation() -> None:
    # training: where x <= 0 the slope lower + (upper - lower) u, each operation rounded, times x; the slopes (1
    # elsewhere) kept for the backward pass, whose gradient is grad times them. Evaluation draws nothing: no seed
    x = round_to_grid(torch.randn(4, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64), 32)
    x[0, 0] = 0.0
    leaf = x.clone().requires_grad_()
    with _seeded(seed=6, step=1):
        out = torch.nn.functional.rrelu(leaf, 0.1, 0.3, training=True)
        (out * 3.0).sum().backward()
    u = Stream(6, 1, 32).on_grid(_uniform(6, 1, 0, (4, 5)), below_one=True)
    slopes = round_to_grid(round_to_grid(u * (0.3 - 0.1), 32) + 0.1, 32)
    assert torch.equal(out, torch.where(x <= 0, round_to_grid(x * slopes, 32), x))
    assert torch.equal(leaf.grad, torch.where(x <= 0, round_to_grid(3.0 * slopes, 32), 3.0))
    with RoundedExecution(bits=32, device=get_device("cpu"), mode="record"):
        mean = torch.nn.functional.rrelu(x, 0.1, 0.3, training=False)
    assert torch.equal(mean, torch.where(x > 0, x, round_to_grid(x * 0.2, 32)))
