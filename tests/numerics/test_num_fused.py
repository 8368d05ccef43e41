"""The fused CPU kernels (vtrain.fused) against the torch path they replace: the same bits, the same
candidates, the same logs and states."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from test_num_grid import _adversarial_fp64
from vtrain import fused, spare
from vtrain.devices import get_device
from vtrain.grid import grid_max, round_unchecked
from vtrain.rounding import RoundedExecution
from vtrain.spec import load_spec
from vtrain.state import state_hash
from vtrain.train import TrainingSession

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _values(bits: int, dtype: np.dtype) -> np.ndarray:
    x = _adversarial_fp64(2000, bits - 9, np.random.default_rng(bits))
    if dtype == np.float32:  # float32 work: its own ties, subnormals and near-max values
        x = x.astype(np.float32)
        x = np.concatenate([x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(-np.inf)),
                            np.array([1e-45, -1e-45, 0.0, -0.0], dtype=np.float32)])
    return x[np.abs(x) < (2 - 2.0 ** -(bits - 8)) * 2.0**127]  # beyond, values round off the grid (tested apart)


def _both_ways(kernel: Callable[..., tuple[int, int]], x: np.ndarray) -> tuple[int, int, np.ndarray, np.ndarray]:
    """kernel(v, out, cand, held), a candidate kernel, into another array and in place (out = v) on copies of
    x: the same count, first off-grid position, candidates and rounding's bits (values off the grid as they
    were, for the error that names them), x untouched out of place, and held = x at the candidates either
    way. Returns (count, first bad position, the rounding, the candidates)."""
    v, out, cand, held = x.copy(), np.empty_like(x), np.empty(x.size, np.int64), np.empty_like(x)
    count, bad = kernel(v, out, cand, held)
    assert np.array_equal(v.view(np.uint8), x.view(np.uint8))
    assert np.array_equal(held[:count].view(np.uint8), x[cand[:count]].view(np.uint8))
    w, cand_w, held_w = x.copy(), np.empty(x.size, np.int64), np.empty_like(x)
    assert kernel(w, w, cand_w, held_w) == (count, bad)
    assert np.array_equal(w.view(np.uint8), out.view(np.uint8))
    assert np.array_equal(cand_w[:count], cand[:count])
    assert np.array_equal(held_w[:count].view(np.uint8), held[:count].view(np.uint8))
    off = ~(np.abs(x.astype(np.float64)) <= grid_max(32))  # (beyond every grid's largest value, or NaN)
    assert np.array_equal(out[off].view(np.uint8), x[off].view(np.uint8))
    return count, bad, out, cand[:count]


def _cases(bits: list[int]) -> list[tuple[int, type]]:
    # float32 work at bits = 32 is never rounded (every float32 is a grid value): no such case
    return [(b, d) for b in bits for d in (np.float64, np.float32) if not (d == np.float32 and b == 32)]


@pytest.mark.parametrize("bits,dtype", _cases([10, 16, 19, 24, 31, 32]))
def test_round_into_equals_the_torch_rounding_bit_for_bit(bits: int, dtype: np.dtype) -> None:
    x = _values(bits, dtype)
    out = np.empty_like(x)
    assert fused.round_into(x, out, bits - 9, grid_max(bits)) == -1
    want = round_unchecked(torch.from_numpy(x), bits).numpy()
    assert np.array_equal(out.view(np.uint8), want.view(np.uint8))  # -0.0 stays -0.0 too
    assert fused.round_in_place(x, bits - 9, grid_max(bits)) == -1  # its own kernel
    assert np.array_equal(x.view(np.uint8), want.view(np.uint8))


@pytest.mark.parametrize("bits", [19, 32])
def test_off_grid_values_are_reported_at_their_first_position(bits: int) -> None:
    top = grid_max(bits)
    beyond = (2 - 2.0 ** -(bits - 9 + 1)) * 2.0**127  # the midpoint to 2^128 rounds to it
    for bad in (float("nan"), float("inf"), -float("inf"), beyond, -beyond, 2.0**130):
        x = np.array([1.0, top, -top, bad, 3.0, bad])
        assert fused.round_into(x, np.empty_like(x), bits - 9, top) == 3, bad
        y = np.array([1.0 + 2.0**-40, top, -top, bad, 3.0 - 2.0**-40, bad])
        assert fused.round_in_place(y, bits - 9, top) == 3, bad
        # the values off the grid stay as they were (for the error that names them), the others are rounded
        want = np.array([1.0, top, -top, bad, 3.0, bad])
        assert np.array_equal(y, want, equal_nan=True), (bad, y)
        e = np.zeros(1)
        count, first, out, _ = _both_ways(lambda *a: fused.round_near(a[0], e, 1.0, bits - 9, top, *a[1:]), y)
        assert first == 3, bad
        assert np.array_equal(out, want, equal_nan=True), (bad, out)  # rounded but for the values off the grid


@pytest.mark.parametrize("size", [1, 700, 3 * fused.NEAR_BLOCK])
def test_values_off_the_grid_in_a_short_block_stay_as_they_were_within_it(size: int) -> None:
    # The band kernels leave the values off the grid as they were (a NaN quieted), in place too, where the block's
    # values are kept in a whole NEAR_BLOCK buffer: a block shorter than that (a row's last, or the array's) writes
    # its own values only, and the memory after the output is untouched. (A finite value beyond the grid, whose
    # rounding is inf, shows which copy a value came from: the first block's, at a position past the short last
    # block's end, written there again by a loop over the whole buffer, would land in memory after the output.)
    # The matmul band's kernel takes the values as one row and as several (its blocks end at each row's end).
    top = grid_max(32)
    x = np.resize(np.array([1.0 + 2.0**-40, -3.0, 0.1]), size)
    x[-1], x[size // 2] = np.nan, -np.inf
    first = size - 1 if size == 1 else size // 2
    if size > 200:
        x[200], first = 1e39, 200
    m = 7 if size % 7 == 0 else 3 if size % 3 == 0 else 1  # (rows of 100 and of 512 values)
    band = np.full(size, 2.0**-30)
    kernels = [(32, lambda v, o, c, h: fused.round_near(v, band, 1.0, 23, top, o, c, h)),
               (32, lambda v, o, c, h: fused.round_near_relative(v, 2.0**-30, 0.0, 1.0, 0.0, 1.0, top, o, c, h,
                                                                -0.0)),
               # (the grid of any other bits: its own kernel, by blocks too)
               (19, lambda v, o, c, h: fused.round_near(v, band, 1.0, 10, grid_max(19), o, c, h))]
    for rows in (1, m):
        kernels.append((32, lambda v, o, c, h, rows=rows: fused.round_near_outer(
            v, np.full((1, rows), 2.0**-30), np.ones((1, size // rows)), np.zeros((1, size // rows)), 1.0, top, o, c,
            h, -0.0)))
    for bits, kernel in kernels:
        with np.errstate(over="ignore"):  # (1e39 rounds to inf: off the grid)
            want = round_unchecked(torch.from_numpy(x), bits).numpy().copy()
        off = ~(np.abs(want) <= grid_max(bits))
        want[off] = x[off]
        for in_place in (True, False):
            memory = np.full(size + fused.NEAR_BLOCK, 7.0)  # (the output, then a block that nothing may write)
            v = memory[:size] if in_place else x.copy()
            if in_place:
                v[:] = x
            cand, held = np.empty(size, np.int64), np.empty(size)
            _, bad = kernel(v, memory[:size], cand, held)
            assert bad == first
            assert np.array_equal(memory[:size], want, equal_nan=True) and (memory[size:] == 7.0).all()


@pytest.mark.parametrize("bits,dtype", _cases([10, 19, 24, 31, 32]))
def test_round_near_gives_the_torch_candidates(bits: int, dtype: np.dtype) -> None:
    # and values just above powers of two, rounding down onto them: there the spacing below r is half the
    # spacing above, so a value a quarter spacing or more above r is within a quarter of the lower boundary
    powers = 2.0 ** np.arange(-130.0, 120.0, 7.0)
    above = np.concatenate([powers * (1 + f * 2.0 ** -(bits - 9)) for f in (0.2, 0.26, 0.4, 0.49)]).astype(dtype)
    x = np.concatenate([_values(bits, dtype), above, -above])
    gen = np.random.default_rng(7)
    # bands from nothing to a few spacings, so every branch of the test is taken
    e = (np.abs(x) * 2.0 ** -(bits - 9) * gen.choice([0.0, 1e-9, 0.1, 0.3, 0.49, 0.5, 0.51, 2.0], x.size)).astype(dtype)
    rx = RoundedExecution(bits=bits, device=get_device("cpu"), mode="plain")
    for band in (e, e[:1]):
        count, bad, out, cand = _both_ways(lambda *a: fused.round_near(a[0], band, 2.0, bits - 9, grid_max(bits),
                                                                       *a[1:]), x)
        assert bad == -1
        v = torch.from_numpy(x)
        r = round_unchecked(v, bits)
        want = rx._candidates(v, r, torch.from_numpy(band).expand(v.shape) * 2.0).numpy()
        assert np.array_equal(out.view(np.uint8), r.numpy().view(np.uint8))
        if dtype == np.float64:  # the same float64 operations: the same set
            assert np.array_equal(cand[:count], want)
        else:  # float32 work: the kernel's test runs in float64, at least as wide as torch's float32 one
            assert set(want.tolist()) <= set(cand[:count].tolist())
            assert count <= want.size * 1.01 + 4


@pytest.mark.parametrize("bits", [19, 32])
def test_sparse_candidates_are_all_found(bits: int) -> None:
    # The kernels scan for candidates by blocks of values: lone candidates at block edges, a block with
    # exactly one, long runs with none, and an off-grid value far into the array must all come out right.
    gen = np.random.default_rng(bits)
    x = round_unchecked(torch.from_numpy(gen.standard_normal(20_000)), bits).numpy()
    lone = np.array([0, 511, 512, 1023, 1024, 5000, 12_345, 19_999])
    spacing = np.abs(x[lone]) * 2.0 ** -(bits - 9)  # at least the spacing below x, at most twice that
    x[lone] += 0.45 * spacing  # within a band of the boundary: candidates
    e = np.full(x.size, 2.0**-70)
    e[lone] = 0.1 * spacing
    rx = RoundedExecution(bits=bits, device=get_device("cpu"), mode="plain")
    v = torch.from_numpy(x)
    want = rx._candidates(v, round_unchecked(v, bits), torch.from_numpy(e) * 2.0).numpy()
    assert set(lone.tolist()) <= set(want.tolist())
    def near(*a: np.ndarray) -> tuple[int, int]:
        return fused.round_near(a[0], e, 2.0, bits - 9, grid_max(bits), *a[1:])

    count, bad, _, cand = _both_ways(near, x)
    assert (bad, cand.tolist()) == (-1, want.tolist())
    x[17_000] = np.inf
    assert _both_ways(near, x)[1] == 17_000
    assert fused.round_into(x, np.empty_like(x), bits - 9, grid_max(bits)) == 17_000


@pytest.mark.parametrize("bits,dtype", _cases([19, 32]))
def test_round_near_makes_zeros_positive_when_asked(bits: int, dtype: np.dtype) -> None:
    # plus = +0.0 (the exact resolution) turns every -0.0 of the rounding into +0.0 and nothing else; the
    # default -0.0 leaves the rounding as it is
    x = np.concatenate([_values(bits, dtype), np.array([-0.0, 0.0, -1e-60, 1e-60, -2.0**-151], dtype=dtype)])
    e = np.full(1, 1e-9, dtype=dtype)
    as_is, zeroed = np.empty_like(x), np.empty_like(x)
    cand, held = np.empty(x.size, np.int64), np.empty_like(x)
    want = fused.round_near(x, e, 2.0, bits - 9, grid_max(bits), as_is, cand, held)
    assert fused.round_near(x, e, 2.0, bits - 9, grid_max(bits), zeroed, cand, held, 0.0) == want
    negative_zero = (as_is == 0) & np.signbit(as_is)
    assert negative_zero.sum() >= 2  # -0.0 itself and a negative value below half the smallest subnormal
    assert not np.signbit(zeroed[as_is == 0]).any()
    assert np.array_equal(zeroed[~negative_zero].view(np.uint8), as_is[~negative_zero].view(np.uint8))


@pytest.mark.parametrize("shape", [(1, 7, 1300), (3, 5, 512), (2, 40, 3)])
def test_round_near_outer_equals_round_near_on_its_band(shape: tuple[int, int, int]) -> None:
    # The pre-filter's band built inside the kernel, rows[n, i] * cols[n, j] + add[n, j], against the same
    # band in memory (Prefilter.upper's expression): the same bits, candidates and first off-grid value,
    # across rows, batches and blocks of NEAR_BLOCK that end inside a row.
    gen = np.random.default_rng(sum(shape))
    v = _values(32, np.float64)
    v = np.resize(v, math.prod(shape))
    gen.shuffle(v)
    scale = np.abs(v).reshape(shape).mean(axis=2).clip(1e-30) * 2.0**-24  # bands of about a spacing
    rows = scale * gen.choice([0.0, 0.01, 0.3, 1.0], scale.shape)
    cols = gen.choice([0.0, 0.1, 0.5, 1.0, 2.0], (shape[0], shape[2]))
    add = gen.choice([0.0, 2.0**-1070, 1e-20], (shape[0], shape[2]))
    e = (torch.from_numpy(rows)[:, :, None] * torch.from_numpy(cols)[:, None, :] + torch.from_numpy(add)[:, None, :])
    top = grid_max(32)
    for bad in (None, 17, v.size - 1):
        x = v.copy()
        if bad is not None:
            x[bad] = np.inf
        want = _both_ways(lambda *a: fused.round_near(a[0], e.numpy().reshape(-1), 2.0, 23, top, *a[1:]), x)
        got = _both_ways(lambda *a: fused.round_near_outer(a[0], rows, cols, add, 2.0, top, *a[1:]), x)
        assert got[:2] == want[:2] and got[1] == (-1 if bad is None else bad)
        assert np.array_equal(got[2].view(np.int64), want[2].view(np.int64))
        assert np.array_equal(got[3], want[3])
        assert 0 < got[0] < x.size  # the bands leave both candidates and others


RELATIVE_OPS = [getattr(torch.ops.aten, name).default
                for name in ("tanh", "exp", "sigmoid", "log", "exp2", "sin", "cos", "tan", "asin", "acos", "atan",
                             "sinh", "cosh", "asinh", "acosh", "atanh", "log2", "log10", "erfc", "erfinv")]
_POSITIVE = (torch.ops.aten.log.default, torch.ops.aten.log2.default, torch.ops.aten.log10.default)


@pytest.mark.parametrize("func", RELATIVE_OPS, ids=str)
def test_round_near_relative_equals_round_near_on_the_torch_band(func: object) -> None:
    # A function's band built inside the rounding pass from its output, ((k |v|) + a) c + f (sigmoid's a
    # nonzero), against the torch bound in memory (vtrain.bounds.BOUNDS): the same bits of E at the candidates,
    # the same candidates, rounding and first off-grid value. Factors up to 2^28 make bands of up to ~a
    # spacing, so that blocks hold both candidates and others; signed zeros, subnormals and huge values too.
    from vtrain.bounds import BOUNDS, RELATIVE

    x = torch.from_numpy(_values(32, np.float64))
    y = func(x.abs() if func in _POSITIVE else x)
    y = y[torch.isfinite(y) & (y.abs() <= grid_max(32))].contiguous()  # (and inside the domain: NaN beyond)
    k, a, c, f = RELATIVE[func](torch.float64)
    (e,) = BOUNDS[func]((x,), {}, [y])
    v, top = y.numpy(), grid_max(32)
    for factor, bad in ((2.0, None), (2.0**20, None), (2.0**28, 17), (2.0**28, v.size - 1)):
        vv = v.copy()
        if bad is not None:
            vv[bad] = np.nan
        want = _both_ways(lambda *x: fused.round_near(x[0], e.numpy(), factor, 23, top, *x[1:]), vv)
        got = _both_ways(lambda *x: fused.round_near_relative(x[0], k, a, c, f, factor, top, *x[1:]), vv)
        assert got[:2] == want[:2] and got[1] == (-1 if bad is None else bad)
        assert np.array_equal(got[2].view(np.int64), want[2].view(np.int64))
        assert np.array_equal(got[3], want[3])
        at = fused.relative_at(vv[got[3]], k, a, c, f)  # (the values the kernel holds for the candidates)
        assert np.array_equal(at.view(np.int64), e.numpy()[got[3]].view(np.int64))
        if factor == 2.0**28:
            assert 0 < got[0] < vv.size
    # the exact resolution's +0 for -0 (`plus`), added as each kernel rounds
    vz, ez = v.copy(), e.numpy().copy()
    vz[:3] = -0.0  # (exp's, sigmoid's, cosh's and erfc's outputs hold none)
    ez[:3] = fused.relative_at(vz[:3], k, a, c, f)
    zeros = np.signbit(vz) & (vz == 0)
    for plus in (0.0, -0.0):
        want = _both_ways(lambda *x: fused.round_near(x[0], ez, 2.0, 23, top, *x[1:], plus), vz)
        got = _both_ways(lambda *x: fused.round_near_relative(x[0], k, a, c, f, 2.0, top, *x[1:], plus), vz)
        assert np.array_equal(got[2].view(np.int64), want[2].view(np.int64))
        assert (np.signbit(got[2][zeros]) == np.signbit(plus)).all()


# (inputs whose outputs are the float32 values of (0.1, 0.9) and the midpoints between them; cosh's times 16)
INVERSES = dict(zip(RELATIVE_OPS, (
    torch.atanh, torch.log, torch.logit, torch.exp, torch.log2, torch.asin, torch.acos, torch.atan, torch.sin,
    torch.cos, torch.tan, torch.asinh, lambda y: torch.acosh(16 * y), torch.sinh, torch.cosh, torch.tanh,
    torch.exp2, lambda y: torch.pow(10.0, y), lambda y: torch.erfinv(1 - y), torch.erf)))


@pytest.mark.parametrize("func", RELATIVE_OPS, ids=str)
def test_functions_log_the_same_with_the_band_built_in_the_kernel(func: object,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The engine on inputs whose outputs land within a few ulps of FP32 rounding boundaries (the inverse
    # function at midpoints between float32 values, and at float32 values): the same log, values and
    # replay whether the band comes from the kernel or from torch.
    from vtrain import ops
    from vtrain.roundlog import StepLog

    gen = torch.Generator().manual_seed(5)
    grid = (torch.rand(2000, generator=gen, dtype=torch.float64) * 0.8 + 0.1).float().double()
    half = (torch.nextafter(grid.float(), torch.tensor(2.0)).double() - grid) / 2
    x = INVERSES[func](torch.cat([grid + half, grid]))
    logs, outs = [], []
    for relative in (True, False):
        if not relative:
            monkeypatch.setitem(ops._TABLE, func, dataclasses.replace(ops._TABLE[func], bound_relative=None))
        with RoundedExecution(bits=32, device=get_device("cpu")) as rx:
            outs.append(func(x))
        logs.append(rx.log.to_bytes())
    assert torch.equal(outs[0], outs[1]) and logs[0] == logs[1]
    assert StepLog.from_bytes(logs[0]).sites[0].num_entries > 100
    with RoundedExecution(bits=32, device=get_device("cpu"), mode="replay", replay_log=StepLog.from_bytes(logs[0])):
        replayed = func(x)
    assert torch.equal(replayed, outs[0])


def test_round_near_outer_drops_zero_sums_with_no_nonzero_term() -> None:
    # Sparse operands (a relu layer's gradients and activations): many outputs are exact zeros because no
    # product has both factors nonzero; those go. Zeros from products that cancel exactly, and tiny
    # values, stay candidates.
    from vtrain import prefilter

    gen = torch.Generator().manual_seed(5)
    a = torch.randn(2, 6, 70, generator=gen, dtype=torch.float64)
    b = torch.randn(2, 70, 600, generator=gen, dtype=torch.float64)
    a[a.abs() < 1.6] = 0  # ~11 % nonzero: many disjoint supports
    b[b.abs() < 1.6] = 0
    a[0, 0], b[0, :, 0] = 0, 0
    a[0, 0, 3] = a[0, 0, 69] = 1.0  # row 0 against column 0: 1 * 2 + 1 * -2, an exact zero with terms
    b[0, 3, 0], b[0, 69, 0] = 2.0, -2.0
    v = torch.bmm(a, b)
    assert v[0, 0, 0] == 0
    support, nonzero = prefilter._nonzero_terms(a, b)
    x = v.numpy().reshape(-1).copy()
    x[1] = 1e-300  # not an exact zero: kept whatever the bitsets say
    rows, cols, add = np.full((2, 6), 1e-10), np.full((2, 600), 1.0), np.zeros((2, 600))
    top = grid_max(32)
    n_all, _, _, everything = _both_ways(lambda *a: fused.round_near_outer(a[0], rows, cols, add, 2.0, top, *a[1:]),
                                         x)
    n, bad, _, cand = _both_ways(lambda *a: fused.round_near_outer(a[0], rows, cols, add, 2.0, top, *a[1:],
                                                                   support=support), x)
    keep = (x[everything] != 0) | nonzero(torch.from_numpy(everything)).numpy()
    assert bad == -1 and np.array_equal(cand, everything[keep])  # (and the held values with them: _both_ways)
    assert 0 in cand and 1 in cand
    assert (x[everything] == 0).sum() > 1000 and n < n_all - 1000  # many dropped


@pytest.mark.parametrize("special", [None, float("nan"), float("inf"), -float("inf"), -1e300, 3.5e38, -1e-46])
def test_abs32_gives_the_float32_magnitudes_and_their_largest(special: float | None) -> None:
    x = torch.from_numpy(np.random.default_rng(3).standard_normal(5000) * 1e3)
    if special is not None:
        x[4321] = special
    mags, largest = fused.abs32(x)
    want = x.to(torch.float32).abs()
    assert torch.equal(mags.isnan(), want.isnan())
    assert torch.equal(mags.nan_to_num().view(torch.int32), want.nan_to_num().view(torch.int32))  # -0.0 too
    top = want.max().item()
    assert largest == (math.inf if top != top else top)
    t = x.reshape(50, 100).t()  # a transposed view: the kernel reads its contiguous transpose
    assert torch.equal(fused.abs32(t)[0].nan_to_num(), want.reshape(50, 100).t().nan_to_num())


def _run(spec_name: str, fused_on: bool, steps: int, monkeypatch: pytest.MonkeyPatch) -> tuple:
    monkeypatch.setattr(fused, "ENABLED", fused_on)
    monkeypatch.setattr(spare, "MIN_BYTES", 0)  # every device output's buffer is reused (vtrain.spare)
    spec = load_spec(EXAMPLES / spec_name)
    spec = dataclasses.replace(spec, steps=steps, warmup_steps=min(spec.warmup_steps, steps - 1))
    s = TrainingSession(spec, "cpu")
    out = [s.step(t, "record") for t in range(1, steps + 1)]
    return [r.log_bytes for r in out], [r.loss for r in out], state_hash(s.state_bytes())


@pytest.mark.parametrize("spec_name", ["mlp.toml", "cnn.toml", "scale/mlp.toml", "exact/mlp.toml", "exact/cnn.toml"])
def test_training_with_the_kernels_is_bit_identical_to_the_torch_path(spec_name: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The states must match by construction (the same roundings). The logs match because the two paths' E
    # differ only in their last bits (the kernels add |terms| in their own order: vtrain.inline,
    # fused.abs_sum), and no value of these runs lies that close to the edge of its band.
    logs_on, loss_on, state_on = _run(spec_name, True, 4, monkeypatch)
    logs_off, loss_off, state_off = _run(spec_name, False, 4, monkeypatch)
    assert logs_on == logs_off
    assert loss_on == loss_off
    assert state_on == state_off


# case: (bias shape or None for mm, addmm's keyword arguments)
INLINE_CASES = {"mm": (None, {}), "addmm": ((9,), {}), "addmm-scaled-bias2d": ((6, 9), {"beta": -0.5, "alpha": 3.0}),
                "addmm-bias-row": ((1, 9), {"alpha": -2.0}), "addmm-bias-column": ((6, 1), {}),
                "addmm-bias-scalar": ((), {"beta": 4.0}), "addmm-nan-bias-unused": ((9,), {"beta": 0.0})}


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("case", list(INLINE_CASES))
def test_small_matmul_band_built_in_the_kernel_bounds_the_exact_sums(case: str, transposed: bool) -> None:
    # vtrain.inline: a small matmul's E summed inside fused.round_near_mm, in the kernel's order. At every
    # candidate E must be the documented formula, gamma_k (1 + 2 gamma_k + 2^-20) times the exact sum of
    # |terms| plus k smallest normals (bounds._floor_unit), up to float64 rounding; every value within
    # factor * E of a rounding boundary must be a candidate, every other value must not; the rounding has
    # the plain rounding's bits.
    from fractions import Fraction

    from vtrain.bounds import gamma
    from vtrain.inline import INLINE

    gen = torch.Generator().manual_seed(len(case) + transposed)
    a = torch.randn(6, 13, generator=gen, dtype=torch.float64).to(torch.float32).double()
    b = torch.randn(13, 9, generator=gen, dtype=torch.float64).to(torch.float32).double()
    a[1] = 0.0
    a[2] *= 2.0**40
    a[3, :4] = 2.0**-1000  # tiny terms beside normal ones
    if transposed:  # a weight gradient's and a linear layer's operand layouts
        a, b = a.t().contiguous().t(), b.t().contiguous().t()
    shape, kwargs = INLINE_CASES[case]
    func = torch.ops.aten.mm.default if shape is None else torch.ops.aten.addmm.default
    bias = torch.randn(shape or (), generator=gen, dtype=torch.float64).float().double()
    if "nan" in case:  # beta = 0: torch ignores the bias, whatever it holds, and so must E
        bias.fill_(math.nan)
    args = (bias, a, b) if func is torch.ops.aten.addmm.default else (a, b)
    alpha, beta = abs(Fraction(kwargs.get("alpha", 1))), abs(Fraction(kwargs.get("beta", 1)))
    exact = a.abs().numpy(), b.abs().numpy()
    k = 13 + (3 if func is torch.ops.aten.addmm.default else 0)
    g = gamma(k, 2.0**-53)
    factor = 2.0

    def e_exact(i: int, j: int) -> Fraction:
        s = alpha * sum(Fraction(float(x)) * Fraction(float(y)) for x, y in zip(exact[0][i], exact[1][:, j]))
        if func is torch.ops.aten.addmm.default and beta:
            s += beta * abs(Fraction(float(bias.expand(6, 9)[i, j])))
        return Fraction(g) * Fraction(1 + 2 * g + 2.0**-20) * s + k * Fraction(2.0**-1022)

    inline = INLINE[func](args, kwargs, [func(*args, **kwargs)])
    assert inline is not None
    # values placed at chosen distances from a rounding boundary, in units of their own E: the exact
    # midpoint, inside and outside the band
    v = func(*args, **kwargs).reshape(-1).numpy().copy()
    r = v.astype(np.float32).astype(np.float64)
    up = np.nextafter(r.astype(np.float32), np.float32(np.inf)).astype(np.float64)
    offsets = [0.0, 0.5, -1.5, 1.9, 2.1, -3.0, 40.0]
    e_all = np.array([float(e_exact(p // 9, p % 9)) for p in range(v.size)])
    for p in range(v.size):
        mid = (Fraction(float(r[p])) + Fraction(float(up[p]))) / 2
        v[p] = float(mid + offsets[p % len(offsets)] * Fraction(float(e_all[p])))
    e_cand = np.empty(v.size)
    def near(*x: np.ndarray) -> tuple[int, int]:
        return fused.round_near_mm(x[0], inline.a, inline.b, inline.bias, inline.alpha, inline.beta, inline.scale,
                                   inline.floor, factor, grid_max(32), *x[1:], e_cand)

    count, bad, out, cand = _both_ways(near, v)
    assert bad == -1
    assert np.array_equal(out.view(np.int64), round_unchecked(torch.from_numpy(v), 32).numpy().view(np.int64))
    for t in range(count):
        want = e_exact(cand[t] // 9, cand[t] % 9)
        assert abs(Fraction(float(e_cand[t])) - want) <= want * 2.0**-40, cand[t]
    # (where float64 cannot hold the offset, beside a zero row's subnormal boundary, the value is the midpoint)
    ratio = [abs(Fraction(float(v[p])) - (Fraction(float(r[p])) + Fraction(float(up[p]))) / 2)
             / e_exact(p // 9, p % 9) for p in range(v.size)]
    inside = {p for p in range(v.size) if ratio[p] < factor * (1 - 2.0**-30)}
    far = {p for p in range(v.size) if ratio[p] > factor * (1 + 2.0**-30)}
    found = set(cand[:count].tolist())
    assert len(inside) > 10 and len(far) > 10
    assert inside <= found and not (far & found), (sorted(inside - found), sorted(far & found))


def _edge_of_band(mid: float, r: float, e: float, factor: float) -> float:
    """The float64 between r and the rounding boundary `mid` farthest from it that the candidate test still
    flags for the band e (the test of fused._near32, in numpy): a value its next float toward r is not
    (mid itself where the band reaches r)."""
    binade = 2.0 ** (np.frexp(abs(r) * (1 - 2.0**-24))[1] - 1) if r else 0.0
    half = max(binade * 2.0**-24, 2.0**-150)
    toward = np.float64(r)
    def near(x: float) -> bool:
        return abs(x - r) + e * factor >= half
    if near(toward):
        return mid
    x = np.float64(mid - e * factor)
    while not near(x):
        x = np.nextafter(x, mid)
    while near(np.nextafter(x, toward)) and np.nextafter(x, toward) != toward:
        x = np.nextafter(x, toward)
    return float(x)


def _full_band(a: np.ndarray, b: np.ndarray, bias: np.ndarray, alpha: float, beta: float, scale: float,
               floor: float) -> np.ndarray:
    """E everywhere for fused.round_near_mm's batches a (B, M, K) and b (B, K, N), flat: its sums in the kernel's
    order (k ascending from 0.0), in numpy."""
    e_all = np.empty(a.shape[:2] + b.shape[2:])
    with np.errstate(over="ignore", invalid="ignore"):
        for h, i in np.ndindex(*e_all.shape[:2]):
            s = np.zeros(e_all.shape[2])
            for t in range(a.shape[2]):
                s += np.abs(a[h, i, t]) * np.abs(b[h, t])
            if bias.size:
                e_all[h, i] = (s * alpha + beta * np.abs(bias[i])) * scale + floor
            else:
                e_all[h, i] = s * alpha * scale + floor
    return e_all.reshape(-1)


def _matches_full_band(a: np.ndarray, b: np.ndarray, bias: np.ndarray, alpha: float, beta: float, scale: float,
                       floor: float, factor: float, v: np.ndarray, e_all: np.ndarray) -> tuple[int, np.ndarray]:
    """fused.round_near_mm's count, first bad position, candidates, held values, rounding and E at the
    candidates are fused.round_near's given E everywhere (e_all), bit for bit, in place and out of place:
    (count, candidates)."""
    def kernel(x: np.ndarray, out: np.ndarray, cand: np.ndarray, held: np.ndarray) -> tuple[int, int]:
        return fused.round_near_mm(x, a, b, bias, alpha, beta, scale, floor, factor, grid_max(32), out, cand, held,
                                   e_cand)

    e_cand = np.empty(v.size)
    count, bad, out, cand = _both_ways(kernel, v)
    want = np.empty(v.size), np.empty(v.size, np.int64), np.empty(v.size)
    assert fused.round_near(v.copy(), e_all, factor, 23, grid_max(32), *want) == (count, bad)
    assert np.array_equal(cand, want[1][:count])
    assert np.array_equal(out.view(np.int64), want[0].view(np.int64))
    assert np.array_equal(e_cand[:count].view(np.int64), e_all[cand].view(np.int64))
    return count, cand


@pytest.mark.parametrize("layout", ["rows", "columns"])
@pytest.mark.parametrize("case", ["mm", "addmm-scaled-bias2d", "bmm"])
def test_small_matmul_band_pretest_drops_no_candidate_of_the_full_band(case: str, layout: str) -> None:
    # fused.round_near_mm sums E only where U (Cauchy-Schwarz, with a margin) flags a value. Its candidates,
    # E at them, rounding and first bad position must be those of E everywhere (`_matches_full_band`), with
    # values at the very edge of E's band: where U is tight (|b| proportional to |a|) and the sum cancels (a
    # band of ~2^18 ulps, so that a U short of E by 0.1 % drops edge values), where squares vanish (terms of
    # 2^-540 times 2^500), where they overflow beside a zero column (U NaN, E finite), subnormal terms, a zero
    # row, and inf and NaN operands. bmm: those operands, then the same reordered (each batch its own norms).
    from vtrain.inline import INLINE

    gen = torch.Generator().manual_seed(7 + len(case) + len(layout))
    m, k, n = 13, 9, 10
    a = torch.randn(m, k, generator=gen, dtype=torch.float64).float().double()
    b = torch.randn(k, n, generator=gen, dtype=torch.float64).float().double()
    a[1] = 0.0
    a[2] *= 2.0**-540
    b[:, 2] *= 2.0**500
    for j in range(3, 7):  # sum |a||b| = |a| |b|, and sum a b = 2^-12 of it
        signs = torch.where(torch.arange(k) % 2 == 0, 1.0, -1.0).double()
        rest = float((signs[:-1] * a[j, :-1] ** 2).sum())
        signs[-1] = -math.copysign(1.0, rest)
        a[j, -1] = math.sqrt(abs(rest) * (1 - 2.0**-12))
        b[:, j] = signs * a[j] * 2.0 ** (j - 5)
    a[10] *= 2.0**600  # squares past float64's range beside a zero column: U is NaN there, E is not
    b[:, 9] = 0.0
    a[11, 0] = math.inf
    a[12, 4] = math.nan
    if case == "bmm":
        a, b = torch.stack([a, a.flip(0)]), torch.stack([b, b.flip(1)])
    if layout == "columns":
        a, b = a.mT.contiguous().mT, b.mT.contiguous().mT
    func = {"mm": torch.ops.aten.mm.default, "bmm": torch.ops.aten.bmm.default}.get(case, torch.ops.aten.addmm.default)
    kwargs = INLINE_CASES[case][1] if case in INLINE_CASES else {}
    bias = torch.randn((m, n), generator=gen, dtype=torch.float64).float().double()
    args = (bias, a, b) if func is torch.ops.aten.addmm.default else (a, b)
    v0 = func(*args, **kwargs)
    inline = INLINE[func](args, kwargs, [v0])
    assert inline is not None
    terms = inline.a, inline.b, inline.bias, inline.alpha, inline.beta, inline.scale, inline.floor
    e_all = _full_band(*terms)
    factor = 2.0
    v = v0.reshape(-1).numpy().copy()
    placed = 0
    for p in range(v.size):
        if np.isfinite(e_all[p]) and abs(v[p]) <= grid_max(32):
            r = float(np.float32(v[p]))
            up = float(np.nextafter(np.float32(r), np.float32(np.inf)))
            v[p] = _edge_of_band(r + (up - r) / 2, r, float(e_all[p]), factor)
            placed += 1
    assert placed >= 80 * len(inline.a)
    count, cand = _matches_full_band(*terms, factor, v, e_all)
    # every kind of line above has candidates (the first batch's rows)
    assert {1, 2, 3, 4, 5, 6, 10} <= set((cand[cand < m * n] // n).tolist()) and count >= placed


def test_small_matmul_band_pretest_holds_where_the_norms_round_below_the_sum() -> None:
    # U's margin is for rounding: with |b_j| = |a_i| and integer terms, E's sum is s = sum a^2 exactly, while
    # fl(sqrt(s))^2 < s for these s (13, 26, ...). Where E spans half to all of half a float32 spacing, the sum
    # |v - r| + E at the band's very edge rounds to half a spacing, and a U one ulp short of E would round it
    # below (caught without the margin). Those pairs sit in the second block of 32 rows of a 64 x 16 output
    # (the kernel's blocks of 512 values).
    pairs = [(2, 3), (1, 5), (1, 6), (2, 5), (3, 3), (4, 6), (4, 7), (5, 6), (6, 6)]
    m, k, n = 64, 2, 16
    a = np.ones((m, k))
    b = np.ones((k, n)) * 0.5
    for j, (x, y) in enumerate(pairs):
        a[40 + j] = (-x, y)
        b[:, j] = (x, y)
    scale, floor, factor = 2.0**-52, 2.0**-1021, 1.0
    a3, b3, no_bias = a[None], b[None], np.zeros((0, 0))
    e_all = _full_band(a3, b3, no_bias, 1.0, 0.0, scale, floor)
    v = np.full(m * n, 3.0)
    for j, (x, y) in enumerate(pairs):
        p = (40 + j) * n + j
        e = e_all[p]
        top = 2.0 ** (math.ceil(math.log2(e)) + 24)  # r's binade: half a spacing is top 2^-24
        r = 1.5 * top
        v[p] = _edge_of_band(r + top * 2.0**-24, r, e, factor)
    count, cand = _matches_full_band(a3, b3, no_bias, 1.0, 0.0, scale, floor, factor, v, e_all)
    assert {(40 + j) * n + j for j in range(len(pairs))} <= set(cand.tolist())


@pytest.mark.parametrize("bits,dtype", _cases([10, 19, 24, 31, 32]))
def test_entry_classification_is_the_numpy_test_bit_for_bit(bits: int, dtype: np.dtype) -> None:
    # fused.classify (the trainer's entry test at its candidates) against RoundedExecution._find_entries'
    # numpy operations on spacings_np, in the same dtype: bands of either dtype placed at the distances that
    # decide, 0, subnormal and infinite bands, ties and subnormal values (an eighth of float32's smallest
    # spacings underflows in float32, not in float64)
    from vtrain.grid import spacings_np
    from vtrain.rounding import VALUE_FRACTION

    x = _values(bits, dtype)
    r = round_unchecked(torch.from_numpy(x), bits).numpy()
    toward_zero, away = spacings_np(r, bits)
    down, up = np.where(r < 0, away, toward_zero), np.where(r < 0, toward_zero, away)
    diff = x - r
    d_lo, d_hi = diff + down * 0.5, up * 0.5 - diff
    dist = np.minimum(d_lo, d_hi)
    rng = np.random.default_rng(bits)
    bands = [dist, np.nextafter(dist, np.inf), np.nextafter(dist, -np.inf), np.minimum(down, up) * VALUE_FRACTION,
             dist * rng.uniform(0.5, 2.0, x.size), np.zeros_like(dist), np.full_like(dist, 1e-45), np.full_like(dist, np.inf)]
    idx = rng.permutation(x.size)
    for ww in bands + [b.astype(np.float64) for b in bands]:
        ww = ww[idx]
        for inclusive in (False, True):  # (the trainer's test, and the exact resolution's)
            got = fused.classify(x[idx], r[idx], ww, bits - 9, VALUE_FRACTION, inclusive)
            within = dist[idx] <= ww if inclusive else dist[idx] < ww
            want = (d_lo[idx] <= d_hi[idx], within, ww >= (np.minimum(down, up) * VALUE_FRACTION)[idx])
            for g, w in zip(got, want):
                assert g.dtype == np.bool_ and np.array_equal(g, w)
    mixed = fused.classify(x[idx], r[idx], bands[4][idx], bits - 9, VALUE_FRACTION)
    assert all(0 < m.sum() < idx.size for m in mixed)  # (the test can tell a wrong decision either way)


@pytest.mark.parametrize("bits,dtype", _cases([19, 32]))
def test_the_logged_candidates_are_classify_s_in_order(bits: int, dtype: np.dtype) -> None:
    # fused.logged (the recording trainer's selection of its candidates' entries in one call) against classify and
    # numpy's selection, the band given at the candidates or built from a pre-filter's factors (U's two roundings,
    # then the output's dtype, as prefilter.Prefilter.at): the same positions, values, bands and decisions
    from vtrain.prefilter import Prefilter
    from vtrain.rounding import BAND_SLACK, VALUE_FRACTION

    rng = np.random.default_rng(bits)
    x = _values(bits, dtype)[:3 * 40 * 50]
    r = round_unchecked(torch.from_numpy(x), bits).numpy()
    idx = np.sort(rng.choice(x.size, x.size // 2, replace=False))
    spacing = np.abs(np.nextafter(r, np.inf) - r).astype(np.float64)
    rows, cols = rng.uniform(0, 1, (3, 40)), rng.uniform(0, 1, (3, 50))
    add = rng.uniform(0, 1e-3, (3, 50)) * spacing.max()
    rows *= 0.3 * np.median(spacing) / np.median(cols)  # (a fair share of the candidates within the band)
    pre = Prefilter(rows, cols, add, torch.Size((3, 40, 50)), torch.float32 if dtype == np.float32 else torch.float64)
    factor = 2 * BAND_SLACK
    band = pre.at(torch.from_numpy(idx)).numpy()
    ww = band * factor
    near_lo, within, wide = fused.classify(x[idx], r[idx], ww, bits - 9, VALUE_FRACTION)
    sel = np.flatnonzero(within)
    assert 0 < sel.size < idx.size  # (the case has candidates on both sides of the band)
    want = idx[sel], x[idx][sel], r[idx][sel], ww[sel], band[sel], near_lo[sel], wide[sel]
    for e in (band, pre):
        got = fused.logged(x[idx], r, idx, (rows, cols, add) if e is pre else e, factor, bits - 9, VALUE_FRACTION)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and np.array_equal(g.view(np.uint8), w.view(np.uint8))
    assert fused.logged(x[idx], r, idx, np.zeros(idx.size, np.float16), factor, bits - 9, VALUE_FRACTION) is None


def test_only_small_float64_matmuls_build_their_band_in_the_kernel() -> None:
    from vtrain.inline import INLINE, INLINE_PRODUCTS

    mm = torch.ops.aten.mm.default
    a, b = torch.ones(64, 64, dtype=torch.float64), torch.ones(64, 64, dtype=torch.float64)
    assert 64**3 <= INLINE_PRODUCTS and INLINE[mm]((a, b), {}, [a @ b]) is not None
    wide = torch.ones(64, INLINE_PRODUCTS // 64**2 + 1, dtype=torch.float64)  # one column past the limit
    assert INLINE[mm]((a, wide), {}, [a @ wide]) is None  # the full bound (or the pre-filter) takes it
    assert INLINE[mm]((a.float(), b.float()), {}, [a.float() @ b.float()]) is None  # float32 work
    addmm, bias = torch.ops.aten.addmm.default, torch.ones(64, dtype=torch.float64)
    # alpha 0: torch skips the products (an inf operand leaves no trace), where the kernel's 0 * inf would not
    assert INLINE[addmm]((bias, a, b), {"alpha": 0.0}, [torch.ops.aten.addmm.default(bias, a, b, alpha=0.0)]) is None
    empty = torch.ones(64, 0, dtype=torch.float64)
    assert INLINE[mm]((empty, empty.t()), {}, [empty @ empty.t()]) is None  # K = 0: no products to sum
    # a batch of matmuls: the same E (a (1, M, K) batch for mm), up to the same limit on all its products
    bmm, batch = torch.ops.aten.bmm.default, torch.ones(4, 64, 64, dtype=torch.float64)
    one, four = INLINE[mm]((a, b), {}, [a @ b]), INLINE[bmm]((batch, batch), {}, [batch @ batch])
    assert one.a.shape == (1, 64, 64) and four.a.shape == (4, 64, 64)
    assert (one.scale, one.floor, one.alpha) == (four.scale, four.floor, four.alpha)
    wide = torch.ones(INLINE_PRODUCTS // 64**3 + 1, 64, 64, dtype=torch.float64)
    assert INLINE[bmm]((wide, wide), {}, [wide @ wide]) is None


@pytest.mark.parametrize("bits,dtype", _cases([10, 19, 24, 32]))
def test_candidate_geometry_is_the_numpy_geometry_bit_for_bit(bits: int, dtype: np.dtype) -> None:
    # fused.geometry (v - r and the spacings below and above r, for the log's decisions) against
    # vtrain.grid.spacings_np's numpy operations, in the same dtype: powers of two, ties, subnormals,
    # signed zeros, infinities and NaN
    from vtrain.grid import spacings_np

    x = _values(bits, dtype)
    r = round_unchecked(torch.from_numpy(x), bits).numpy()
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan], dtype)
    x, r = np.concatenate([x, specials]), np.concatenate([r, specials])
    got = fused.geometry(x, r, bits - 9)
    toward_zero, away = spacings_np(r, bits)
    negative = r < 0
    with np.errstate(invalid="ignore"):
        want = (x - r, np.where(negative, away, toward_zero), np.where(negative, toward_zero, away))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and np.array_equal(g.view(np.uint8), w.view(np.uint8))
