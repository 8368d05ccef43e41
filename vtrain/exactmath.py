"""Exact arithmetic and correctly rounded functions onto the grid (issue 7, the `exact` policy).

Under the `exact` resolution policy every device-dependent op output is RNE_grid(exact value). The engine
finds the few ambiguous elements (FP64 value within its error bound of a rounding boundary) and asks
this module for their exact, correctly rounded values. Nothing here depends on the device, the thread
count or the summation order, so every machine computes the same bits.

Rounding (`round_fraction`): RNE of an exact rational onto the grid of vtrain/grid.py, in integer
arithmetic: find the binade, scale, divide with remainder, compare twice the remainder with the divisor.

Sums (`exact_sums`, `rounded_sums`): vectorised error-free distillation (Rump-Ogita-Oishi
ExtractVector, see `_distill_chunk`) turns each row into a few float64 values (two or three for grid
products) with exactly the same sum, in whole-chunk numpy passes; math.fsum of those few values gives
the correctly rounded float64 s1 of the exact sum S. Rounding S onto the grid needs only s1 and, rarely,
S itself: float64 rounding is monotone and every grid boundary (grid value or midpoint) is a float64, so
S and s1 lie on the same side of every boundary except when s1 is itself a midpoint, where the exact
residual decides (zero: an exact tie, to even). That is the double-rounding trap of "fsum, then round
to the grid"; `rounded_sums` checks for it and builds the exact Fraction only there.

Measured (2 shared cores, best of 3, grid values at bits = 32, µs per row; a Python loop of math.fsum
over the rows, for comparison, in the last column):
    K      rounded_sums  exact_sums  rounded_dots  exact_dots  rounded_dots(any float64)  fsum loop
    8          1.3          4.3          1.3          3.2              1.7                  1.0
    64         2.5          5.9          3.2          6.3              5.7                  7.7
    1024      16           19           29           32               60                  112
    4096      61           60          111          114              226                  438

Dot products (`exact_dots`, `rounded_dots`): an error-free TwoProduct (Dekker's product with Veltkamp's
split, vectorised in numpy) turns a*b into hi + lo exactly; the row's 2K terms are then summed exactly
as above. When every factor of a chunk has <= 26 significant bits (grid values have <= 24) the float64
products are already exact and the split is skipped. TwoProduct is exact when nothing overflows or
underflows: |a|, |b| < 2^995 (the split multiplies by 2^27 + 1) and 2^-900 <= |a*b| < 2^1000 (then every
partial product's last bit, >= ulp(a)*ulp(b) >= 2^-106 |a*b|, is above float64's 2^-1074), or a or b
zero. Rows holding any other product fall back to exact Fraction arithmetic, slow but correct, so every
finite input is accepted.

Transcendental functions (`correctly_rounded`): mpmath at growing precision (Ziv's strategy), see the
comment above `_PRECISIONS` for the argument; about 80-250 µs per element. They use a private mpmath
context (the caller's mpmath.mp precision is untouched), which makes them not thread-safe.

Errors: non-finite inputs and domain errors (log of a value <= 0, rsqrt of 0, ...) raise
ExactDomainError, a GridOverflowError, because on the device they produce inf/NaN and the run has
diverged; a value rounding beyond the largest grid value raises GridOverflowError as vtrain.grid does.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Sequence
from fractions import Fraction

import mpmath
import numpy as np

from vtrain.errors import VtrainError
from vtrain.grid import GridOverflowError, check_bits

_MIN_EXP = -126  # FP32's lowest normal exponent; the grid is uniform below 2^-126


class ExactMathError(VtrainError):
    """An exact-arithmetic call got arguments it cannot handle (wrong shape, unknown function)."""


class ExactDomainError(ExactMathError, GridOverflowError):
    """A non-finite input or a value outside a function's domain: on a device this is inf/NaN."""


# ---------------------------------------------------------------------------------------------------
# Rounding exact rationals


def _overflow(value: object, bits: int, where: str) -> GridOverflowError:
    return GridOverflowError(
        f"{where}: the exact value {value} rounds beyond the largest grid value (bits={bits}): "
        "the computation diverged"
    )


def round_fraction(q: Fraction | int | float, bits: int) -> float:
    """RNE of the exact rational q onto the `bits` grid; -0 gives +0.0; overflow -> GridOverflowError."""
    m = check_bits(bits)
    if isinstance(q, float):
        if not math.isfinite(q):
            raise ExactDomainError(f"round_fraction: {q!r} is not finite: the computation diverged")
        q = Fraction(q)
    num, den = q.numerator, q.denominator
    if num == 0:
        return 0.0
    a = abs(num)
    # e = floor(log2(a/den)): the bit lengths give it or one more.
    e = a.bit_length() - den.bit_length()
    if (a << max(-e, 0)) < (den << max(e, 0)):
        e -= 1
    s = max(e, _MIN_EXP) - m  # the grid spacing is 2^s
    if s >= 0:
        n, r = divmod(a, den << s)
        twice_r, d = 2 * r, den << s
    else:
        n, r = divmod(a << -s, den)
        twice_r, d = 2 * r, den
    if twice_r > d or (twice_r == d and n & 1):
        n += 1
    # Above 2^127 the spacing is 2^(127-m) and the largest value is (2^(m+1) - 1) spacings.
    if s > 127 - m or (s == 127 - m and n >= 1 << (m + 1)):
        raise _overflow(float(q) if e < 1000 else f"~2^{e}", bits, "round_fraction")
    return math.ldexp(n if num > 0 else -n, s)


def round_fractions(qs: Sequence[Fraction], bits: int) -> np.ndarray:
    """round_fraction of each rational; a float64 array."""
    return np.array([round_fraction(q, bits) for q in qs], dtype=np.float64)


def _round_f64(x: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """(RNE of float64 x on the m-bit grid, mask of x exactly on a midpoint); no overflow check.

    x / q is exact (a power-of-two scale into [2^m, 2^(m+1)) or below), np.rint is half-to-even.
    """
    _, ex = np.frexp(x)  # x = f * 2^ex with 0.5 <= |f| < 1, so floor(log2|x|) = ex - 1
    q = np.ldexp(1.0, np.maximum(ex - 1, _MIN_EXP) - m)
    t = x / q
    r = np.rint(t) * q + 0.0  # + 0.0 turns -0 into +0
    return r, (t - np.floor(t)) == 0.5


def _grid_max(m: int) -> float:
    return (2.0 - 2.0**-m) * 2.0**127


# ---------------------------------------------------------------------------------------------------
# Exact sums and dot products


def _as_f64(x: np.ndarray, ndim: int, where: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype == np.float32:
        x = x.astype(np.float64)  # exact
    if x.dtype != np.float64:
        raise ExactMathError(f"{where}: expected a float64 or float32 array, got {x.dtype}")
    if x.ndim != ndim:
        raise ExactMathError(f"{where}: expected a {ndim}-d array, got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ExactDomainError(f"{where}: the inputs hold NaN or infinity: the computation diverged")
    return x


def _dyadic_fraction(parts: Sequence[float]) -> Fraction:
    """The exact sum of float64 values as a Fraction (denominators are powers of two: rescale, add)."""
    num, den = 0, 1
    for p in parts:
        if p:
            n, d = p.as_integer_ratio()
            if d > den:
                num, den = num * (d // den) + n, d
            else:
                num += n * (den // d)
    return Fraction(num, den)


# Rows are processed in chunks of about this many elements so that the temporaries stay in cache
# (measured 4x faster than whole-array passes at K = 1024).
_CHUNK_ELEMS = 1 << 15

# A row's terms for rows lo..hi: (terms (rows, K'), mask of rows whose terms are not exact).
_TermsOf = Callable[[int, int], tuple[np.ndarray, np.ndarray]]


def _distill_chunk(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """((n, P) float64 whose row sums equal x's row sums exactly, mask of rows left to the slow path).

    Rump, Ogita and Oishi's ExtractVector ("Accurate floating-point summation", 2008, Lemma 3.3): for
    sigma = 2^k >= (K + 2) max|r|, q = (sigma + r) - sigma and r - q are exact and sum(q) is exact in
    any order. Each pass moves the top 53 - log2(K + 2) bits of the row into one column; rows of grid
    products take two or three passes. Rows whose sigma would overflow go to the slow path; rows whose
    terms are all below 2^(-1021 - log2(K+2)) are summed plainly, which is exact there (every partial sum
    is a multiple of 2^-1074 below 2^-1021, all representable).
    """
    n, k = x.shape
    if k == 0:
        return np.zeros((n, 1)), np.zeros(n, dtype=bool)
    kbits = math.ceil(math.log2(k + 2))
    r = x.copy()
    q = np.empty_like(r)
    rows = np.arange(n)
    cols = []
    huge = np.zeros(n, dtype=bool)
    while rows.size:
        big = np.maximum(r.max(axis=1), -r.min(axis=1))
        _, e = np.frexp(big)  # big < 2^e
        top = e + kbits
        live = (big > 0) & (top < 1024)
        huge[rows[top >= 1024]] = True
        if not live.all():
            r, rows, top = r[live], rows[live], top[live]
            q = q[: rows.size]
        if not rows.size:
            break
        col = np.zeros(n)
        tiny = top < -1020
        if tiny.any():
            col[rows[tiny]] = r[tiny].sum(axis=1)
            r[tiny] = 0.0
        sigma = np.ldexp(1.0, np.maximum(top, -1020))[:, None]
        np.add(sigma, r, out=q)
        q -= sigma
        r -= q
        col[rows] += q.sum(axis=1)
        cols.append(col)
    out = np.stack(cols, axis=1) if cols else np.zeros((n, 1))
    return out, huge


def _distill(n: int, k: int, terms_of: _TermsOf) -> tuple[list[list[float]], np.ndarray]:
    """(per row a few floats summing exactly to the row's sum, mask of rows needing the slow path)."""
    step = max(1, _CHUNK_ELEMS // max(k, 1))
    parts: list[list[float]] = []
    slow = np.zeros(n, dtype=bool)
    for i in range(0, n, step):
        terms, unexact = terms_of(i, i + step)
        cols, huge = _distill_chunk(terms)
        parts.extend(cols.tolist())
        slow[i : i + step] = unexact | huge
    return parts, slow


def _round_parts(
    parts: list[list[float]], slow: np.ndarray, exact_row: Callable[[int], Fraction], bits: int, where: str
) -> np.ndarray:
    """RNE_grid of each row's exact sum, paying for the exact Fraction only on midpoints (docstring)."""
    m = check_bits(bits)
    s1 = np.empty(len(parts))
    for i, p in enumerate(parts):
        try:
            s1[i] = math.fsum(p)  # the correctly rounded float64 of the exact sum
        except OverflowError:
            s1[i] = 0.0
            slow[i] = True
    r, mid = _round_f64(s1, m)
    for i in np.flatnonzero(mid | slow):
        r[i] = round_fraction(exact_row(i) if slow[i] else _dyadic_fraction(parts[i]), bits)
    over = np.abs(r) > _grid_max(m)
    if over.any():
        raise _overflow(s1[np.flatnonzero(over)[0]], bits, where)
    return r


def _plain_terms(x: np.ndarray) -> _TermsOf:
    return lambda lo, hi: (x[lo:hi], np.zeros(x[lo:hi].shape[0], dtype=bool))


def exact_sums(x: np.ndarray) -> list[Fraction]:
    """The exact sum of each row of x (n, K), as Fractions."""
    x = _as_f64(x, 2, "exact_sums")
    parts, slow = _distill(*x.shape, _plain_terms(x))
    out = [_dyadic_fraction(p) for p in parts]
    for i in np.flatnonzero(slow):
        out[i] = _dyadic_fraction(x[i].tolist())
    return out


def _rational(d: object) -> Fraction:
    # Fraction(numpy integer) keeps the numpy type inside and overflows later: go through int.
    return Fraction(int(d)) if isinstance(d, numbers.Integral) else Fraction(d)


def _divisors(divisor: Sequence[int | Fraction] | int | None, n: int) -> list[Fraction] | None:
    if divisor is None:
        return None
    if isinstance(divisor, numbers.Rational):  # int, Fraction, numpy integers
        ds = [_rational(divisor)] * n
    else:
        ds = [_rational(d) for d in divisor]
        if len(ds) != n:
            raise ExactMathError(f"rounded_sums: {len(ds)} divisors for {n} rows")
    if any(d == 0 for d in ds):
        raise ExactDomainError("rounded_sums: division by zero: the computation diverged")
    return ds


def rounded_sums(
    x: np.ndarray, bits: int, divisor: Sequence[int | Fraction] | int | None = None
) -> np.ndarray:
    """RNE_grid(sum of row i / divisor_i) for each row of x (n, K); float64 array of n values.

    `divisor` is one number for all rows or one per row (ints or Fractions); the division is exact
    (one rounding of the exact rational, never a rounding of a rounded sum).
    """
    x = _as_f64(x, 2, "rounded_sums")
    ds = _divisors(divisor, x.shape[0])
    if ds is None:
        parts, slow = _distill(*x.shape, _plain_terms(x))
        return _round_parts(parts, slow, lambda i: _dyadic_fraction(x[i].tolist()), bits, "rounded_sums")
    return round_fractions([s / d for s, d in zip(exact_sums(x), ds)], bits)


_SPLIT = 134217729.0  # 2^27 + 1: Veltkamp's splitter for 53-bit significands
_LOW27 = (1 << 27) - 1  # the low 27 of the 52 explicit significand bits


def _two_product(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(hi, lo, safe): hi + lo == a*b exactly wherever `safe` (see the module docstring)."""
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        hi = a * b
    ph = np.abs(hi)
    safe = (a == 0) | (b == 0) | (
        (ph >= 2.0**-900) & (ph < 2.0**1000) & (np.abs(a) < 2.0**995) & (np.abs(b) < 2.0**995)
    )
    if not ((a.view(np.int64) | b.view(np.int64)) & _LOW27).any():
        # Every factor has <= 26 significant bits (grid values have <= 24): the products are exact.
        return hi, np.zeros_like(hi), safe
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        ca, cb = _SPLIT * a, _SPLIT * b
        ah = ca - (ca - a)
        bh = cb - (cb - b)
        al, bl = a - ah, b - bh
        lo = ((ah * bh - hi) + ah * bl + al * bh) + al * bl
    return hi, np.where(safe, lo, 0.0), safe


def _dot_terms(a: np.ndarray, b: np.ndarray, extra: np.ndarray | None) -> _TermsOf:
    def terms_of(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        p, err, safe = _two_product(a[lo:hi], b[lo:hi])
        unsafe = ~safe.all(axis=1)
        # Products of grid values (<= 48 bits) are exact in float64: err is all zero, skip it.
        cols = [p, err] if err.any() else [p]
        if extra is not None:
            cols.append(extra[lo:hi, None])
        terms = np.concatenate(cols, axis=1) if len(cols) > 1 else p
        terms[unsafe] = 0.0
        return terms, unsafe

    return terms_of


def _check_dot_args(a: np.ndarray, b: np.ndarray, where: str) -> tuple[np.ndarray, np.ndarray]:
    a = _as_f64(a, 2, where)
    b = _as_f64(b, 2, where)
    if a.shape != b.shape:
        raise ExactMathError(f"{where}: a and b must have the same (n, K) shape, got {a.shape}, {b.shape}")
    return a, b


def _fraction_dot(a: np.ndarray, b: np.ndarray) -> Fraction:
    return sum((Fraction(u) * Fraction(v) for u, v in zip(a.tolist(), b.tolist())), Fraction(0))


def exact_dots(a: np.ndarray, b: np.ndarray) -> list[Fraction]:
    """The exact sum_k a[i,k]*b[i,k] of each row, for any finite float64 (or float32) a, b of shape (n, K)."""
    a, b = _check_dot_args(a, b, "exact_dots")
    parts, slow = _distill(*a.shape, _dot_terms(a, b, None))
    out = [_dyadic_fraction(p) for p in parts]
    for i in np.flatnonzero(slow):
        out[i] = _fraction_dot(a[i], b[i])
    return out


def rounded_dots(
    a: np.ndarray,
    b: np.ndarray,
    bits: int,
    extra: np.ndarray | None = None,
    scale: float = 1.0,
) -> np.ndarray:
    """RNE_grid(scale * sum_k a[i,k]*b[i,k] + extra[i]) for each row; float64 array.

    `extra` is an exact per-row addend (float64, e.g. beta*bias when that product is exact), `scale`
    a float64 multiplier (alpha). Both enter exactly; there is one rounding per row.
    """
    a, b = _check_dot_args(a, b, "rounded_dots")
    n = a.shape[0]
    if extra is not None:
        extra = _as_f64(np.reshape(extra, (-1,)), 1, "rounded_dots(extra)")
        if extra.shape[0] != n:
            raise ExactMathError(f"rounded_dots: extra has {extra.shape[0]} values for {n} rows")
    if not math.isfinite(scale):
        raise ExactDomainError(f"rounded_dots: scale {scale!r} is not finite: the computation diverged")
    adds = [Fraction(0)] * n if extra is None else [Fraction(e) for e in extra.tolist()]
    if scale == 1.0:
        parts, slow = _distill(*a.shape, _dot_terms(a, b, extra))
        return _round_parts(
            parts, slow, lambda i: _fraction_dot(a[i], b[i]) + adds[i], bits, "rounded_dots"
        )
    fscale = Fraction(scale)
    return round_fractions([fscale * d + e for d, e in zip(exact_dots(a, b), adds)], bits)


# ---------------------------------------------------------------------------------------------------
# Correctly rounded elementary and special functions

FUNCTIONS = ("exp", "exp2", "log", "log2", "log10", "tanh", "sigmoid", "expm1", "log1p", "erf", "erfc", "rsqrt", "sqrt",
             "pow", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "lgamma",
             "digamma", "trigamma", "erfinv", "atan2", "gelu", "gelu_tanh", "gelu_backward", "gelu_tanh_backward")

_ARITY = {"gelu_backward": 2, "gelu_tanh_backward": 2, "atan2": 2}

# Ziv's strategy. Each evaluator returns the value as E + c: E an exact rational (0, x, g/2, g: the
# asymptote or the exactly known part) and c an mpmath number with an absolute error bound eps, derived
# from M (the sum of magnitudes of the terms forming c) as eps = M * 2^(10 - p). Evaluations run at
# p + guard bits (the guard covers the conditioning of inexact arguments, e.g. erfc(x/sqrt2) amplifies
# the argument's relative error by ~x^2), while mpmath's functions are accurate to a few ulps at their
# working precision; 2^10 is a generous margin on top. The rounding is accepted when E + c - eps and
# E + c + eps round to the same grid value (RNE is monotone, so the exact value rounds there too).
#
# Why 128 bits nearly always decides, and why the cap is never reached on these inputs: the target has
# <= 24 significant bits and the inputs are float64 (<= 2^64 distinct values per argument).
# Heuristically (the table-maker's dilemma), the chance that a transcendental value falls within 2^-k
# relative of one of the ~2^25 boundaries of its binade is ~2^(25-k), so over all 2^64 inputs the
# expected number of cases needing more than k = 128 bits is ~2^-39 (the hardest cases known for binary64
# functions, with 53-bit inputs and outputs, need under 160 bits). The backward functions take pairs
# (g, x), 2^128 of them, so a few may need the retry at 512 bits; the 8192-bit cap leaves nothing.
# The exactly representable results (exp(0) = 1, sigmoid(0) = 1/2, gelu_backward(g, 0) = g/2 on a
# subnormal midpoint, perfect squares under sqrt, integer powers) are carried in E exactly, never in c,
# so ties go to even exactly; near-saturation values (gelu(x) = x - tiny for large x on a midpoint x)
# carry the tiny deviation in c relative to itself, so its sign is known. If the cap were nonetheless
# reached, the rounding of the cap-precision value is taken: that is the spec's definition, and mpmath
# is deterministic pure Python, so every machine still agrees.
_PRECISIONS = (128, 512, 2048, 8192)

# A c far smaller than E's last bit is replaced by sign(c) * 2^-1100. E is 0, x, g or g/2 of float64s and
# the boundaries are multiples of 2^-151, so E and every boundary within a factor 2 of E are multiples
# of u = max(2^-1075, 2^(floor(log2|E|) - 54)); no boundary lies strictly between E and E + sign * u,
# so for |c| < u only the sign of c matters, and E + sign * 2^-1100 lies in that same open interval.
# Generic values use the absolute test |c| < 2^-1076 <= u (`_TINY_EXP`); the evaluators' saturation
# cut-offs (`_Saturated`) argue |c| < u in a comment each. This keeps the Fractions small and lets
# asymptotic regions (exp(-1e300), gelu(1e30) on a midpoint) finish at the first precision.
_TINY_EXP = -1076
_CLAMP = Fraction(1, 1 << 1100)
_HUGE_EXP = 1100  # |c| >= 2^1100 with |E| < 2^1025 overflows any grid

# A private context: setting its precision leaves the caller's mpmath.mp alone (not thread-safe).
_MP = mpmath.ctx_mp.MPContext()


class _Value:
    """E + c with |error of c| <= 2^(mag + 10 - p), mag = exponent bound of M (None: c is 0)."""

    __slots__ = ("exact", "c", "mag")

    def __init__(self, exact: Fraction, c: object = 0, mag: int | None = None) -> None:
        self.exact, self.c, self.mag = exact, c, mag


def _mag(*terms: object) -> int:
    """An exponent k with sum |terms| <= 2^k (mpmath's mag is an upper bound on log2)."""
    total = sum(abs(t) for t in terms)
    return int(_MP.mag(total)) if total else -10**9


def _frac(v: object) -> Fraction:
    # man_exp gives the magnitude's mantissa (mpmath keeps the sign apart).
    man, exp = _MP.mpf(v).man_exp
    if v < 0:
        man = -man
    return Fraction(man << exp) if exp >= 0 else Fraction(man, 1 << -exp)


class _Saturated(Exception):
    """Internal: the evaluator proved |c| < u (see _CLAMP) and knows c's sign, so E + sign * 2^-1100 rounds
    the same way as E + c."""

    def __init__(self, exact: Fraction, sign: int) -> None:
        super().__init__()
        self.exact, self.sign = exact, sign


def _tanh(u: object) -> object:
    # expm1 keeps relative accuracy near 0, where tanh(u) ~ u; |u| < 1 here so t + 2 >= 1.1.
    t = _MP.expm1(2 * u)
    return t / (t + 2)


def _ev_exp(x: float) -> _Value:
    if x > 1000.0:
        raise GridOverflowError(f"exp({x!r}) is beyond the largest grid value: the computation diverged")
    if x < -760.0:  # e^x < 2^-1096
        raise _Saturated(Fraction(0), 1)
    c = _MP.exp(_MP.mpf(x))
    return _Value(Fraction(0), c, _mag(c))


def _ev_exp2(x: float) -> _Value:
    if x > 1100.0:
        raise GridOverflowError(f"exp2({x!r}) is beyond the largest grid value: the computation diverged")
    if x < -1100.0:  # 2^x < 2^-1096
        raise _Saturated(Fraction(0), 1)
    c = _MP.mpf(2) ** _MP.mpf(x)  # (exact where x is a whole number)
    return _Value(Fraction(0), c, _mag(c))


def _function_of(name: str, exact_at: float = 0.0, exact: int = 0, domain: tuple[float, float] | None = None,
                 closed: bool = True) -> Callable[[float], _Value]:
    """mpmath's function `name` on its `domain`, closed or open (beyond it the device gives NaN, at an open end
    +-inf), which is `exact` at `exact_at` and, at any other rational, transcendental: sin, cos, tan (Lindemann),
    asin, acos, atan and asinh (were one of them a nonzero algebraic at a rational, that rational would be the sine,
    cosine, tangent or sinh of an algebraic), so never a grid value or a tie between two, and Ziv's loop decides it.
    erfinv's values at rationals are not known to avoid them: were one hit, the cap precision's rounding would
    define it, the same on every machine (as lgamma's). mpmath reduces sin's, cos's and tan's arguments modulo pi
    at the precision the reduction needs (near a multiple of pi or pi/2, or up to 2^128); writes asin and acos as
    2 atan(...) of a quotient of the exact x x, 1 -+ x and a square root (no cancellation, acos near 1 and asin
    near 0 included); widens its precision by the bits asinh loses near 0; returns atan of a huge x as +-pi/2
    within 2^-(prec + 20) relative (pi/2 - atan x ~ 1/x is that small); and inverts erf by Newton's method at its
    working precision, near 0 and near +-1 alike: each value is accurate relative to itself."""
    function = getattr(_MP, name)

    def evaluate(x: float) -> _Value:
        if domain is not None and not (domain[0] <= x <= domain[1] if closed else domain[0] < x < domain[1]):
            interval = f"[{domain[0]}, {domain[1]}]" if closed else f"({domain[0]}, {domain[1]})"
            raise ExactDomainError(f"{name}({x!r}): the argument must lie in {interval} (the device gives "
                                   f"{'NaN' if closed else 'inf or NaN'})")
        if x == exact_at:
            return _Value(Fraction(exact))
        c = function(_MP.mpf(x))
        return _Value(Fraction(0), c, _mag(c))

    return evaluate


def _ev_sinh(x: float) -> _Value:
    # sinh 0 = 0 exactly; sinh of another rational is transcendental (e^x would be algebraic otherwise).
    # mpmath widens its working precision by the lost bits near 0, so c is accurate to itself.
    if abs(x) > 1000.0:
        raise GridOverflowError(f"sinh({x!r}) is beyond the largest grid value: the computation diverged")
    if x == 0.0:
        return _Value(Fraction(0))
    c = _MP.sinh(_MP.mpf(x))
    return _Value(Fraction(0), c, _mag(c))


def _ev_cosh(x: float) -> _Value:
    # cosh 0 = 1 exactly, else transcendental (as `_ev_sinh`). Near 0, cosh x = 1 + 2 sinh(x/2)^2 carries the
    # small part in c relative to itself (x/2 is exact), so which side of 1's midpoints it lies on is known.
    if abs(x) > 1000.0:
        raise GridOverflowError(f"cosh({x!r}) is beyond the largest grid value: the computation diverged")
    if x == 0.0:
        return _Value(Fraction(1))
    if abs(x) < 1.0:
        c = 2 * _MP.sinh(_MP.mpf(x) / 2) ** 2
        return _Value(Fraction(1), c, _mag(c))
    c = _MP.cosh(_MP.mpf(x))
    return _Value(Fraction(0), c, _mag(c))


def _ev_acosh(x: float) -> _Value:
    # acosh takes x >= 1 (below, the device gives NaN); acosh 1 = 0 exactly, else transcendental. Near 1,
    # log(x + sqrt(x^2 - 1)) is the log of a value near 1: log1p(t + sqrt(t (t + 2))) with t = x - 1 (exact by
    # Sterbenz for x <= 2) keeps c accurate to itself.
    if not x >= 1.0:
        raise ExactDomainError(f"acosh({x!r}): the argument must be >= 1 (the device gives NaN)")
    if x == 1.0:
        return _Value(Fraction(0))
    if x <= 2.0:
        t = _MP.mpf(x) - 1
        c = _MP.log1p(t + _MP.sqrt(t * (t + 2)))
    else:
        c = _MP.acosh(_MP.mpf(x))
    return _Value(Fraction(0), c, _mag(c))


def _ev_atanh(x: float) -> _Value:
    # atanh takes (-1, 1) (+-inf at +-1, NaN beyond); atanh 0 = 0 exactly, else transcendental (as
    # `_function_of`'s). atanh x = log1p(2x / (1 - x)) / 2: 1 - x exact for x >= 1/2, so accurate near +-1 and 0.
    if not -1.0 < x < 1.0:
        raise ExactDomainError(f"atanh({x!r}): the argument must lie in (-1, 1) (the device gives inf/NaN)")
    if x == 0.0:
        return _Value(Fraction(0))
    xm = _MP.mpf(x)
    c = _MP.log1p(2 * xm / (1 - xm)) / 2
    return _Value(Fraction(0), c, _mag(c))


def _ev_lgamma(x: float) -> _Value:
    # x > 0 (the registry refuses the rest: vtrain.bounds). lgamma 1 = lgamma 2 = 0 exactly; at a whole x >= 3 it
    # is the log of an integer > 1, transcendental, and elsewhere no boundary is known to be hit (were one, the
    # cap precision's rounding would define it, the same on every machine). mpmath keeps it accurate to itself
    # near its zeros 1 and 2.
    if not x > 0.0:
        raise ExactDomainError(f"lgamma({x!r}): the argument must be > 0 (the registry refuses the others)")
    if x in (1.0, 2.0):
        return _Value(Fraction(0))
    c = _MP.loggamma(_MP.mpf(x))
    return _Value(Fraction(0), c, _mag(c))


def _polygamma(n: int, name: str, x: float) -> _Value:
    # digamma (n = 0) and trigamma (n = 1) of x > 0 (as `_ev_lgamma`); mpmath's are accurate to themselves,
    # digamma at its root near 1.4616 too
    if not x > 0.0:
        raise ExactDomainError(f"{name}({x!r}): the argument must be > 0 (the registry refuses the others)")
    c = _MP.psi(n, _MP.mpf(x))
    return _Value(Fraction(0), c, _mag(c))


def _ev_atan2(y: float, x: float) -> _Value:
    # The angle of (x, y), signed zeros as IEEE's atan2 reads them (mpmath has none): +-0 exactly for y = +-0
    # and x >= +0, else +-pi for y = +-0. Any other angle is arctan of a nonzero rational, maybe plus a
    # multiple of pi/2: transcendental (as `_function_of`'s), never a grid value or a tie.
    if y == 0.0:
        if x > 0.0 or (x == 0.0 and math.copysign(1.0, x) > 0):
            return _Value(Fraction(0))
        c = _MP.pi if math.copysign(1.0, y) > 0 else -_MP.pi
    else:
        c = _MP.atan2(_MP.mpf(y), _MP.mpf(x))
    return _Value(Fraction(0), c, _mag(c))


def _ev_log(x: float) -> _Value:
    if x <= 0.0:
        raise ExactDomainError(f"log({x!r}): the argument must be > 0 (the device gives -inf/NaN)")
    xm = _MP.mpf(x)
    # Near 1, log1p(x - 1) keeps relative accuracy (x - 1 is exact by Sterbenz on 0.5 <= x <= 2).
    c = _MP.log1p(xm - 1) if 0.5 <= x <= 2.0 else _MP.log(xm)
    return _Value(Fraction(0), c, _mag(c))


def _log_base(name: str, x: float, base: int) -> _Value:
    # log2 and log10 of a dyadic rational x are rational only at whole powers of the base (log10: 10^k with
    # k >= 0, since 5 divides no dyadic denominator), where they are integers: grid values, which Ziv's loop
    # decides at once. Anywhere else they are irrational, never a grid value or a tie. Near 1,
    # log1p(x - 1) / log(base) as `_ev_log` takes it.
    if x <= 0.0:
        raise ExactDomainError(f"{name}({x!r}): the argument must be > 0 (the device gives -inf/NaN)")
    xm = _MP.mpf(x)
    c = (_MP.log1p(xm - 1) if 0.5 <= x <= 2.0 else _MP.log(xm)) / _MP.log(base)
    return _Value(Fraction(0), c, _mag(c))


def _ev_erfc(x: float) -> _Value:
    # erfc 0 = 1 exactly. For x > 0 mpmath's erfc is accurate to itself (it raises its precision by the bits
    # that 1 - erf(x) cancels, or sums the asymptotic series); for x < 0, erfc x = 2 - erfc(-x) keeps the
    # small part apart, as `_ev_erf` does. erfc(40) < e^-1600 < 2^-2300: beyond, the saturated value.
    if x == 0.0:
        return _Value(Fraction(1))
    if abs(x) > 40.0:
        raise _Saturated(Fraction(0), 1) if x > 0 else _Saturated(Fraction(2), -1)
    if x > 0:
        c = _MP.erfc(_MP.mpf(x))
        return _Value(Fraction(0), c, _mag(c))
    c = -_MP.erfc(-_MP.mpf(x))
    return _Value(Fraction(2), c, _mag(c))


def _ev_tanh(x: float) -> _Value:
    xm = _MP.mpf(x)
    if abs(x) < 1.0:
        c = _tanh(xm)
        return _Value(Fraction(0), c, _mag(c))
    sign = 1 if x > 0 else -1
    if abs(x) > 600.0:  # 1 - |tanh| = 2/(e^(2|x|) + 1) < 2^-1076
        raise _Saturated(Fraction(sign), -sign)
    c = -sign * 2 / (_MP.exp(2 * abs(xm)) + 1)
    return _Value(Fraction(sign), c, _mag(c))


def _ev_sigmoid(x: float) -> _Value:
    xm = _MP.mpf(x)
    if x > 0:
        if x > 750.0:
            raise _Saturated(Fraction(1), -1)
        c = -1 / (1 + _MP.exp(xm))  # sigmoid(x) = 1 - 1/(1 + e^x)
        return _Value(Fraction(1), c, _mag(c))
    if x < -750.0:
        raise _Saturated(Fraction(0), 1)
    c = 1 / (1 + _MP.exp(-xm))
    return _Value(Fraction(0), c, _mag(c))


def _ev_expm1(x: float) -> _Value:
    if x > 1000.0:
        raise GridOverflowError(f"expm1({x!r}) is beyond the largest grid value: the computation diverged")
    if x < -50.0:  # expm1(x) = -1 + e^x
        if x < -760.0:
            raise _Saturated(Fraction(-1), 1)
        c = _MP.exp(_MP.mpf(x))
        return _Value(Fraction(-1), c, _mag(c))
    c = _MP.expm1(_MP.mpf(x))
    return _Value(Fraction(0), c, _mag(c))


def _ev_log1p(x: float) -> _Value:
    if x <= -1.0:
        raise ExactDomainError(f"log1p({x!r}): the argument must be > -1 (the device gives -inf/NaN)")
    c = _MP.log1p(_MP.mpf(x))
    return _Value(Fraction(0), c, _mag(c))


def _ev_erf(x: float) -> _Value:
    xm = _MP.mpf(x)
    if abs(x) < 1.0:
        c = _MP.erf(xm)
        return _Value(Fraction(0), c, _mag(c))
    sign = 1 if x > 0 else -1
    if abs(x) > 40.0:  # erfc(40) < e^-1600 < 2^-2300
        raise _Saturated(Fraction(sign), -sign)
    c = -sign * _MP.erfc(abs(xm))  # erf(x) = sign * (1 - erfc(|x|)), no cancellation in c
    return _Value(Fraction(sign), c, _mag(c))


def _exact_root(x: Fraction, k: int) -> Fraction | None:
    """x^(1/2^k) when it is rational (x > 0 dyadic), else None."""
    num, den = x.numerator, x.denominator
    for _ in range(k):
        rn, rd = math.isqrt(num), math.isqrt(den)
        if rn * rn != num or rd * rd != den:
            return None
        num, den = rn, rd
    return Fraction(num, den)


def _ev_sqrt(x: float) -> _Value:
    if x < 0.0:
        raise ExactDomainError(f"sqrt({x!r}): the argument must be >= 0 (the device gives NaN)")
    # A perfect square (e.g. a squared grid midpoint, 2m + 3 <= 53 bits) has an exact, possibly tie,
    # root: carry it exactly. Otherwise the root is irrational and never a boundary.
    root = _exact_root(Fraction(x), 1)
    if root is not None:
        return _Value(root)
    c = _MP.sqrt(_MP.mpf(x))
    return _Value(Fraction(0), c, _mag(c))


def _ev_rsqrt(x: float) -> _Value:
    if x <= 0.0:
        raise ExactDomainError(f"rsqrt({x!r}): the argument must be > 0 (the device gives inf/NaN)")
    root = _exact_root(Fraction(x), 1)
    if root is not None:
        return _Value(1 / root)
    c = 1 / _MP.sqrt(_MP.mpf(x))
    return _Value(Fraction(0), c, _mag(c))


def _exact_power(x: Fraction, n: int) -> Fraction | None:
    """x^n exactly when that is cheap and in a sane range (None: use mpmath; then it is no boundary)."""
    a = abs(x)
    size = abs(n) * max(a.numerator.bit_length(), a.denominator.bit_length())
    log2 = n * (math.log2(a.numerator) - math.log2(a.denominator))
    if size > 4096 or log2 > 200 or log2 < -1200:
        return None
    return x**n


def _ev_pow(x: float, e: float) -> _Value:
    if e == 0.0:
        return _Value(Fraction(1))
    if x == 0.0:
        if e < 0:
            raise ExactDomainError(f"pow(0, {e!r}) is infinite: the computation diverged")
        return _Value(Fraction(0))
    num, den_e = e.as_integer_ratio()  # e = num / 2^k
    k = den_e.bit_length() - 1
    if x < 0 and k > 0:
        raise ExactDomainError(
            f"pow({x!r}, {e!r}): a negative base needs an integer exponent (the device gives NaN)"
        )
    sign = -1 if (x < 0 and num & 1) else 1
    ax = Fraction(abs(x))
    # x^(num/2^k) is rational iff x^(1/2^k) is; then carry it exactly (ties like x^3 on a midpoint).
    root = _exact_root(ax, k) if k <= 6 or ax.numerator == 1 or ax.denominator == 1 else None
    if root is not None:
        exact = _exact_power(root, num)
        if exact is not None:
            return _Value(sign * exact)
    # The value is irrational, or a rational with more than 25 significant bits: never a boundary.
    log2 = e * math.log2(abs(x))
    if log2 > 1000:
        raise GridOverflowError(
            f"pow({x!r}, {e!r}) is beyond the largest grid value: the computation diverged"
        )
    if log2 < -1200:
        raise _Saturated(Fraction(0), sign)
    c = sign * _MP.power(_MP.mpf(abs(x)), _MP.mpf(e))
    return _Value(Fraction(0), c, _mag(c))


def _q(z: object) -> object:
    """Upper normal tail Q(z) = erfc(z/sqrt2)/2."""
    return _MP.erfc(z / _MP.sqrt(2)) / 2


def _phi(z: object) -> object:
    return _MP.exp(-z * z / 2) / _MP.sqrt(2 * _MP.pi)


def _ev_gelu(x: float) -> _Value:
    xm = _MP.mpf(x)
    fx = Fraction(x)
    if x >= 1.0:  # gelu(x) = x - x Q(x)
        if x > 40.0:
            raise _Saturated(fx, -1)
        c = -xm * _q(xm)
        return _Value(fx, c, _mag(c))
    if x < -40.0:  # |x Phi(x)| <= phi(x) < e^-800
        raise _Saturated(Fraction(0), -1)
    c = xm * _q(-xm)
    return _Value(Fraction(0), c, _mag(c))


_GELU_A = Fraction(44715, 10**6)  # 0.044715 as the exact decimal


def _gelu_u(xm: object) -> tuple[object, object]:
    """(u, u') with u = sqrt(2/pi) (x + 0.044715 x^3) and u' = du/dx (both positive multiples of x)."""
    k = _MP.sqrt(2 / _MP.pi)
    a = _MP.mpf(_GELU_A.numerator) / _GELU_A.denominator
    return k * (xm + a * xm**3), k * (1 + 3 * a * xm * xm)


def _ev_gelu_tanh(x: float) -> _Value:
    # gelu_tanh(x) = 0.5 x (1 + tanh u) = x sigmoid(2u) = x / (1 + e^(-2u)), free of cancellation.
    xm = _MP.mpf(x)
    fx = Fraction(x)
    if x >= 0:
        if x > 30.0:  # 2u > 1900: x e^(-2u) < 2^-1076 relative
            raise _Saturated(fx, -1)
        u, _ = _gelu_u(xm)
        c = -xm / (1 + _MP.exp(2 * u))
        return _Value(fx, c, _mag(c))
    if x < -30.0:
        raise _Saturated(Fraction(0), -1)
    u, _ = _gelu_u(xm)
    c = xm / (1 + _MP.exp(-2 * u))
    return _Value(Fraction(0), c, _mag(c))


def _ev_gelu_backward(g: float, x: float) -> _Value:
    # d/dx gelu = Phi(x) + x phi(x), written per region so that c has no internal cancellation; the
    # root near x = -0.7518 cancels between E = g/2 and c, which the absolute bound eps accounts for.
    if g == 0.0:
        return _Value(Fraction(0))
    fg = Fraction(g)
    gs = 1 if g > 0 else -1
    xm, gm = _MP.mpf(x), _MP.mpf(g)
    if x >= 2.0:  # 1 - Q(x) + x phi(x), x phi > Q
        if x > 40.0:  # |c| < |g| e^-400: far below g's last bit
            raise _Saturated(fg, gs)
        t1, t2 = xm * _phi(xm), _q(xm)
        return _Value(fg, gm * (t1 - t2), _mag(gm * t1, gm * t2))
    if x <= -1.0:  # Q(-x) + x phi(x), x phi dominates (negative)
        # |c| <= |g| |x| phi(x) <= |g| e^(-x^2/4) (x <= -40): saturated when that is < 2^-1080.
        if x < -40.0 and math.log2(abs(g)) - x * x / 4 * math.log2(math.e) < -1080:
            raise _Saturated(Fraction(0), -gs)
        t1, t2 = _q(-xm), xm * _phi(xm)
        return _Value(Fraction(0), gm * (t1 + t2), _mag(gm * t1, gm * t2))
    # 1/2 + erf(x/sqrt2)/2 + x phi(x): both c terms have the sign of x.
    t1, t2 = _MP.erf(xm / _MP.sqrt(2)) / 2, xm * _phi(xm)
    return _Value(fg / 2, gm * (t1 + t2), _mag(gm * t1, gm * t2))


def _ev_gelu_tanh_backward(g: float, x: float) -> _Value:
    # With s = sigmoid(2u): gelu_tanh = x s, derivative s + 2 x u' s (1 - s).
    if g == 0.0:
        return _Value(Fraction(0))
    fg = Fraction(g)
    gs = 1 if g > 0 else -1
    xm, gm = _MP.mpf(x), _MP.mpf(g)
    if abs(x) > 30.0:
        raise _Saturated(fg if x > 0 else Fraction(0), gs if x > 0 else -gs)
    u, du = _gelu_u(xm)
    if x >= 2.0:  # g + g (1 - s)(2 x u' s - 1)
        s1 = 1 / (1 + _MP.exp(2 * u))  # 1 - s
        s = 1 - s1
        t1, t2 = 2 * xm * du * s * s1, s1
        return _Value(fg, gm * (t1 - t2), _mag(gm * t1, gm * t2))
    if x <= -2.0:  # g s (1 + 2 x u' (1 - s))
        s = 1 / (1 + _MP.exp(-2 * u))
        t1, t2 = s, 2 * xm * du * s * (1 - s)
        return _Value(Fraction(0), gm * (t1 + t2), _mag(gm * t1, gm * t2))
    # g/2 + g (tanh(u)/2 + 2 x u' s (1 - s)); s (1 - s) = 1 / (4 cosh^2 u), both terms of x's sign.
    t1 = _tanh(u) / 2 if abs(u) < 1 else _MP.tanh(u) / 2
    t2 = xm * du / (2 * _MP.cosh(u) ** 2)
    return _Value(fg / 2, gm * (t1 + t2), _mag(gm * t1, gm * t2))


_EVALUATORS: dict[str, Callable[..., _Value]] = {
    "exp": _ev_exp, "exp2": _ev_exp2, "log": _ev_log, "tanh": _ev_tanh, "sigmoid": _ev_sigmoid, "expm1": _ev_expm1,
    "log1p": _ev_log1p, "erf": _ev_erf, "rsqrt": _ev_rsqrt, "sqrt": _ev_sqrt, "pow": _ev_pow,
    "sin": _function_of("sin"), "cos": _function_of("cos", exact=1), "tan": _function_of("tan"),
    "asin": _function_of("asin", domain=(-1.0, 1.0)), "acos": _function_of("acos", 1.0, domain=(-1.0, 1.0)),
    "atan": _function_of("atan"), "sinh": _ev_sinh, "cosh": _ev_cosh, "asinh": _function_of("asinh"),
    "acosh": _ev_acosh, "atanh": _ev_atanh, "log2": functools.partial(_log_base, "log2", base=2),
    "log10": functools.partial(_log_base, "log10", base=10), "erfc": _ev_erfc, "lgamma": _ev_lgamma,
    "digamma": functools.partial(_polygamma, 0, "digamma"), "trigamma": functools.partial(_polygamma, 1, "trigamma"),
    "erfinv": _function_of("erfinv", domain=(-1.0, 1.0), closed=False), "atan2": _ev_atan2,
    "gelu": _ev_gelu, "gelu_tanh": _ev_gelu_tanh, "gelu_backward": _ev_gelu_backward,
    "gelu_tanh_backward": _ev_gelu_tanh_backward,
}


# Guard bits on top of p. The saturation cut-offs keep the arguments of the composite formulas small
# (|x| <= 77 for the GELU family, 2u <= 2000), so the conditioning of an inexact inner argument (erfc of
# x/sqrt2 amplifies its relative error by ~x^2 <= 2^13, exp(2u) by 2u <= 2^11) stays far below 2^64.
_GUARD = 64


def _round_value(v: _Value, bits: int, p: int | None) -> float | None:
    """The grid rounding of v if the error bound decides it at precision p (None: undecided)."""
    if v.mag is None or v.c == 0:
        return round_fraction(v.exact, bits)
    c = _MP.mpf(v.c)
    eps_exp = v.mag + 10 - p if p is not None else None
    cmag = int(_MP.mag(c))
    if cmag >= _HUGE_EXP:
        raise _overflow("of magnitude 2^%d" % cmag, bits, "correctly_rounded")
    if cmag < _TINY_EXP and (eps_exp is None or eps_exp < cmag - 2):
        return round_fraction(v.exact + _CLAMP * (1 if c > 0 else -1), bits)
    centre = v.exact + _frac(c)
    if p is None:
        return round_fraction(centre, bits)
    eps = Fraction(2) ** eps_exp
    ends = []
    for end in (centre - eps, centre + eps):
        try:
            ends.append(round_fraction(end, bits))
        except GridOverflowError:
            ends.append(None)
    if ends[0] == ends[1]:
        if ends[0] is None:
            raise _overflow(float(centre), bits, "correctly_rounded")
        return ends[0]
    return None


def _correctly_rounded_one(fn: str, bits: int, args: tuple[float, ...], exponent: float | None) -> float:
    try:
        return _ziv(fn, bits, args, exponent)
    except ExactDomainError:
        raise
    except GridOverflowError as err:  # name the function and its argument in the message
        call = ", ".join(map(repr, args + (() if exponent is None else (exponent,))))
        raise GridOverflowError(f"{fn}({call}) on the {bits}-bit grid: {err}") from None


def _ziv(fn: str, bits: int, args: tuple[float, ...], exponent: float | None) -> float:
    ev = _EVALUATORS[fn]
    extra = () if exponent is None else (exponent,)
    for i, p in enumerate(_PRECISIONS):
        _MP.prec = p + _GUARD
        try:
            v = ev(*args, *extra)
        except _Saturated as sat:
            return round_fraction(sat.exact + _CLAMP * sat.sign, bits)
        last = i == len(_PRECISIONS) - 1
        r = _round_value(v, bits, None if last else p)
        if r is not None:
            return r
    raise AssertionError("unreachable: the cap precision always rounds")


def correctly_rounded(fn: str, bits: int, *xs: np.ndarray, exponent: float | None = None) -> np.ndarray:
    """Elementwise RNE_grid(f(x)) of the exact real function value (float64 array, broadcast shape).

    fn is one of FUNCTIONS. The spec's definitions: gelu(x) = x Phi(x) with Phi the standard normal CDF;
    gelu_tanh(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) where sqrt(2/pi) is the exact real
    number and 0.044715 the exact decimal (not their float64 roundings); gelu_backward(g, x) =
    g (Phi(x) + x phi(x)) and gelu_tanh_backward(g, x) = g * d/dx gelu_tanh(x), exactly; rsqrt(x) =
    1/sqrt(x); atan2(y, x) reads signed zeros as IEEE does; pow takes `exponent` (a float64, exact); the others are
    the real functions of their names (asin and acos take [-1, 1], atanh (-1, 1), acosh [1, inf), lgamma, digamma
    and trigamma (d/dx digamma) (0, inf), erfinv (-1, 1)). One input array per argument (two for the backward
    functions, g and x, and for atan2, y and x).
    """
    if fn not in _EVALUATORS:
        raise ExactMathError(f"correctly_rounded: unknown function {fn!r}; known: {', '.join(FUNCTIONS)}")
    check_bits(bits)
    arity = _ARITY.get(fn, 1)
    if len(xs) != arity:
        raise ExactMathError(f"correctly_rounded({fn!r}): expected {arity} input arrays, got {len(xs)}")
    if (fn == "pow") != (exponent is not None):
        raise ExactMathError(f"correctly_rounded({fn!r}): `exponent` is required for pow and only for pow")
    if exponent is not None:
        exponent = float(exponent)
        if not math.isfinite(exponent):
            raise ExactDomainError(f"correctly_rounded(pow): exponent {exponent!r} is not finite")
    arrays = np.broadcast_arrays(*(np.asarray(x) for x in xs))
    shape = arrays[0].shape
    flat = [_as_f64(np.reshape(a, (-1,)), 1, f"correctly_rounded({fn!r})").tolist() for a in arrays]
    out = [_correctly_rounded_one(fn, bits, args, exponent) for args in zip(*flat)]
    return np.array(out, dtype=np.float64).reshape(shape)
