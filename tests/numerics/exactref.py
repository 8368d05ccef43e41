"""Independent references for vtrain.exactmath: brute-force Fraction rounding and naive 300-bit mpmath.

Nothing here shares code with the module under test: rounding uses numref.spacing and Fraction's own
half-to-even `round`, and the functions are the textbook formulas evaluated at 300 bits (enough for
every case the tests use: none cancels more than ~100 bits or sits closer than 2^-150 to a boundary).
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath

from numref import grid_max, spacing

REF_PREC = 300


def ref_round_q(q: Fraction, m: int) -> float | None:
    """RNE of the rational q on the m-bit grid; None when it overflows; -0 gives +0.0."""
    a = abs(q)
    # numref.spacing goes through float: outside float64's range answer directly (the grid's smallest
    # midpoint is 2^-150 and its largest value below 2^128, so these are far from any boundary).
    if a < Fraction(1, 2**1000):
        return 0.0
    if a > 2**1000:
        return None
    s = spacing(a, m)
    n = round(a / s)  # half-to-even
    res = n * s
    if res > grid_max(m):
        return None
    return float(res) if q >= 0 else -float(res) + 0.0


def mp_fraction(v: mpmath.mpf) -> Fraction:
    """The exact value of an mpf as a Fraction (from its raw sign, mantissa, exponent)."""
    sign, man, exp, _ = v._mpf_
    f = Fraction(int(man)) * Fraction(2) ** int(exp)
    return -f if sign else f


def mp_value(fn: str, args: tuple[float, ...], exponent: float | None = None) -> mpmath.mpf:
    """The textbook formula for fn at REF_PREC bits."""
    mp = mpmath.mp
    with mpmath.workprec(REF_PREC):
        x = mp.mpf(args[-1])
        if fn in ("exp", "log", "tanh", "expm1", "log1p", "erf", "erfc", "erfinv", "sin", "cos", "tan", "asin", "acos",
                  "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "digamma", "sqrt"):
            return getattr(mp, fn)(x)  # (mpmath's functions of the same names)
        if fn == "exp2":
            return mp.power(2, x)
        if fn == "sigmoid":
            return 1 / (1 + mp.exp(-x))
        if fn == "lgamma":
            return mp.loggamma(x)
        if fn == "trigamma":
            return mp.psi(1, x)
        if fn == "log2":
            return mp.log(x, 2)
        if fn == "log10":
            return mp.log(x, 10)
        if fn == "atan2":  # (IEEE's signed zeros, which mpmath has not: atan2(+-0, x) is +-pi for x < 0 and -0)
            y = args[0]
            if y == 0:
                return mp.pi * math.copysign(1, y) if math.atan2(y, args[1]) else mp.mpf(0)
            return mp.atan2(mp.mpf(y), x)
        if fn == "rsqrt":
            return 1 / mp.sqrt(x)
        if fn == "pow":
            return mp.power(x, mp.mpf(exponent))
        if fn == "gelu":
            return x * mp.ncdf(x)
        k = mp.sqrt(2 / mp.pi)
        a = mp.mpf(44715) / 10**6
        u = k * (x + a * x**3)
        if fn == "gelu_tanh":
            return x / 2 * (1 + mp.tanh(u))
        g = mp.mpf(args[0])
        if fn == "gelu_backward":
            return g * (mp.ncdf(x) + x * mp.npdf(x))
        if fn == "gelu_tanh_backward":
            du = k * (1 + 3 * a * x * x)
            t = mp.tanh(u)
            return g * ((1 + t) / 2 + x / 2 * (1 - t * t) * du)
    raise ValueError(fn)


def ref_correctly_rounded(
    fn: str, bits: int, args: tuple[float, ...], exponent: float | None = None
) -> float | None:
    """RNE of the 300-bit value on the grid (None: overflow)."""
    v = mp_value(fn, args, exponent)
    if v != 0 and abs(mpmath.log(abs(v), 2)) > 1100:  # e.g. exp(-1e30): a Fraction of it is too big
        return 0.0 if abs(v) < 1 else None
    return ref_round_q(mp_fraction(v), bits - 9)

