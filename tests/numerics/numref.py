"""Exact scalar references (fractions.Fraction) for the grid, independent of the bit tricks under test."""

from __future__ import annotations

import math
from fractions import Fraction

MIN_EXP = -126


def spacing(a: Fraction, m: int) -> Fraction:
    """Grid spacing above the magnitude a >= 0."""
    if a == 0:
        return Fraction(2) ** (MIN_EXP - m)
    e = math.floor(math.log2(a))
    # log2 of a Fraction can be off by one at exact powers of two: correct it exactly.
    while Fraction(2) ** e > a:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    return Fraction(2) ** (max(e, MIN_EXP) - m)


def grid_max(m: int) -> Fraction:
    return (2 - Fraction(2) ** -m) * Fraction(2) ** 127


def ref_round(x: float, m: int) -> float | None:
    """RNE of x on the m-bit grid; None when it overflows."""
    f = Fraction(x)
    a = abs(f)
    q = spacing(a, m)
    n = round(a / q)  # Fraction.__round__ is half-to-even
    res = n * q
    if res > grid_max(m):
        return None
    return math.copysign(float(res), x)


def ref_neighbours(g: float, m: int) -> tuple[float, float]:
    """(lower, upper) grid neighbours of the grid value g."""
    f = Fraction(g)
    a = abs(f)
    up_mag = a + spacing(a, m)
    if a == 0:
        q = spacing(a, m)
        return float(-q), float(q)
    down_q = spacing(a, m)
    if a - down_q > 0 and spacing(a - down_q / 2, m) < down_q:
        down_q /= 2  # a power of two: the binade below is twice as fine
    down_mag = a - down_q
    if f > 0:
        return float(down_mag), float(up_mag) if up_mag <= grid_max(m) else math.inf
    return (-float(up_mag) if up_mag <= grid_max(m) else -math.inf), -float(down_mag)
