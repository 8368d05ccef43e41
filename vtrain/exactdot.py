"""Compiled exact dot products for the exact resolution (issue 7): RNE_grid(sum_k a_k b_k + extra) per position.

vtrain.resolve recomputes the ambiguous elements of matmul-family outputs exactly. The reference is
vtrain.exactmath.rounded_dots (vectorised numpy); this module computes the same values in numba, about ten
times faster on wide matmuls, and hands every position it cannot do to that reference, which stays the
definition (its docstring has the arithmetic argument in full).

Per position (row r of A, column c of B, in batch n):
1. Gather. The distinct rows of A and columns of B the positions need are copied into contiguous float64
   buffers by compiled loops that follow the memory order: line-outer where the stride along K is the
   smaller one, K-outer otherwise (a column of a row-major B is read row by row, across all the needed
   columns). Operands are numpy views of the torch tensors with any strides (transposed weights, g^T).
2. Products. Dekker's TwoProduct with Veltkamp's split gives a*b = hi + lo exactly when |a|, |b| < 2^995
   and 2^-900 <= |a*b| < 2^1000, or a or b is zero. When both lines hold only short values (`short`: <= 24
   bits within float32's range; grid values are), products have <= 48 bits and hi is exact: the split is
   skipped.
3. Exact sum. Rump-Ogita-Oishi ExtractVector (as exactmath._distill_chunk: sigma = 2^k >= (n + 2) max|r|,
   q = (sigma + r) - sigma and r - q exact, sum(q) exact in any order), two levels per sweep over the
   terms (one sweep for grid products), turns the K or 2K terms into a few values with the same exact
   sum; those go into Shewchuk's nonoverlapping partials (CPython's msum), whose fsum finish gives s1, the
   correctly rounded float64 of the exact sum S. The sweeps are branch-free loops that LLVM vectorises;
   their sums are exact in any order, which is what lets `_exact_sum` alone be compiled with reassociation.
   Where no term has bits below 2^(e-104), 2^(e-1) > max|term| (grid products span ~15 bits), one pass sums
   them instead, the two levels' extracted parts counted as integers (`_two_levels`).
4. Grid rounding of s1 as exactmath._round_f64; when s1 is exactly on a grid midpoint, S - s1 (one more
   msum step on a copy of the partials, the sign of its top partial) decides, ties to even when it is zero.
   This is the double-rounding trap described in exactmath's docstring.

A position is FLAGGED, and resolved by exactmath.rounded_dots instead, when a factor or the addend is not
finite, a product is outside TwoProduct's exact range, a pass would overflow, msum meets an infinity, or
the result rounds beyond the largest grid value. So every input gives exactly the reference's value or
raises the reference's error. Flagged positions are rare (none on grid data of a sane run).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

from vtrain import exactmath
from vtrain.grid import check_bits, grid_max
from vtrain.numba_cache import name_files_by_key

name_files_by_key()  # (before any kernel here compiles: see vtrain.numba_cache)

ENABLED = True  # tests turn it off to compare against the reference path

_SPLIT = 134217729.0  # 2^27 + 1: Veltkamp's splitter
# Nonoverlapping partials of float64 values: in practice a few dozen (msum gets one value per ExtractVector
# level, each spanning >= 53 - kbits bits of the 2098-bit float64 range, plus the addend; a sum added in pieces,
# as the weight gradients' image by image, gets a few per piece, which the partials absorb: 50 on random data,
# 65 from an adversarial search, session 29's review). More would flag the position, never round it wrongly.
_PARTS = 128
_EMIN = -126  # the grid is uniform below 2^-126
_BLOCK = 32  # K-block of the strided gather: 32 rows of memory stay in cache (16 and 32 measured best)
_BELOW_24 = (1 << 29) - 1  # the float64 significand bits below a 24-bit one's
_TINY, _HUGE = (int(np.float64(v).view(np.int64)) for v in (2.0**-149, 2.0**128))
_LEVEL_BLOCK = 2048  # terms per block of `_two_levels`: its integer sums stay within 2^11 2^51 = 2^62


@intrinsic
def _bits(typingctx, x):  # noqa: ANN001, ANN202 (numba's intrinsic protocol)
    """The bit pattern of a float64 as an int64 (numba has no scalar bit cast; an array view is not one LLVM
    can keep in a register, which stops a loop from vectorising)."""
    if x != types.float64:
        return None

    def codegen(context, builder, signature, args):  # noqa: ANN001, ANN202
        return builder.bitcast(args[0], context.get_value_type(types.int64))

    return types.int64(types.float64), codegen


@njit(cache=True, nogil=True)
def copy_lines(x: np.ndarray, batch: np.ndarray, line: np.ndarray, out: np.ndarray) -> None:
    """out[j, :] = x[batch[j], line[j], :] in out's dtype, for x of any strides (vtrain.resolve copies
    lines of bit patterns with it too).

    Where K is the strided axis (a column of a row-major matrix), K is walked in blocks of _BLOCK outside
    the lines, so that a block's rows of memory stay in cache while every line takes its values from them:
    4.8 against 2.0 ms for 600 columns of a 2048 x 2048 matrix (and 12.5 in the engine, with cold memory)
    for the former way, a (K, lines) buffer filled along the rows and then transposed."""
    k = x.shape[2]
    if abs(x.strides[2]) <= abs(x.strides[1]):
        for j in range(batch.size):
            src = x[batch[j], line[j]]
            for t in range(k):
                out[j, t] = src[t]
    else:
        for t0 in range(0, k, _BLOCK):
            for j in range(batch.size):
                src = x[batch[j], line[j]]
                for t in range(t0, min(k, t0 + _BLOCK)):
                    out[j, t] = src[t]


@njit(cache=True, nogil=True, inline="always")
def short(x: np.ndarray) -> bool:
    """Whether every value of the line x (float64 or float32) is 0, or has <= 24 significant bits and a magnitude
    in [2^-149, 2^128): every finite float32 value is (and a few float64 values below float32's normal range that
    float32 lacks). A product of two such values is exact in float64: <= 48 bits, 0 or within 2^-298 .. 2^256,
    so the products need no split. Tested as integer reductions over the bit patterns, which LLVM vectorises
    (the float32 round trip they replace cost a weight gradient's positions 16 of their 92 us at resnet-tiny
    width 32): their OR, the least nonzero |x| less one (a zero's wraps to the largest) and the largest |x|
    (NaN's and inf's are >= 2^128)."""
    low, lo, hi = 0, 0x7FFFFFFFFFFFFFFF, 0
    for t in range(x.size):
        v = _bits(np.float64(x[np.uint64(t)]))
        a = v & 0x7FFFFFFFFFFFFFFF
        low, lo, hi = low | v, min(lo, (a - 1) & 0x7FFFFFFFFFFFFFFF), max(hi, a)
    return ((low & _BELOW_24) == 0) & (lo >= _TINY - 1) & (hi < _HUGE)


@njit(cache=True, nogil=True, inline="always")
def _known_short(lines: np.ndarray, known: np.ndarray, j: int) -> bool:
    """`short` of lines[j], computed at its first use and kept in known[j] (-1: not yet known): the line is
    then in cache for its products, where a pass of its own over all the lines read them from memory once
    more (a weight gradient's positions gather 2 x 32,768 terms each at resnet-tiny's width 32)."""
    if known[j] < 0:
        known[j] = short(lines[j])
    return known[j] == 1


@njit(cache=True, nogil=True, inline="always")
def known_short_plane(t: np.ndarray, n: int, c: int, known: np.ndarray) -> bool:
    """Whether plane t[n, c] of a 4-d array (any float dtype and strides) holds only values that `short`
    accepts, tested at its first use and kept in known[n, c] (-1: not yet known), as `_known_short` keeps a
    line's: a convolution's plane serves every weight-gradient position of its channel (vtrain.resolve)."""
    if known[n, c] < 0:
        s = True
        for i in range(t.shape[2]):
            s &= short(t[n, c, i])
        known[n, c] = s
    return known[n, c] == 1


@njit(cache=True, nogil=True, inline="always")
def _msum_add(parts: np.ndarray, n: int, x: float) -> int:
    """Add x exactly to the nonoverlapping partials parts[:n] (CPython's msum); the new count, -1 on inf/NaN."""
    i = 0
    for j in range(n):
        y = parts[j]
        if abs(x) < abs(y):
            x, y = y, x
        hi = x + y
        lo = y - (hi - x)
        if lo != 0.0:
            parts[i] = lo
            i += 1
        x = hi
    if x != 0.0:
        if not math.isfinite(x) or i == parts.size:
            return -1
        parts[i] = x
        i += 1
    return i


@njit(cache=True, nogil=True, inline="always")
def _fsum_finish(parts: np.ndarray, n: int) -> float:
    """The correctly rounded float64 of the partials' exact sum (CPython math_fsum's final loop)."""
    if n == 0:
        return 0.0
    n -= 1
    hi = parts[n]
    lo = 0.0
    while n > 0:
        x = hi
        n -= 1
        y = parts[n]
        hi = x + y
        lo = y - (hi - x)
        if lo != 0.0:
            break
    # Half-even fix-up: hi + lo looks like a tie, but the partials below push it one way.
    if n > 0 and ((lo < 0.0 and parts[n - 1] < 0.0) or (lo > 0.0 and parts[n - 1] > 0.0)):
        y = lo * 2.0
        x = hi + y
        if y == x - hi:
            hi = x
    return hi


@njit(cache=True, nogil=True, inline="always")
def _kbits(n: int) -> int:
    """ceil(log2(n + 2)), the headroom bits of an ExtractVector pass over n terms."""
    b = 0
    while (1 << b) < n + 2:
        b += 1
    return b


@njit(cache=True, nogil=True, fastmath={"reassoc"})
def _exact_sum(q: np.ndarray, n: int) -> float:
    """sum(q[:n]) for terms whose sum is exact in ANY order (ExtractVector's q's): reassociation, which lets
    LLVM vectorise this loop, cannot change it. Nothing else may go into this function."""
    s = 0.0
    for i in range(n):
        s += q[i]
    return s


@njit(cache=True, nogil=True)
def _max_abs(bits: np.ndarray, n: int) -> int:
    """The largest |x| of finite float64s, as its bit pattern (integer order = magnitude order; vectorises)."""
    m = 0
    for i in range(n):
        v = bits[i] & 0x7FFFFFFFFFFFFFFF
        m = v if v > m else m
    return m


@njit(cache=True, nogil=True)
def _extract(r: np.ndarray, q1: np.ndarray, q2: np.ndarray, n: int, s1: float, s2: float) -> None:
    """ExtractVector at sigma s1 and then s2 (s2 = 0: one level): q1, q2 the extracted parts, r the rest."""
    if s2 == 0.0:
        for i in range(n):
            x = r[i]
            q = (s1 + x) - s1
            q1[i] = q
            r[i] = x - q
    else:
        for i in range(n):
            x = r[i]
            q = (s1 + x) - s1
            x -= q
            q1[i] = q
            q = (s2 + x) - s2
            q2[i] = q
            r[i] = x - q


@njit(cache=True, nogil=True)
def _two_levels(r: np.ndarray, n: int, s: int) -> tuple[int, int, int]:
    """(K1, K2, Z) with sum(r[:n]) = K1 2^(s-52) + K2 2^(s-104) exactly where Z = 0, for |r| <= 2^(s-1),
    n <= _LEVEL_BLOCK and -970 <= s <= 960 (Z != 0: some term has bits below 2^(s-104)).

    ExtractVector's two levels with sigma = 1.5 2^s and 1.5 2^(s-52) (ReproBLAS's form, not 2^s): then
    t = fl(sigma + x) lies in [2^s, 2^(s+1)] for every |x| <= 2^(s-1), where float64 bit patterns step by one
    per 2^(s-52), so bits(t) - bits(sigma) is q / 2^(s-52) for the extracted q = t - sigma (exact by
    Sterbenz), and x - q is exact (|x - q| <= 2^(s-53) and a multiple of x's ulp, or q = 0). Its integer sum
    is exact (each |q| / 2^(s-52) <= 2^51); the second level takes x - q, <= 2^(s-53) = 2^((s-52)-1) as it
    needs; Z ORs what is left below 2^(s-104) (shifted past the sign: -0 is nothing left). One branch-free
    pass of integer sums, where `_extract` plus `_exact_sum` read and wrote the terms four times."""
    s1, s2 = math.ldexp(1.5, s), math.ldexp(1.5, s - 52)
    b1, b2 = _bits(s1), _bits(s2)
    k1 = k2 = z = 0
    for i in range(n):
        x = r[i]
        t1 = s1 + x
        y = x - (t1 - s1)
        t2 = s2 + y
        k1 += _bits(t1) - b1
        k2 += _bits(t2) - b2
        z |= _bits(y - (t2 - s2)) << 1
    return k1, k2, z


@njit(cache=True, nogil=True, inline="always")
def _add_integer(parts: np.ndarray, n: int, k: int, e: int) -> int:
    """Add k 2^e exactly to the partials parts[:n] (|k| <= 2^62, -1074 <= e <= 908): as its high and low 32
    bits, each exact in float64; the new count, -1 where n is."""
    if -(1 << 53) <= k <= 1 << 53:  # exact as one float64: one msum step, not two
        return _msum_add(parts, n, math.ldexp(np.float64(k), e)) if n >= 0 else n
    for half, at in ((k >> 32, e + 32), (k & 0xFFFFFFFF, e)):
        if n >= 0:
            n = _msum_add(parts, n, math.ldexp(np.float64(half), at))
    return n


@njit(cache=True, nogil=True)
def distill_into(r: np.ndarray, n: int, q1: np.ndarray, q2: np.ndarray, box: np.ndarray, parts: np.ndarray,
                  np_: int) -> int:
    """Add the exact sum of the finite r[:n] into the partials; the new count, -1 to flag. r is consumed.

    Each sweep runs two ExtractVector levels: after a level with sigma = 2^top every remainder is at most
    2^(top-53), so sigma' = 2^(top - 53 + kbits) >= (n + 2) max|r| holds for the next level without
    measuring it. Grid products need one sweep. The level sums are exact; only they enter msum.
    Before that, blocks of terms with no bits below 2^(e-104), 2^(e-1) > max|r| (every position captured at
    resnet-tiny width 32: their products span ~15 bits), are summed by `_two_levels` in one pass; the sweeps
    take the rest from the first block that has bits below.
    box: a 1-element int64 array viewed as float64, through which `_max_abs`' bits become a float."""
    rb = r.view(np.int64)
    fbox = box.view(np.float64)
    box[0] = _max_abs(rb, n)
    if box[0] != 0:
        e = math.frexp(fbox[0])[1] + 1  # max|r| < 2^(e-1)
        while -970 <= e <= 960 and n > 0:
            hi = min(n, _LEVEL_BLOCK)
            k1, k2, z = _two_levels(r, hi, e)
            if z != 0:
                break
            np_ = _add_integer(parts, _add_integer(parts, np_, k1, e - 52), k2, e - 104)
            if np_ < 0:
                return -1
            r, rb, n = r[hi:], rb[hi:], n - hi
        if n == 0:
            return np_
        box[0] = _max_abs(rb, n)
    kbits = _kbits(n)
    step = 53 - kbits
    while box[0] != 0:
        top = math.frexp(fbox[0])[1] + kbits  # max|r| < 2^e
        if top >= 1024:
            return -1
        if top < -1020:  # every partial sum is a multiple of 2^-1074 below 2^-1021: a plain sum is exact
            s = 0.0
            for i in range(n):
                s += r[i]
            return _msum_add(parts, np_, s)
        s1 = math.ldexp(1.0, top)
        s2 = math.ldexp(1.0, top - step) if top - step >= -1020 else 0.0
        _extract(r, q1, q2, n, s1, s2)
        np_ = _msum_add(parts, np_, _exact_sum(q1, n))
        if np_ >= 0 and s2 != 0.0:
            np_ = _msum_add(parts, np_, _exact_sum(q2, n))
        if np_ < 0:
            return -1
        box[0] = _max_abs(rb, n)
    return np_


@njit(cache=True, nogil=True)
def _two_products(a: np.ndarray, b: np.ndarray, terms: np.ndarray) -> bool:
    """terms[t] + terms[k + t] = a[t] b[t] exactly (TwoProduct, k = a.size); False where some product is outside
    its exact range. (A function of its own, not inlined into `dot`: LLVM then compiles this loop 1.6x
    faster.)"""
    k = a.size
    ok = True
    for t in range(k):
        x, y = a[t], b[t]
        h = x * y
        ph, ax, ay = abs(h), abs(x), abs(y)
        # bitwise, not short-circuit: no branches in the loop (inf and NaN fail every test)
        ok &= ((ax < 2.0**995) & (ay < 2.0**995) & (ph >= 2.0**-900) & (ph < 2.0**1000)) | (
            ((x == 0.0) | (y == 0.0)) & (ax < math.inf) & (ay < math.inf))
        cx, cy = _SPLIT * x, _SPLIT * y
        xh = cx - (cx - x)
        yh = cy - (cy - y)
        xl, yl = x - xh, y - yh
        lo = ((xh * yh - h) + xh * yl + xl * yh) + xl * yl
        terms[t] = h
        terms[k + t] = lo if h != 0.0 else 0.0  # a zero factor: the split may have overflowed
    return ok


@njit(cache=True, nogil=True)
def workspace(k: int) -> tuple[np.ndarray, ...]:
    """The scratch arrays `dot` needs for lines of k values (terms, two extraction levels, a bit box, the
    partials and their copy), allocated once per kernel call."""
    return (np.empty(2 * k), np.empty(2 * k), np.empty(2 * k), np.zeros(1, dtype=np.int64), np.empty(_PARTS),
            np.empty(_PARTS))


@njit(cache=True, nogil=True)
def partials(rows: int) -> np.ndarray:
    """Room for the partials of `rows` sums accumulated side by side (`accumulate`)."""
    return np.empty((rows, _PARTS))


@njit(cache=True, nogil=True, inline="always")
def accumulate(a: np.ndarray, b: np.ndarray, both_short: bool, terms: np.ndarray, q1: np.ndarray, q2: np.ndarray,
               box: np.ndarray, parts: np.ndarray, n: int) -> int:
    """Add a . b exactly to the nonoverlapping partials parts[:n] (float64 lines a and b; both_short: both hold
    short values only, `short`; terms, q1, q2, box: `workspace(a.size)`'s): the new count, or -1 where
    this kernel cannot (the position is flagged: see the module docstring). A sum's lines may come in pieces,
    each added as it is gathered (vtrain.resolve's weight gradients: image by image)."""
    k = a.size
    if both_short:
        # Short values (0, or <= 24 bits with 2^-149 <= |v| < 2^128): every product is 0 or within
        # 2^-298 .. 2^256 with <= 48 bits, so the float64 product is exact and TwoProduct safe.
        for t in range(k):
            terms[t] = a[t] * b[t]
        nt = k
    else:
        if not _two_products(a, b, terms):
            return -1
        nt = 2 * k
    return distill_into(terms, nt, q1, q2, box, parts, n)


@njit(cache=True, nogil=True, inline="always")
def round_partials(parts: np.ndarray, n: int, m: int, gmax: float, tmp: np.ndarray) -> tuple[float, bool]:
    """(RNE_grid of the exact sum of the partials parts[:n], True), or (0.0, False) where this kernel cannot
    (a flag); tmp: `workspace`'s copy of the partials (a midpoint's residual that needs more room flags)."""
    s = _fsum_finish(parts, n)
    ex = max(math.frexp(s)[1] - 1, _EMIN) if s != 0.0 else _EMIN
    q = math.ldexp(1.0, ex - m)  # the grid spacing at s; s / q and r * q are exact
    t_ = s / q
    fl = math.floor(t_)
    if t_ - fl == 0.5:  # s on a midpoint: the sign of S - s decides
        tmp[:n] = parts[:n]
        nn = _msum_add(tmp, n, -s)
        if nn < 0:
            return 0.0, False
        res = 0.0 if nn == 0 else tmp[nn - 1]  # nonoverlapping partials: the top one has the sign
        r = (fl + 1.0) * q if res > 0.0 else fl * q if res < 0.0 else np.rint(t_) * q
    else:
        r = np.rint(t_) * q
    r += 0.0  # -0 -> +0
    if not abs(r) <= gmax:
        return 0.0, False
    return r, True


@njit(cache=True, nogil=True, inline="always")
def dot(a: np.ndarray, b: np.ndarray, both_short: bool, e: float, m: int, gmax: float, terms: np.ndarray,
        q1: np.ndarray, q2: np.ndarray, box: np.ndarray, parts: np.ndarray, tmp: np.ndarray) -> tuple[float, bool]:
    """(RNE_grid(a . b + e), True) for float64 lines a and b, or (0.0, False) where this kernel cannot (the
    position is flagged: see the module docstring). both_short: both lines hold short values only (`short`);
    e: the addend, 0.0 for none; the rest is `workspace(a.size)`."""
    n = 0
    if not math.isfinite(e):
        return 0.0, False
    if e != 0.0:
        parts[0] = e
        n = 1
    n = accumulate(a, b, both_short, terms, q1, q2, box, parts, n)
    if n < 0:
        return 0.0, False
    return round_partials(parts, n, m, gmax, tmp)


@njit(cache=True, nogil=True, inline="always")
def dot_at(a: np.ndarray, b: np.ndarray, e: float, m: int, gmax: float, work: tuple, out: np.ndarray,
           flag: np.ndarray, t: int) -> None:
    """out[t] = RNE_grid(a . b + e) for two gathered float64 lines (whether they are short found here), or
    flag[t] where `dot` cannot; work: `workspace(k)` for k >= a.size."""
    terms, q1, q2, box, parts, tmp = work
    out[t], done = dot(a, b, short(a) and short(b), e, m, gmax, terms, q1, q2, box, parts, tmp)
    flag[t] = not done


@njit(cache=True, nogil=True)
def _dots(ag: np.ndarray, ashort: np.ndarray, bg: np.ndarray, bshort: np.ndarray, ia: np.ndarray,
          ib: np.ndarray, extra: np.ndarray, m: int, gmax: float, out: np.ndarray, flag: np.ndarray) -> None:
    """out[p] = RNE_grid(ag[ia[p]] . bg[ib[p]] + extra[p]) (extra empty: no addend); flag[p] where not done."""
    terms, q1, q2, box, parts, tmp = workspace(ag.shape[1])
    has_extra = extra.size > 0
    for p in range(ia.size):
        e = extra[p] if has_extra else 0.0
        both = math.isfinite(e) and _known_short(ag, ashort, ia[p]) and _known_short(bg, bshort, ib[p])
        r, done = dot(ag[ia[p]], bg[ib[p]], both, e, m, gmax, terms, q1, q2, box, parts, tmp)
        if done:
            out[p] = r
        else:
            flag[p] = True


def _addend(extra: np.ndarray | None, p: int, where: str) -> np.ndarray:
    """The per-position addends as a float64 array (empty: none), checked against the position count."""
    if extra is None:
        return np.zeros(0)
    ex = np.ascontiguousarray(extra, dtype=np.float64).reshape(-1)
    if ex.size != p:
        raise exactmath.ExactMathError(f"{where}: extra has {ex.size} values for {p} positions")
    return ex


def _unknown(lines: int) -> np.ndarray:
    """Short flags of `lines` lines, none known yet (see `_known_short`)."""
    return np.full(lines, -1, dtype=np.int8)


def distinct(keys: np.ndarray, top: int) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(keys, return_inverse=True) for integer keys in [0, top): through a table where that is small beside
    the keys (a certificate's rows or channels), whose sort cost ~20 us a call in a training step."""
    if top > max(16 * keys.size, 1 << 14):
        uniq, inverse = np.unique(keys, return_inverse=True)
        return uniq, inverse.reshape(-1)
    seen = np.zeros(top, np.bool_)
    seen[keys] = True
    uniq = np.flatnonzero(seen)
    table = np.empty(top, np.int64)
    table[uniq] = np.arange(uniq.size)
    return uniq, table[keys]


@njit(cache=True, nogil=True)
def _side(direct: bool, x2: np.ndarray, x: np.ndarray, batch: np.ndarray, line: np.ndarray) -> tuple:
    """(contiguous float64 lines holding x[batch, line, :], their short flags, index per position, whether every
    position lies inside x): x's own memory x2, (N R, K), where `direct` (x float64 and C-contiguous: a row-major
    matrix's rows, a transposed weight's columns), else copies of the distinct lines, in memory order. (Copying
    them cost ~20 % of the resolution's time at GPT-2-tiny d_model 512: docs/benchmarks.md, session 28.)"""
    top = x.shape[0] * x.shape[1]
    keys = batch * x.shape[1] + line
    # (each index in its own range: a key in range alone let (0, R) read batch 1's first line)
    if keys.size and (batch.min() < 0 or batch.max() >= x.shape[0] or line.min() < 0 or line.max() >= x.shape[1]):
        return x2[:0], np.zeros(0, np.int8), keys, False
    if direct:
        return x2, np.full(top, -1, np.int8), keys, True
    # the distinct keys ascending and each position's index among them (np.unique's, with its inverse)
    order = np.argsort(keys, kind="mergesort")
    uniq, inverse, count = np.empty(keys.size, np.int64), np.empty(keys.size, np.int64), 0
    for t in order:
        if count == 0 or keys[t] != uniq[count - 1]:
            uniq[count] = keys[t]
            count += 1
        inverse[t] = count - 1
    uniq = uniq[:count]
    lines = np.empty((count, x.shape[2]))
    copy_lines(x, uniq // x.shape[1], uniq % x.shape[1], lines)
    return lines, np.full(count, -1, np.int8), inverse, True


@njit(cache=True, nogil=True)
def _gathered_dots(a_direct: bool, a2: np.ndarray, a: np.ndarray, b_direct: bool, b2: np.ndarray, bt: np.ndarray,
                   batch: np.ndarray, rows: np.ndarray, cols: np.ndarray, extra: np.ndarray, m: int, gmax: float,
                   out: np.ndarray, flag: np.ndarray) -> tuple:
    """`_dots` at the positions (batch, rows, cols) of a @ b (bt: b's columns as lines, (N, C, K)), their lines
    gathered by `_side`, in one compiled call: in Python, the gathers' ~10 numpy calls a matmul took ~120 us of
    each resolution's ~240 in a training step (GPT-2-tiny d_model 256, ~36 a step). (a's lines, their index, b's,
    theirs, whether every position lies inside the operands: else nothing is computed.)"""
    ag, ashort, ia, inside_a = _side(a_direct, a2, a, batch, rows)
    bg, bshort, ib, inside_b = _side(b_direct, b2, bt, batch, cols)
    if inside_a and inside_b:
        _dots(ag, ashort, bg, bshort, ia, ib, extra, m, gmax, out, flag)
    return ag, ia, bg, ib, inside_a and inside_b


def _direct(x: np.ndarray) -> tuple[bool, np.ndarray]:
    """(whether `_side` reads x's lines in place, x as (N R, K) lines then, else an empty stand-in)."""
    if x.dtype == np.float64 and x.flags.c_contiguous:
        return True, x.reshape(x.shape[0] * x.shape[1], x.shape[2])
    return False, np.zeros((0, x.shape[2]))


def rounded_dots_at(a: np.ndarray, b: np.ndarray, batch: np.ndarray, rows: np.ndarray, cols: np.ndarray,
                    bits: int, extra: np.ndarray | None = None) -> np.ndarray:
    """RNE_grid(sum_k a[n,r,k] b[n,k,c] + extra) at the positions (n, r, c) = (batch, rows, cols); float64.

    a (N, R, K) and b (N, K, C): float64 or float32 numpy arrays, any strides (views of torch tensors).
    `extra`: one exact float64 addend per position, or None. Bit-identical to exactmath.rounded_dots on the
    gathered rows, which it calls for the positions the kernel flags (and which raises its errors there).
    """
    m = check_bits(bits)
    batch, rows, cols = (np.ascontiguousarray(v, dtype=np.int64).reshape(-1) for v in (batch, rows, cols))
    if a.ndim != 3 or b.ndim != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1] \
            or not batch.size == rows.size == cols.size:
        raise exactmath.ExactMathError(f"rounded_dots_at: operands {a.shape} and {b.shape} do not multiply, "
                                       f"or positions of different lengths")
    ex = _addend(extra, batch.size, "rounded_dots_at")
    bt = b.transpose(0, 2, 1)  # (N, C, K): b's columns as lines
    out, flag = np.zeros(batch.size), np.zeros(batch.size, dtype=np.bool_)
    ag, ia, bg, ib, inside = _gathered_dots(*_direct(a), a, *_direct(bt), bt, batch, rows, cols, ex, m,
                                            grid_max(m + 9), out, flag)
    if not inside:
        raise exactmath.ExactMathError(f"rounded_dots_at: a position lies outside the operands {a.shape} @ {b.shape}")
    return _complete(out, flag, ag, ia, bg, ib, ex, bits, extra is not None)


def _rows(a: np.ndarray, b: np.ndarray, bits: int, extra: np.ndarray | None, where: str) -> tuple:
    m = check_bits(bits)
    if a.ndim != 2 or a.shape != b.shape:
        raise exactmath.ExactMathError(f"{where}: a and b must have the same (n, K) shape, got {a.shape}, {b.shape}")
    ag, bg = np.ascontiguousarray(a, dtype=np.float64), np.ascontiguousarray(b, dtype=np.float64)
    ia = np.arange(a.shape[0])
    return ag, _unknown(a.shape[0]), ia, bg, _unknown(b.shape[0]), ia, _addend(extra, a.shape[0], where), m


def rounded_dots(a: np.ndarray, b: np.ndarray, bits: int, extra: np.ndarray | None = None) -> np.ndarray:
    """exactmath.rounded_dots(a, b, bits, extra) for (P, K) float64/float32 arrays, compiled (same bits)."""
    return _finish(*_rows(a, b, bits, extra, "rounded_dots"), bits, extra is not None)


def kernel(a: np.ndarray, b: np.ndarray, bits: int, extra: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(values, flagged) of the compiled kernel alone for (P, K) rows: values[i] = RNE_grid(a[i] . b[i] +
    extra[i]) where not flagged[i] (0 where flagged). For tests and diagnostics; rounded_dots completes
    the flagged rows."""
    return _run(*_rows(a, b, bits, extra, "kernel"))


def _run(ag: np.ndarray, ashort: np.ndarray, ia: np.ndarray, bg: np.ndarray, bshort: np.ndarray,
         ib: np.ndarray, ex: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    out = np.zeros(ia.size)
    flag = np.zeros(ia.size, dtype=np.bool_)
    _dots(ag, ashort, bg, bshort, ia, ib, ex, m, grid_max(m + 9), out, flag)
    return out, flag


def _finish(ag: np.ndarray, ashort: np.ndarray, ia: np.ndarray, bg: np.ndarray, bshort: np.ndarray,
            ib: np.ndarray, ex: np.ndarray, m: int, bits: int, has_extra: bool) -> np.ndarray:
    return _complete(*_run(ag, ashort, ia, bg, bshort, ib, ex, m), ag, ia, bg, ib, ex, bits, has_extra)


def _complete(out: np.ndarray, flag: np.ndarray, ag: np.ndarray, ia: np.ndarray, bg: np.ndarray, ib: np.ndarray,
              ex: np.ndarray, bits: int, has_extra: bool) -> np.ndarray:
    """out, with the positions the kernel flagged settled by the reference."""
    f = np.flatnonzero(flag)
    if f.size:  # the reference settles these exactly (Fractions) or raises its error
        out[f] = exactmath.rounded_dots(ag[ia[f]], bg[ib[f]], bits, extra=ex[f] if has_extra else None)
    return out
