"""vtrain.exactdot (compiled exact dot products) against exactmath.rounded_dots and a Fraction reference.

Every comparison is exact, on the bit patterns (so +0 and -0 differ). Adversarial rows: grid midpoints
with a residual above, below and at zero; near ties; cancellation to zero; subnormal results; 2^100 and
2^-100 terms in one row; non-grid float64 factors (TwoProduct's low part nonzero); bits 32, 19, 10;
float32 and float64 operands; strided and transposed views; positions the kernel flags (huge, tiny,
non-finite) completed by the reference with its values or its errors. The kernel alone (`kernel`) is also
checked to flag nothing on the ordinary rows, so the fallback cannot hide a kernel bug. Finally the
resolvers of vtrain.resolve give the same bits with the kernel on and off.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from vtrain import exactdot, exactmath, resolve
from vtrain.grid import GridOverflowError, grid_max

aten = torch.ops.aten
BITS = [32, 19, 10]


def bits_of(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).view(np.int64)


def fraction_ref(a: np.ndarray, b: np.ndarray, bits: int, extra: np.ndarray | None = None) -> np.ndarray:
    out = []
    for i in range(a.shape[0]):
        s = sum((Fraction(float(u)) * Fraction(float(v)) for u, v in zip(a[i], b[i])), Fraction(0))
        if extra is not None:
            s += Fraction(float(extra[i]))
        out.append(exactmath.round_fraction(s, bits))
    return np.array(out)


def check(a: np.ndarray, b: np.ndarray, bits: int, extra: np.ndarray | None = None, flagged: bool = False) -> None:
    """New == exactmath == Fraction, bit for bit; the kernel alone flags nothing unless `flagged`."""
    new = exactdot.rounded_dots(a, b, bits, extra)
    assert np.array_equal(bits_of(new), bits_of(exactmath.rounded_dots(a, b, bits, extra)))
    assert np.array_equal(bits_of(new), bits_of(fraction_ref(a, b, bits, extra)))
    values, flags = exactdot.kernel(a, b, bits, extra)
    if not flagged:
        assert not flags.any()
        assert np.array_equal(bits_of(values), bits_of(new))
    else:
        assert flags.all()


def rows(*pairs: tuple[list[float], list[float]]) -> tuple[np.ndarray, np.ndarray]:
    k = max(len(p[0]) for p in pairs)
    a = np.zeros((len(pairs), k))
    b = np.zeros((len(pairs), k))
    for i, (u, v) in enumerate(pairs):
        a[i, :len(u)], b[i, :len(v)] = u, v
    return a, b


@pytest.mark.parametrize("bits", BITS)
def test_midpoints_decided_by_the_residual_sign(bits: int) -> None:
    m = bits - 9
    h = 2.0 ** -(m + 1)  # half a grid step at 1: 1 + h is a midpoint, 1 + 3h one whose even side is up
    tiny = 2.0**-40
    cases = []
    for base in (1.0, 1.0 + 2 * h):  # ties to even going down (1) and up (1 + 4h)
        for res in (tiny, -tiny, 0.0):  # S = midpoint + res * tiny: fsum gives the midpoint itself
            cases.append(([1.0, base - 1.0 + h, tiny], [1.0, 1.0, res]))
    a, b = rows(*cases)
    for sign in (1.0, -1.0):
        check(sign * a, b, bits)
        new = exactdot.rounded_dots(sign * a, b, bits)
        assert new[0] == sign * (1 + 2 * h) and new[1] == sign * 1.0 and new[2] == sign * 1.0
        assert new[5] == sign * (1 + 4 * h)


@pytest.mark.parametrize("bits", BITS)
def test_near_ties_cancellation_subnormals_and_range(bits: int) -> None:
    m = bits - 9
    h = 2.0 ** -(m + 1)
    a, b = rows(
        ([1.0, h, 2.0**-30], [1.0, 1.0, 2.0**-30]),  # just above a midpoint (fsum sees it)
        ([1.0, h, -(2.0**-30)], [1.0, 1.0, 2.0**-30]),  # just below
        ([3.0, 3.0, 0.5], [1.5, -1.5, 0.0]),  # cancels to exactly zero: +0
        ([-3.0, 3.0], [1.5, 1.5]),
        ([2.0**-70, 2.0**-75], [1.5 * 2.0**-70, 2.0**-75]),  # subnormal on the grid
        ([2.0**-75], [2.0**-75 * 1.5]),  # a subnormal midpoint or below the smallest step
        ([2.0**50, 2.0**-50, -(2.0**50)], [2.0**50, 2.0**-50, 2.0**50]),  # 2^100 cancels, 2^-100 stays
        ([2.0**50, 2.0**-50, 1.0], [2.0**50, 2.0**-50, -1.0]),  # 2^100 + 2^-100 - 1
        ([2.0**-100], [-(2.0**-100)]),  # a negative value rounding to zero: +0
    )
    check(a, b, bits)
    assert bits_of(exactdot.rounded_dots(a, b, bits))[2] == 0  # +0, not -0
    assert bits_of(exactdot.rounded_dots(a, b, bits))[8] == 0
    assert exactdot.rounded_dots(a, b, bits)[6] == 2.0**-100


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_random_rows_with_ties_and_extra(bits: int, dtype: type) -> None:
    gen = np.random.default_rng(bits)
    for k in (1, 7, 64, 300):
        a = (gen.standard_normal((40, k)) * 2.0 ** gen.integers(-60, 60, (40, k))).astype(dtype)
        b = gen.integers(-16, 17, (40, k)).astype(dtype) / 16  # quantised: many exact ties at 10 bits
        extra = exactdot.rounded_dots(a, b, bits)[::-1].copy()  # grid values of similar size
        check(a, b, bits)
        check(a, b, bits, extra)
        check(b, b, bits, -extra)


def test_non_grid_float64_factors() -> None:
    gen = np.random.default_rng(7)
    a = gen.standard_normal((30, 200)) * 2.0 ** gen.integers(-40, 40, (30, 200))
    b = gen.standard_normal((30, 200))
    assert not any(exactdot.short(row) for row in a)  # Dekker's low parts are nonzero here
    for bits in BITS:
        check(a, b, bits)
        # exact midpoints from non-grid factors: x * (1 + 2^-30) - x * 2^-30 = x, x a midpoint
        m = bits - 9
        x = 1 + 2.0 ** -(m + 1)
        check(np.array([[x, x, 2.0**-60]]), np.array([[1 + 2.0**-30, -(2.0**-30), 1.0 + 2.0**-52]]), bits)
        # the same beside a line of float32 values, first and last: each line's own flag decides the split
        check(np.array([[0.5, 0.25, 1.0], [x, x, 2.0**-60]]),
              np.array([[1.0, 2.0, 3.0], [1 + 2.0**-30, -(2.0**-30), 1.0 + 2.0**-52]]), bits)
        check(np.array([[x, x, 2.0**-60], [0.5, 0.25, 1.0]]),
              np.array([[1 + 2.0**-30, -(2.0**-30), 1.0 + 2.0**-52], [1.0, 2.0, 3.0]]), bits)


@pytest.mark.parametrize("bits", BITS)
def test_sums_added_in_pieces_round_as_whole_lines(bits: int) -> None:
    # accumulate adds a line's pieces to one set of partials and round_partials rounds them (vtrain.resolve's
    # weight gradients, image by image): the whole line's value, midpoints and their residuals included,
    # whatever the cuts (empty pieces too); a piece outside TwoProduct's range flags the sum
    m, h = bits - 9, 2.0 ** -(bits - 8)
    gen = np.random.default_rng(bits)
    a, b = rows(([1.0, 3 * h, 2.0**-40, 3.0, -3.0], [1.0, 1.0, 2.0**-40, 1.5, 1.5]),  # above the midpoint 1 + 3h
                ([1.0, h, -(2.0**-40), 2.0**-75], [1.0, 1.0, 2.0**-40, 0.0]),  # below one
                ([1.0, h, 0.0], [1.0, 1.0, 5.0]),  # on one: ties to even
                ([2.0**50, 2.0**-50, -(2.0**50)], [2.0**50, 2.0**-50, 2.0**50]),  # 2^100 cancels
                ([2.0**-70, 2.0**-75], [1.5 * 2.0**-70, 2.0**-75]),  # subnormal
                ([1 + 2.0**-(m + 1), 1 + 2.0**-(m + 1), 2.0**-60], [1 + 2.0**-30, -(2.0**-30), 1.0 + 2.0**-52]))
    extra = gen.standard_normal((8, 40)).astype(np.float32).astype(np.float64)
    a, b = np.vstack([np.pad(a, ((0, 0), (0, 40 - a.shape[1]))), extra]), np.vstack(
        [np.pad(b, ((0, 0), (0, 40 - b.shape[1]))), gen.integers(-8, 9, (8, 40)) / 8])
    whole = exactdot.rounded_dots(a, b, bits)
    assert np.array_equal(bits_of(whole), bits_of(fraction_ref(a, b, bits)))
    terms, q1, q2, box, parts, tmp = exactdot.workspace(a.shape[1])
    gmax = grid_max(bits)
    for cuts in ([], [0], [1], [2, 3], [3, 3, 20], list(range(0, 40, 7))):
        edges = [0, *cuts, a.shape[1]]
        for i in range(a.shape[0]):
            n = 0
            for lo, hi in zip(edges, edges[1:]):
                u, v = a[i, lo:hi].copy(), b[i, lo:hi].copy()
                n = exactdot.accumulate(u, v, exactdot.short(u) and exactdot.short(v), terms, q1, q2, box, parts, n)
                assert n >= 0
            value, done = exactdot.round_partials(parts, n, m, gmax, tmp)
            assert done and bits_of(value) == bits_of(whole[i]), (cuts, i)
    tiny = np.array([2.0**-500]), np.array([2.0**-450])  # a product below 2^-900
    assert exactdot.accumulate(*tiny, False, terms, q1, q2, box, parts, 1) == -1


def test_flagged_positions_fall_back_with_the_same_values() -> None:
    a, b = rows(
        ([2.0**600, -(2.0**600), 1.0], [2.0**500, 2.0**500, 1.0]),  # products overflow float64
        ([2.0**-500, 3.0], [2.0**-500, 0.0]),  # a product under TwoProduct's range
        ([2.0**996, -(2.0**996), 0.5], [2.0**-10, 2.0**-10, 1.0]),  # factors too big to split
    )
    check(a, b, 32, flagged=True)
    assert list(exactdot.rounded_dots(a, b, 32)) == [1.0, 0.0, 0.5]
    # a zero times a huge (finite) factor is an exact zero: not flagged, as in exactmath
    check(np.array([[2.0**1000, 1.0]]), np.array([[0.0, 0.5]]), 32)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_inputs_raise_the_reference_error(bad: float) -> None:
    a, b = rows(([1.0, 2.0], [1.0, 1.0]), ([bad, 1.0], [0.0, 1.0]))
    for args in ((a, b, 32, None), (b, a, 32, None), (b, b, 32, np.array([0.0, bad]))):
        with pytest.raises(exactmath.ExactDomainError) as ref:
            exactmath.rounded_dots(*args)
        with pytest.raises(exactmath.ExactDomainError) as new:
            exactdot.rounded_dots(*args)
        assert str(new.value) == str(ref.value)
        assert exactdot.kernel(*args)[1][1]


def test_overflow_raises_the_reference_error() -> None:
    a, b = rows(([1.0], [1.0]), ([2.0**100], [2.0**100]))
    with pytest.raises(GridOverflowError) as ref:
        exactmath.rounded_dots(a, b, 19)
    with pytest.raises(GridOverflowError) as new:
        exactdot.rounded_dots(a, b, 19)
    assert str(new.value) == str(ref.value)


def test_fsum_finish_is_math_fsum() -> None:
    gen = np.random.default_rng(3)
    cases = [[1.0, 2.0**-53, 2.0**-100], [1.0, -(2.0**-53), -(2.0**-100)], [1.0, 2.0**-53, -(2.0**-100)],
             [2.0**-1074, 1.0, 2.0**-53]]  # half-even fix-up cases (and one where it must not apply)
    for _ in range(200):
        vals = list(gen.standard_normal(8) * 2.0 ** gen.integers(-80, 80, 8))
        cases.append(vals)
    for vals in cases:
        parts = np.empty(exactdot._PARTS)
        n = 0
        for v in vals:
            n = exactdot._msum_add(parts, n, v)
        assert exactdot._fsum_finish(parts, n) == math.fsum(vals)


def layouts(dtype: torch.dtype) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(5)

    def g(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(torch.float32).to(dtype)

    x, w, gy = g(24, 40), g(30, 40), g(24, 30)
    return [("x@W^T", x, w.t()), ("g^T@x", gy.t(), x), ("g@W", gy, w)]


@pytest.mark.parametrize("dtype,bits", [(torch.float64, 32), (torch.float32, 19), (torch.float64, 10)])
def test_resolvers_match_the_reference_path(dtype: torch.dtype, bits: int) -> None:
    gen = np.random.default_rng(11)

    def both(fn, args: tuple, kwargs: dict, pos: np.ndarray) -> np.ndarray:
        exactdot.ENABLED = False
        try:
            ref = fn(args, kwargs, 0, pos, bits)
        finally:
            exactdot.ENABLED = True
        new = fn(args, kwargs, 0, pos, bits)
        assert np.array_equal(bits_of(new), bits_of(ref)), fn
        return new

    for _, a, b in layouts(dtype):
        n_out = a.shape[0] * b.shape[1]
        pos = gen.choice(n_out, 50, replace=False)
        both(resolve._mm, (a, b), {}, pos)
        bias = b[0].clone()
        both(resolve._addmm, (bias, a, b), {}, pos)
        both(resolve._addmm, (bias, a, b), {"beta": 2}, pos)  # the Fraction path either way
        both(resolve._bmm, (torch.stack([a, 2 * a]), torch.stack([b, b])), {}, gen.choice(2 * n_out, 60))
        both(resolve._mv, (a, b[:, 0]), {}, np.arange(a.shape[0]))
        both(resolve._dot, (a[0], b[:, 1]), {}, np.zeros(3, dtype=np.int64))
    # _rounded_dots under a convolution (gathered patches), with a bias
    x = layouts(dtype)[0][1].reshape(2, 3, 4, 40)
    w = x[:1, :, :2, :3].repeat(4, 1, 1, 1).contiguous()
    conv = resolve.RESOLVERS[aten.convolution.default]
    both(conv, (x, w, w[:, 0, 0, 0].clone(), [1, 2], [1, 0], [1, 1], False, [0, 0], 1), {},
         gen.choice(2 * 4 * 5 * 19, 80, replace=False))


def test_resolver_errors_are_unchanged() -> None:
    a = torch.ones(3, 4, dtype=torch.float64)
    b = torch.ones(4, 5, dtype=torch.float64)
    b[2, 1] = math.nan
    for enabled in (False, True):
        exactdot.ENABLED = enabled
        try:
            with pytest.raises(exactmath.ExactDomainError, match="NaN or infinity"):
                resolve._mm((a, b), {}, 0, np.array([0, 1, 6]), 32)
            assert list(resolve._mm((a, b), {}, 0, np.array([0, 2]), 32)) == [4.0, 4.0]
        finally:
            exactdot.ENABLED = True


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_empty_sums_are_their_addends(dtype: type) -> None:
    # K = 0: no term, the exact value is the addend (lines read in place for float64, copied for float32)
    a, b = np.zeros((1, 3, 0), dtype), np.zeros((1, 0, 2), dtype)
    got = exactdot.rounded_dots_at(a, b, np.zeros(2, int), np.array([0, 2]), np.array([1, 0]), 32,
                                   extra=np.array([1.5, 0.25]))
    assert got.tolist() == [1.5, 0.25]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("batch,row,col", [(2, 0, 0), (-1, 0, 0), (0, 3, 0), (1, -1, 0), (0, 0, 4), (0, 0, -1)])
def test_a_position_outside_the_operands_is_an_error(dtype: type, batch: int, row: int, col: int) -> None:
    # Each index against its own axis (numba reads unchecked): a batch, row or column out of range, also where the
    # flat line key would be in range ((0, 3) is batch 1's first row), raises, with the lines read in place (float64,
    # row-major) or copied (float32), and a transposed b (its columns in place) alike.
    gen = np.random.default_rng(5)
    a = gen.standard_normal((2, 3, 4)).astype(dtype)
    square = gen.standard_normal((2, 4, 4)).astype(dtype)
    for b in (square, square.transpose(0, 2, 1)):
        with pytest.raises(exactmath.ExactMathError, match="outside the operands"):
            exactdot.rounded_dots_at(a, b, np.array([0, batch]), np.array([0, row]), np.array([1, col]), 32)
        assert exactdot.rounded_dots_at(a, b, np.array([1]), np.array([2]), np.array([3]), 32).shape == (1,)


def _short_reference(x: float) -> bool:
    """exactdot.short's definition for one value, on the rational value: 0, or <= 24 significant bits and a magnitude
    in [2^-149, 2^128)."""
    if x == 0.0:
        return True
    if not math.isfinite(x) or not 2.0**-149 <= abs(x) < 2.0**128:
        return False
    q = abs(Fraction(x))
    scale = Fraction(2) ** (24 - math.frexp(abs(x))[1])  # the value as a 24-bit integer where it fits
    return (q * scale).denominator == 1


def test_short_values_are_those_whose_products_are_exact() -> None:
    f32 = np.float32
    edges = [0.0, -0.0, 1.0, 1 + 2.0**-23, 1 + 2.0**-24, 2.0**-149, 2.0**-150, 3 * 2.0**-149, 2.0**-126,
             2.0**-140 * (1 + 2.0**-20),  # 24 bits below float32's normal range, where float32 lacks it: short
             2.0**-140 * (1 + 2.0**-30), float(np.finfo(f32).max), 2.0**128, 2.0**200, 2.0**-200,
             -(2.0**127) * (2 - 2.0**-23), math.inf, -math.inf, math.nan, 5e-324, 1 / 3]
    gen = np.random.default_rng(7)
    found = gen.standard_normal(200).astype(np.float32) * np.float32(2.0) ** gen.integers(-140, 120, 200)
    values = edges + [float(v) for v in found] + [float(v) for v in gen.standard_normal(50)]
    for x in values:
        assert exactdot.short(np.array([x])) == _short_reference(x), x
    assert exactdot.short(found.astype(np.float64))  # every finite float32 value
    for lo in range(len(values)):  # a line is short where each of its values is, wherever the others lie
        line = np.array(values[lo:lo + 9])
        assert exactdot.short(line) == all(_short_reference(x) for x in line), line
    assert exactdot.short(np.zeros(0)) and exactdot.short(np.zeros(5))
    shorts = [x for x in values if _short_reference(x)]
    for u in shorts:
        for v in shorts:
            assert Fraction(u * v) == Fraction(u) * Fraction(v), (u, v)


def _level_sum(k1: int, k2: int, s: int) -> Fraction:
    return k1 * Fraction(2) ** (s - 52) + k2 * Fraction(2) ** (s - 104)


@pytest.mark.parametrize("s", [-970, -300, 0, 7, 960])
def test_two_levels_sum_every_term_within_104_bits_exactly(s: int) -> None:
    gen = np.random.default_rng(s & 0xFFFF)
    top = 2.0 ** (s - 1)
    cases = [
        np.full(2048, top), np.full(2048, -top),  # the largest terms a block may hold: sums of +-2^62
        np.full(2048, top * (1 - 2.0**-53)),
        2.0 ** (s - 53) * (2 * gen.integers(-50, 50, 301) + 1),  # ties at the first level's half unit
        np.concatenate([[top], 2.0 ** (s - 53) * (2 * gen.integers(-50, 50, 64) + 1) + 2.0 ** (s - 104)]),
        2.0 ** (s - 104) * gen.integers(-3, 4, 64) * 3,  # multiples of the second level's unit
        np.concatenate([[top], -top * 2.0**-60 * (1 + 2.0**-52) * np.arange(1, 40)]),
        gen.standard_normal(2048) * top / 8 * 2.0 ** -gen.integers(0, 50, 2048).astype(float),
        np.zeros(16), np.array([-0.0, -0.0, top]),
    ]
    for r in cases:
        k1, k2, z = exactdot._two_levels(r, r.size, s)
        below = any((Fraction(float(x)) / Fraction(2) ** (s - 104)).denominator != 1 for x in r)
        assert (z != 0) == below
        if not below:
            assert _level_sum(k1, k2, s) == sum(map(Fraction, r.tolist()), Fraction(0))
    # bits below 2^(s-104) are found (here one unit of 2^(s-105) under the largest term)
    if s - 105 >= -1074:
        r = np.array([top, 2.0 ** (s - 105)])
        assert exactdot._two_levels(r, 2, s)[2] != 0
        assert exactdot._two_levels(r[::-1], 1, s - 40)[2] == 0  # (only the first n terms are read)


def _partials_sum(parts: np.ndarray, n: int) -> Fraction:
    assert n >= 0
    return sum(map(Fraction, parts[:n].tolist()), Fraction(0))


@pytest.mark.parametrize("case", ["blocks", "bits-below-in-a-later-block", "huge", "tiny", "mixed", "largest",
                                  "odd-block-sum", "negative-largest", "negative-odd-block-sum", "subnormal-units"])
def test_distill_adds_the_exact_sum_by_blocks_or_by_sweeps(case: str) -> None:
    # exactdot.distill_into takes blocks of terms within 104 bits of the largest by `_two_levels` and the rest
    # (a block with bits below, exponents outside its range) by the ExtractVector sweeps: the partials' exact
    # sum is the terms' either way
    gen = np.random.default_rng(len(case))
    n = 5000
    r = gen.standard_normal(n) * 2.0 ** gen.integers(-30, 0, n).astype(float)
    if case == "bits-below-in-a-later-block":
        r[3000] = 2.0**-200
    elif case == "huge":
        r *= 2.0**990
    elif case == "tiny":
        r *= 2.0**-1000
    elif case == "mixed":
        r[::7] *= 2.0**-300
    elif case == "largest":  # each term 2^51 units of the first level: a block sums to 2^62
        r[:] = 2 - 2.0**-52
    elif case in ("odd-block-sum", "negative-odd-block-sum"):  # a block's +-(2^57 + 1) units, not one float64
        r[:] = 0.0
        r[:128], r[128] = 1.0, 2.0**-50
        r *= -1.0 if case.startswith("negative") else 1.0
    elif case == "negative-largest":
        r[:] = -(2 - 2.0**-52)
    elif case == "subnormal-units":  # the largest term near 2^-972, e = -970: both levels' units subnormal
        r = (gen.integers(-2**40, 2**40, n) | 1).astype(float) * 2.0**-1014
    want = sum(map(Fraction, r.tolist()), Fraction(0))
    terms, q1, q2, box, parts, _ = exactdot.workspace(n)
    terms[:n] = r
    parts[0] = 0.25  # partials already holding a sum
    count = exactdot.distill_into(terms, n, q1, q2, box, parts, 1)
    assert _partials_sum(parts, count) == want + Fraction(1, 4)
    assert exactdot._fsum_finish(parts, count) == math.fsum([*r.tolist(), 0.25])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_planes_are_tested_once_each_as_lines(dtype: type) -> None:
    gen = np.random.default_rng(3)
    t = gen.standard_normal((3, 4, 5, 6)).astype(np.float32).astype(dtype)[:, :, :, ::-1]  # (strided planes)
    if dtype == np.float64:
        t[1, 2, 3, 4], t[2, 0, 0, 0] = 1 / 3, 2.0**-160
    t[0, 3, 4, 5] = np.inf
    known = np.full((3, 4), -1, np.int8)
    order = [(n, c) for n in range(3) for c in range(4)]
    for n, c in [order[i] for i in gen.permutation(len(order))]:
        want = exactdot.short(np.ascontiguousarray(t[n, c], dtype=np.float64).reshape(-1))
        assert exactdot.known_short_plane(t, n, c, known) == want and known[n, c] == want
    assert known.sum() == 12 - (3 if dtype == np.float64 else 1)
    t[1, 1, 0, 0] = np.nan  # tested once: a plane's answer is kept, not read again
    assert exactdot.known_short_plane(t, 1, 1, known) and known.sum() == 12 - (3 if dtype == np.float64 else 1)


@pytest.mark.parametrize("top,count", [(1024, 100), (1024, 0), (40, 40), (1 << 20, 100), (4096, 3000)])
def test_distinct_lines_are_numpys_unique_with_inverse(top: int, count: int) -> None:
    # a table of the lines where that is small beside the keys, else np.unique's sort: the same answer either way
    keys = np.random.default_rng(top + count).integers(0, top, count)
    uniq, inverse = exactdot.distinct(keys, top)
    want, want_inverse = np.unique(keys, return_inverse=True)
    assert uniq.tolist() == want.tolist() and inverse.tolist() == want_inverse.reshape(-1).tolist()
    assert inverse.dtype == np.int64 and np.array_equal(uniq[inverse], keys)
