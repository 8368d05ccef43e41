"""vtrain.fused_binary against the two-pass way it replaces (torch's op, then the grid rounding): the same
bits on every layout it takes and None on every one it does not (tests/families/test_family_one_pass.py
trains with it and without)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_num_grid import _adversarial_fp64
from vtrain import fused, fused_binary, ops
from vtrain.devices import get_device
from vtrain.grid import GridOverflowError, grid_max, round_to_grid
from vtrain.rounding import NonFiniteError, RoundedExecution

aten = torch.ops.aten
OPS = [aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor]


def _hard(shape: tuple[int, ...], bits: int, seed: int, least: float = 0.0) -> torch.Tensor:
    """Grid values, ties and near-ties, subnormals and zeros of both signs, in shape: of magnitude below
    2^60, and at least `least` where that is not 0 (divisors: then no quotient leaves the grid)."""
    gen = np.random.default_rng(seed)
    pool = _adversarial_fp64(4000, bits - 9, gen)
    pool = pool[(np.abs(pool) < 2.0**60) & (np.abs(pool) >= least)]
    return torch.from_numpy(gen.choice(pool, int(np.prod(shape)))).reshape(shape)


def _two_pass(func: object, args: tuple, bits: int) -> torch.Tensor:
    return round_to_grid(func(*args), bits)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.int64), b.view(torch.int64))


# (x shape, y shape or a scalar): what a batch norm, a linear layer, an attention score and a loss scale do
LAYOUTS = {"same": ((8, 4, 6, 8), (8, 4, 6, 8)), "per-channel": ((8, 4, 6, 8), (1, 4, 1, 1)),
           "channel-first": ((1, 4, 1, 1), (8, 4, 6, 8)), "bias-row": ((48, 32), (32,)),
           "column": ((48, 32), (48, 1)), "outer": ((48, 1), (1, 32)), "0-d": ((8, 4, 6, 8), ()),
           "0-d-first": ((), (8, 4, 6, 8)), "python": ((8, 4, 6, 8), 0.1), "python-int": ((8, 4, 6, 8), 3),
           "long-line": ((3, 5000), (3, 5000))}


def _operands(func: object, layout: str, bits: int) -> tuple[torch.Tensor, torch.Tensor | float]:
    """LAYOUTS[layout]'s operands, of `_hard` values (a divisor's away from zero)."""
    xs, ys = LAYOUTS[layout]
    y = _hard(ys, bits, 2, least=2.0**-60 if func is aten.div.Tensor else 0.0) if isinstance(ys, tuple) else ys
    return _hard(xs, bits, 1), y


@pytest.fixture(autouse=True)
def _every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_binary, "MIN_ELEMENTS", 0)


@pytest.mark.parametrize("bits", [32, 24, 10])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("func", OPS, ids=lambda f: str(f))
def test_one_pass_gives_the_two_pass_bits(func: object, layout: str, bits: int) -> None:
    x, y = _operands(func, layout, bits)
    got = fused_binary.binary(func, (x, y), {}, bits - 9, grid_max(bits))
    assert got is not None and _same_bits(got, _two_pass(func, (x, y), bits))
    assert got.stride() == func(x, y).stride()  # torch's layout: later ops see the same tensor


@pytest.mark.parametrize("bits", [32, 24, 10])
@pytest.mark.parametrize("layout", [k for k, (_, ys) in LAYOUTS.items() if isinstance(ys, tuple)])
@pytest.mark.parametrize("func", [aten.tanh_backward.default, aten.sigmoid_backward.default], ids=str)
def test_tanh_and_sigmoid_backward_give_their_decompositions_bits(func: object, layout: str, bits: int) -> None:
    # (grad, output): the dispatch path computes vtrain.ops' decomposition op by op in torch, then rounds;
    # outputs of tanh and sigmoid and the hard values between -2 and 2 (whose squares leave no grid)
    xs, ys = LAYOUTS[layout]
    x, y = _hard(xs, bits, 3), _hard(ys, bits, 4)
    y = torch.where(y.abs() <= 2, y, round_to_grid(torch.tanh(y), bits))
    got = fused_binary.binary(func, (x, y), {}, bits - 9, grid_max(bits))
    want = round_to_grid(ops.classify(func, (x, y), {}).decomposed(x, y), bits)
    assert got is not None and _same_bits(got, want)


@pytest.mark.parametrize("func", OPS, ids=lambda f: str(f))
def test_broadcast_views_of_contiguous_tensors(func: object) -> None:
    # a mean's gradient (expanded over what it averaged) divided by the count, and views expanded in the
    # middle, on both sides
    g = _hard((1, 4, 1, 1), 32, 5, least=2.0**-60)
    rows = _hard((8, 1, 6, 8), 32, 6, least=2.0**-60)
    full = _hard((8, 4, 6, 8), 32, 7, least=2.0**-60)
    cases = [(g.expand(8, 4, 6, 8), 8192), (full, rows.expand(8, 4, 6, 8)), (rows.expand(8, 4, 6, 8), g),
             (g.expand(8, 4, 6, 8), rows.expand(8, 4, 6, 8)), (full[2:6], g.expand(4, 4, 6, 8))]
    for x, y in cases:
        got = fused_binary.binary(func, (x, y), {}, 23, grid_max(32))
        assert got is not None and got.stride() == func(x, y).stride() and _same_bits(got, _two_pass(func, (x, y), 32))


def test_a_layout_seen_before_reads_each_calls_own_operands() -> None:
    # The path works each pair of operand layouts out once (fused_binary._plan); every call must still read
    # its own operands: views of one shape and strides at other storage offsets (flat and broadcast), other
    # numbers and 0-d tensors, and a negated view, which this path resolves (torch resolves such views before
    # they reach a dispatch mode; called directly, the path takes them)
    full = _hard((6, 4, 6, 8), 32, 8, least=2.0**-60)
    rows = _hard((3, 1, 6, 8), 32, 9, least=2.0**-60)
    for func in OPS:
        for k in range(3):
            for x, y in [(full[k:k + 4], rows[k:k + 1].expand(4, 4, 6, 8)), (full[k:k + 4], 0.5 + k),
                         (full[k:k + 4], np.float64(3.0 - k)), (full[k:k + 4], torch.tensor(0.25 * (k + 1))),
                         (torch._neg_view(full[k:k + 4]), rows[k:k + 1])]:
                got = fused_binary.binary(func, (x, y), {}, 23, grid_max(32))
                assert got is not None and _same_bits(got, _two_pass(func, (x, y), 32)), (func, k)


def test_a_float32_zero_dim_operand_and_signed_zeros() -> None:
    x = torch.tensor([0.0, -0.0, 1.0, -1.0] * 64, dtype=torch.float64).reshape(16, 16)
    for y in (torch.tensor(-0.0, dtype=torch.float32), torch.tensor(0.0), -0.0):
        for func in (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor):
            got = fused_binary.binary(func, (x, y), {}, 23, grid_max(32))
            assert got is not None and _same_bits(got, _two_pass(func, (x, y), 32))


IN_PLACE = {aten.add.Tensor: aten.add_.Tensor, aten.sub.Tensor: aten.sub_.Tensor, aten.mul.Tensor: aten.mul_.Tensor,
            aten.div.Tensor: aten.div_.Tensor}


@pytest.mark.parametrize("bits", [32, 10])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("func", OPS, ids=lambda f: str(f))
def test_outputs_written_over_x_have_the_two_pass_bits(func: object, layout: str, bits: int) -> None:
    x, y = _operands(func, layout, bits)
    want = _two_pass(func, (x, y), bits)
    over = x.shape == want.shape  # x is the output's shape: the sum goes where x lies
    for op, into_x in ((func, True), (IN_PLACE[func], False)):  # autograd's sums (`into_x`), torch's in-place ops
        mine = x.clone()
        got = fused_binary.binary(op, (mine, y), {}, bits - 9, grid_max(bits), into_x)
        if over:
            assert got is mine and _same_bits(got, want)
            assert mine._version == into_x  # (a torch in-place op's write is counted above the dispatch)
        elif into_x:  # a fresh output, x as it was
            assert got is not None and got is not mine and _same_bits(got, want) and _same_bits(mine, x)
        else:  # an in-place op whose output would outgrow x: torch's error
            assert got is None and _same_bits(mine, x)


@pytest.mark.parametrize("func,y", [(aten.div.Tensor, 0.0), (aten.div.Tensor, 2.0**-1074),
                                    (aten.mul.Tensor, 1e300), (aten.add.Tensor, float("nan")),
                                    (aten.mul.Tensor, 2.0**127 * (2 - 2.0**-24))])
def test_values_off_the_grid_return_none(func: object, y: float) -> None:
    x = torch.ones(64, 64, dtype=torch.float64)
    x[5, 7] = 2.0  # one value only leaves the grid where y is the largest grid value
    assert fused_binary.binary(func, (x, y), {}, 23, grid_max(32)) is None
    with pytest.raises(GridOverflowError):
        _two_pass(func, (x, y), 32)
    with pytest.raises(GridOverflowError):  # written over x, whose values are gone: raised at once
        fused_binary.binary(func, (x.clone(), y), {}, 23, grid_max(32), True)


def test_a_negated_view_is_not_written_over() -> None:
    # (its memory holds the values' negations: numpy reads them resolved, into a copy)
    x, y = _hard((64, 64), 32, 5), _hard((64, 64), 32, 6)
    neg = torch._neg_view(x)
    got = fused_binary.binary(aten.add.Tensor, (neg, y), {}, 23, grid_max(32), True)
    assert got is not neg and _same_bits(got, _two_pass(aten.add.Tensor, (-x, y), 32))
    assert _same_bits(neg.resolve_neg(), -x) and neg.is_neg()


def test_layouts_it_does_not_take_return_none() -> None:
    x = torch.randn(64, 64, dtype=torch.float64)
    limit = grid_max(32)
    cases = [(aten.add.Tensor, (x, x.t()), {}),  # a strided view
             (aten.add.Tensor, (x, x), {"alpha": 2}),
             (aten.mul.Tensor, (x, x.float()), {}),  # float32: its own promotion rules
             (aten.mul.Tensor, (x.float(), 2.0), {}),
             (aten.mul.Tensor, (x, torch.ones(64, 64, dtype=torch.int64)), {}),
             (aten.mul.Tensor, (x, True), {}),
             (aten.mul.Tensor, (x, 2**53 + 1), {}),  # an int no float64 holds
             (aten.add_.Tensor, (x[:1].clone(), x), {}),  # in place, a broadcast that would grow x: torch's error
             (aten.add_.Tensor, (x[:1].expand(64, 64), x), {}),  # in place on an overlapping view: torch's error
             (aten.mul.Tensor, (x[:, ::2], 2.0), {}),  # every other column
             (aten.add.Tensor, (x, torch.ones(3, dtype=torch.float64)), {}),  # shapes that do not broadcast
             (aten.add.Tensor, (x, x), {"alpha": True}), (aten.add.Tensor, (x, x), {"alpha": 1 + 0j}),  # torch's errors
             (aten.add_.Tensor, (x, x[:1]), {}), (aten.mul_.Tensor, (x, x[0]), {}),  # in place on overlapping operands
             (aten.add.Tensor, (torch.ones(3, 0, dtype=torch.float64), 1.0), {}),  # empty outputs
             (aten.add.Tensor, (torch.ones(0, dtype=torch.float64), torch.ones(1, dtype=torch.float64)), {}),
             (aten.rsub.Tensor, (x, x), {}),
             (aten.mul.Tensor, (torch.tensor(2.0), torch.tensor(3.0)), {})]
    for func, args, kwargs in cases:
        assert fused_binary.binary(func, args, kwargs, 23, limit) is None, (func, kwargs)


def test_operands_whose_size_one_dims_lead_torch_to_another_layout_return_none() -> None:
    # Torch lays its output out by the operands' strides, size-1 dims' included: a pooled channels_last
    # tensor's product is channels_last, and an expanded one's, or a permuted size-1 view's, no row-major
    # tensor at all. This path writes row-major outputs only, so it must leave these to torch.
    pooled = torch.nn.functional.adaptive_avg_pool2d(
        torch.randn(2, 4, 3, 3, dtype=torch.float64).contiguous(memory_format=torch.channels_last), 1)
    permuted = torch.randn(3, 1, 1, dtype=torch.float64).permute(1, 2, 0)
    cases = [(pooled, 2.0), (pooled.expand(2, 4, 3, 1), 3.0),
             (torch.ones(1, 1, 1, dtype=torch.float64).expand(1, 3, 3), permuted)]
    for x, y in cases:
        theirs = aten.mul.Tensor(x, y)
        assert theirs.stride() != torch.empty(theirs.shape).stride()  # not the layout this path would write
        assert fused_binary.binary(aten.mul.Tensor, (x, y), {}, 23, grid_max(32)) is None


def test_small_outputs_keep_the_two_pass_way(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused_binary, "MIN_ELEMENTS", 1 << 17)
    x = torch.randn(1 << 16, dtype=torch.float64)
    assert fused_binary.binary(aten.mul.Tensor, (x, x), {}, 23, grid_max(32)) is None
    assert fused_binary.binary(aten.mul.Tensor, (x.repeat(2), 2.0), {}, 23, grid_max(32)) is not None


def test_in_place_ops_and_an_overflow_under_rounded_execution() -> None:
    x = _hard((32, 32), 32, 3)
    y = _hard((32,), 32, 4)
    want = _two_pass(aten.add.Tensor, (x, y), 32)
    with RoundedExecution(bits=32, device=get_device("cpu"), mode="plain") as rx:
        z = x.clone()
        z.add_(y)
    assert _same_bits(z, want)
    assert rx.stats["rounded"] == 32 * 32  # counted as the two-pass way counts them
    big = torch.full((32, 32), 2.0**127, dtype=torch.float64)
    with pytest.raises(NonFiniteError, match="aten.mul"), RoundedExecution(bits=32, device=get_device("cpu"),
                                                                           mode="plain"):
        big * 4.0
    # written where x lies, the values are gone: the error names the value's rounding, at once
    with pytest.raises(NonFiniteError, match=r"aten.mul_.*value inf"), \
            RoundedExecution(bits=32, device=get_device("cpu"), mode="plain"):
        big.mul_(4.0)


def test_the_path_obeys_the_kernels_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused, "ENABLED", False)
    x = torch.randn(64, 64, dtype=torch.float64)
    assert fused_binary.binary(aten.mul.Tensor, (x, x), {}, 23, grid_max(32)) is None


def test_an_operand_is_read_as_an_array_or_as_one_number() -> None:
    # (the loop's operand access: an array's value i, or a broadcast operand's one value at every i; the compiled
    # cases are covered above through the layouts "per-channel", "channel-first", "outer" and the scalars)
    assert fused_binary._item(np.array([1.5, -2.0]), 1) == -2.0 and fused_binary._item(0.25, 7) == 0.25
