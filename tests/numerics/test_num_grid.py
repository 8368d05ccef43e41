"""round_to_grid / rev / grid_ulp against numpy's FP32 cast and an exact Fraction reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from numref import ref_neighbours, ref_round
from vtrain.grid import GridError, GridOverflowError, grid_max, grid_ulp, rev, round_to_grid, spacing_below, spacings_np

FP32_MAX = float(np.finfo(np.float32).max)


def _adversarial_fp64(n: int, m: int, gen: np.random.Generator) -> np.ndarray:
    """Grid values, exact ties, ties +-1 float64 ulp, subnormal-range and near-max values."""
    # random grid values across the whole exponent range (and the subnormal grid)
    e = gen.integers(-150, 128, n)
    mant = gen.integers(0, 2**m, n)
    g = np.ldexp(1.0 + mant / 2.0**m, e)
    g[e < -126] = gen.integers(0, 2**m, int((e < -126).sum())) * 2.0 ** (-126 - m)
    g = np.where(gen.random(n) < 0.5, -g, g)
    ulp = np.ldexp(1.0, np.maximum(np.frexp(np.abs(g))[1] - 1, -126) - m)
    ties = g + ulp / 2
    near = np.concatenate([np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf)])
    sub = gen.uniform(-(2.0**-126), 2.0**-126, n)
    top = float(grid_max(m + 9))
    big = np.concatenate([gen.uniform(top * 0.999, top, n // 4), [top, -top]])
    out = np.concatenate([g, ties, near, sub, big, [0.0, -0.0, 2.0**-126, -(2.0**-126)]])
    return out[np.abs(out) < (2 - 2.0 ** -(m + 1)) * 2.0**127]  # no overflow here; tested apart


def test_bits32_equals_numpy_fp32_cast_on_a_million_values() -> None:
    gen = np.random.default_rng(1)
    n = 1_000_000
    # random float64 bit patterns whose magnitude lies in FP32's range, plus constructed hard cases
    raw = np.ldexp(gen.random(n) + 0.5, gen.integers(-155, 128, n)) * np.where(gen.random(n) < 0.5, -1, 1)
    fp32 = gen.standard_normal(n // 4).astype(np.float32).astype(np.float64)
    spacing = np.abs(np.spacing(fp32.astype(np.float32)).astype(np.float64))
    ties = fp32 + spacing / 2
    sub = gen.integers(-(2**23), 2**23, n // 4) * 2.0**-149
    sub_ties = sub + 2.0**-150
    near_max = np.concatenate([np.nextafter(np.float64(FP32_MAX), 0) - gen.random(1000) * 1e30, [FP32_MAX]])
    x = np.concatenate([raw, ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf), sub, sub_ties,
                        near_max, -near_max])
    x = x[np.abs(x) < (2 - 2.0**-24) * 2.0**127]  # beyond that the cast overflows (tested apart)
    assert x.size >= 1_000_000
    got = round_to_grid(torch.from_numpy(x), 32).numpy()
    want = x.astype(np.float32).astype(np.float64)
    assert np.array_equal(got.view(np.int64), want.view(np.int64))


@pytest.mark.parametrize("bits", range(10, 32))
def test_round_equals_fraction_reference(bits: int) -> None:
    m = bits - 9
    x = _adversarial_fp64(300, m, np.random.default_rng(bits))
    got = round_to_grid(torch.from_numpy(x), bits).numpy()
    want = np.array([ref_round(float(v), m) for v in x])
    assert np.array_equal(got.view(np.int64), want.view(np.int64))
    # float32 input: the same grid, the same answers
    x32 = x.astype(np.float32)
    x32 = x32[np.isfinite(x32) & (np.abs(x32.astype(np.float64)) < float(grid_max(bits)))]
    got32 = round_to_grid(torch.from_numpy(x32), bits).numpy()
    want32 = np.array([ref_round(float(v), m) for v in x32], dtype=np.float32)
    assert np.array_equal(got32.view(np.int32), want32.view(np.int32))


@pytest.mark.parametrize("bits", [10, 19, 27, 32])
def test_rev_and_ulp_match_reference(bits: int) -> None:
    m = bits - 9
    x = _adversarial_fp64(200, m, np.random.default_rng(100 + bits))
    g = round_to_grid(torch.from_numpy(x), bits)
    g = g[g.abs() < grid_max(bits)]
    lower = rev(g, torch.zeros_like(g, dtype=torch.bool), bits).tolist()
    upper = rev(g, torch.ones_like(g, dtype=torch.bool), bits).tolist()
    ulp = grid_ulp(g, bits).tolist()
    for v, lo, hi, u in zip(g.tolist(), lower, upper, ulp):
        want_lo, want_hi = ref_neighbours(v, m)
        assert (lo, hi) == (want_lo, want_hi), v
        assert u == (hi - v if v >= 0 else v - lo), v
    if bits <= 31:  # float32 work: same neighbours
        g32 = g.to(torch.float32)
        up32 = rev(g32, torch.ones_like(g32, dtype=torch.bool), bits)
        assert torch.equal(up32.to(torch.float64), torch.tensor(upper, dtype=torch.float64))


@pytest.mark.parametrize("bits", [10, 19, 27, 32])
def test_numpy_spacings_are_the_torch_ones_bit_for_bit(bits: int) -> None:
    # the rounding log's candidate test uses the numpy form: any difference would change logs
    x = _adversarial_fp64(500, bits - 9, np.random.default_rng(200 + bits))
    g = round_to_grid(torch.from_numpy(x), bits)
    g = torch.cat([g[g.abs() < grid_max(bits)], torch.tensor([0.0, -0.0, 2.0**-126, -(2.0**-126), 1.0, -2.0])])
    for t in (g, g.to(torch.float32)):
        below, above = spacings_np(t.numpy(), bits)
        assert below.dtype == above.dtype == t.numpy().dtype
        assert np.array_equal(below, spacing_below(t, bits).numpy())
        assert np.array_equal(above, grid_ulp(t, bits).numpy())
    with pytest.raises(GridError):
        spacings_np(np.zeros(2, np.float16), bits)


def test_overflow_nan_and_inf_raise() -> None:
    for bits in (10, 19, 32):
        top = grid_max(bits)
        assert round_to_grid(torch.tensor([top, -top], dtype=torch.float64), bits).tolist() == [top, -top]
        assert round_to_grid(torch.tensor([top], dtype=torch.float32), bits).item() == top
        tie = (2 - 2.0 ** -(bits - 8)) * 2.0**127  # midpoint between max and 2^128: overflows
        for bad in (tie, -tie, math.inf, math.nan):
            with pytest.raises(GridOverflowError):
                round_to_grid(torch.tensor([1.0, bad], dtype=torch.float64), bits)
        with pytest.raises(GridOverflowError):
            rev(torch.tensor([top]), torch.tensor([True]), bits)
    with pytest.raises(GridError):
        round_to_grid(torch.zeros(3), 33)
    with pytest.raises(GridError):
        round_to_grid(torch.zeros(3, dtype=torch.float16), 16)


def test_no_double_rounding_via_fp32() -> None:
    # x just above the m=18 midpoint but within FP32's rounding of it: via FP32 it would become an exact
    # tie and round to even (down); straight from float64 it rounds up.
    m = 18
    x = 1.0 + 2.0**-m / 2 + 2.0**-40
    t = torch.tensor([x], dtype=torch.float64)
    assert round_to_grid(t, m + 9).item() == 1.0 + 2.0**-m
    assert round_to_grid(t.to(torch.float32).to(torch.float64), m + 9).item() == 1.0
