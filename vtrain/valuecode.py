"""Value entries of the rounding log as residues (DESIGN.md §1.3; docs/numerics.md "The log").

Where the band is wide (w >= 1/8 of the grid spacing) the trainer logs which grid value it holds, not a
direction. Number the grid in order (vtrain.grid.grid_index: -0 and +0 are two neighbours, since the log
must reproduce a signed zero). The auditor's legitimate range, round(v' - w') .. round(v' + w'), lies in
round(v - 2.25w) .. round(v + 2.25w) of the trainer's unrounded v: |v - v'| <= 2E < w, and w' <= 1.25 w.
(Two honest devices' bounds are two upper bounds of the same sum of |terms|, each at most 1 + 3 gamma_k
above it in the precision it was summed in: under 20 % for float32 sums of < 2^20 terms, which is where
vtrain.bounds takes its float32 path for float64 work; float32 work with longer sums is outside this
argument.) Any 2^width consecutive indices differ modulo 2^width, so the trainer writes its value's index
modulo 2^width, the width the smallest that spans round(v -+ MARGIN w), and the residue names exactly one
value of the auditor's range. On the scale models (bits = 19) that is ~2 bits a value, against the 3 bytes
of the value itself (log format version 2).

The auditor takes the smallest value of its own range with that residue; a residue that names none is
illegitimate (no honest device could have produced it). A residue that is the auditor's own value's names
that value (`names_own`), with no band to compute: the common case (on the trainer's own device every entry
names the auditor's value, on others all but the few corrections a step do). The kernels run per op site on
the few entries there, where numpy's ~15 calls cost ~30 us a site (1 ms a step on the scale CNN); the
numbering is `vtrain.grid.grid_index`'s, bit for bit (tests/numerics/test_num_value_entries.py). The residues
travel in one bit stream, each in its width's bits, least significant first (`pack`, `unpack`).
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit

from vtrain.fused import round_scalar
from vtrain.grid import check_bits, grid_index, grid_max

MARGIN = 2.25  # the trainer's code spans round(v -+ MARGIN * band): 1 + 1.25 for the auditor's (see above)


def encode(vv: np.ndarray, rr: np.ndarray, ww: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(residues int64, widths uint8) of the trainer's grid values rr, unrounded vv, bands ww."""
    m = check_bits(bits)
    res, widths = np.empty(vv.size, np.int64), np.empty(vv.size, np.uint8)
    if vv.size:
        _encode(vv, rr, ww, MARGIN, m, top_index(bits), bits, res, widths)
    return res, widths


def entries(pos: np.ndarray, vv: np.ndarray, rr: np.ndarray, ww: np.ndarray, near_lo: np.ndarray, wide: np.ndarray,
            exact: np.ndarray | None, values: bool, bits: int) -> tuple[np.ndarray, ...]:
    """An op site's log entries from its candidates within their band (flat positions pos, unrounded vv, grid
    values rr, bands ww, whether the boundary below rr is the nearer one, whether the band is wide): where
    `values` (the bound policy), the wide ones as value entries, the others as direction entries; none where
    `exact` (a certificate's proof) holds. Returns (direction positions, their near_lo, value positions, residues,
    widths), in pos's order. One compiled pass: on the GPT-2 scale model's ~480K candidates a step, numpy's
    selections and `encode`'s gathers took ~5 ms."""
    m = check_bits(bits)
    n = pos.size
    if not all(a.shape == (n,) for a in (vv, rr, ww, near_lo, wide) + (() if exact is None else (exact,))):
        raise ValueError(f"{n} positions for arrays of other lengths")  # (the kernel reads them unchecked)
    # (each list sized as it comes out: the site's log keeps them for the step)
    kept = n if exact is None else n - int(np.count_nonzero(exact))
    nv = 0 if not values else int(np.count_nonzero(wide if exact is None else wide & ~exact))
    dir_pos, dir_up, val_pos = np.empty(kept - nv, np.int64), np.empty(kept - nv, np.bool_), np.empty(nv, np.int64)
    res, widths = np.empty(nv, np.int64), np.empty(nv, np.uint8)
    _entries(pos, vv, rr, ww, near_lo, wide, _NO_PROOFS if exact is None else exact, values, MARGIN, m,
             top_index(bits), bits, dir_pos, dir_up, val_pos, res, widths)
    return dir_pos, dir_up, val_pos, res, widths


_NO_PROOFS = np.zeros(0, np.bool_)


def decode(vv: np.ndarray, ww: np.ndarray, res: np.ndarray, widths: np.ndarray,
           bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(the grid values (float64) the residues name in the auditor's ranges round(vv - ww) .. round(vv + ww),
    whether each names one); where none, the range's top."""
    m = check_bits(bits)
    values, named = np.empty(vv.size), np.empty(vv.size, np.bool_)
    if vv.size:
        _decode(vv, ww, res.astype(np.int64), widths.astype(np.int64), m, top_index(bits), values, named)
    return values, named


def names_own(rr: np.ndarray, res: np.ndarray, widths: np.ndarray, bits: int) -> np.ndarray:
    """Whether each residue is that of the auditor's own grid value rr. In an honest log that holds exactly
    where the trainer's value is rr (two values of one code's span differ modulo 2^width), and `decode`
    would name rr: the auditor then needs no band to decode it. (In a dishonest log whose code spans fewer
    values than the auditor's range, `decode` may name a smaller value of the same residue; rr, the auditor's
    own rounding, is the harmless choice.)"""
    m = check_bits(bits)
    out = np.empty(rr.size, np.bool_)
    if rr.size:
        _names_own(rr, res.astype(np.int64), widths.astype(np.int64), m, top_index(bits), grid_max(bits), out)
    return out


@njit(cache=True, nogil=True, error_model="numpy")
def _names_own(rr: np.ndarray, res: np.ndarray, widths: np.ndarray, m: int, top: int, gmax: float,
               out: np.ndarray) -> None:
    for i in range(rr.size):
        out[i] = names_own_one(rr[i], res[i], widths[i], m, top, gmax)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def names_own_one(r: float, res: int, width: int, m: int, top: int, gmax: float) -> bool:
    """`names_own` of one grid value r (a value off the grid, which `_index` clips to its end, is nobody's)."""
    return abs(r) <= gmax and _residue(r, np.int64(width), m, top) == res


@functools.lru_cache(maxsize=None)
def top_index(bits: int) -> int:
    """The grid index of the largest grid value."""
    return int(grid_index(np.float32(grid_max(bits)), bits))


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _index(g: float, m: int, top: int) -> int:
    """grid_index of one grid value, clipped to the grid (+-inf, and values beyond float32, to its ends)."""
    b = np.int64(np.float32(g).view(np.uint32))
    mag = (b & 0x7FFFFFFF) >> (23 - m)
    k = -mag - 1 if b >> 31 else mag
    return min(max(k, -top - 1), top)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _residue(g: float, width: int, m: int, top: int) -> int:
    """The code of grid value g in `width` bits: its index modulo 2^width (two's complement: the residue of a
    negative index)."""
    return _index(g, m, top) & ((1 << width) - 1)


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _range(v: float, w: float, m: int, top: int) -> tuple[int, int]:
    """The indices of round(v - w) and round(v + w) (v - w in v's own type, as the auditor's torch check)."""
    return (_index(round_scalar(v - w, m, False), m, top),
            _index(round_scalar(v + w, m, False), m, top))


@njit(cache=True, nogil=True, error_model="numpy")
def _encode(vv: np.ndarray, rr: np.ndarray, ww: np.ndarray, margin: float, m: int, top: int, bits: int,
            res: np.ndarray, widths: np.ndarray) -> None:
    for i in range(vv.size):
        res[i], widths[i] = _code(vv[i], rr[i], ww[i], margin, m, top, bits)


@njit(cache=True, nogil=True, error_model="numpy")
def _entries(pos: np.ndarray, vv: np.ndarray, rr: np.ndarray, ww: np.ndarray, near_lo: np.ndarray, wide: np.ndarray,
             exact: np.ndarray, values: bool, margin: float, m: int, top: int, bits: int, dir_pos: np.ndarray,
             dir_up: np.ndarray, val_pos: np.ndarray, res: np.ndarray, widths: np.ndarray) -> tuple[int, int]:
    """`entries`' pass (exact empty: nothing proven), the entries written to the outputs (sized for them): their
    counts (direction, value)."""
    nd, nv = 0, 0
    for i in range(pos.size):
        if exact.size and exact[i]:
            continue
        if values and wide[i]:
            val_pos[nv] = pos[i]
            res[nv], widths[nv] = _code(vv[i], rr[i], ww[i], margin, m, top, bits)
            nv += 1
        else:
            dir_pos[nd], dir_up[nd] = pos[i], near_lo[i]
            nd += 1
    return nd, nv


@njit(cache=True, nogil=True, error_model="numpy", inline="always")
def _code(v: float, r: float, w: float, margin: float, m: int, top: int, bits: int) -> tuple[int, int]:
    """(residue, width) of grid value r's value entry, for unrounded v and band w."""
    lo, hi = _range(v, w * margin, m, top)
    span, width = max(hi - lo, 0), 0  # (hi < lo only for a NaN band, which no legitimacy check passes)
    while span >> width:
        width += 1
    width = min(width, bits)
    return _residue(r, width, m, top), width


@njit(cache=True, nogil=True, error_model="numpy")
def _decode(vv: np.ndarray, ww: np.ndarray, res: np.ndarray, widths: np.ndarray, m: int, top: int,
            values: np.ndarray, named: np.ndarray) -> None:
    for i in range(vv.size):
        lo, hi = _range(vv[i], ww[i], m, top)
        k = lo + ((res[i] - lo) & ((1 << widths[i]) - 1))
        named[i] = k <= hi
        k = min(k, hi)
        mag = -k - 1 if k < 0 else k
        x = np.float64(np.uint32(mag << (23 - m)).view(np.float32))
        values[i] = -x if k < 0 else x


def pack(res: np.ndarray, widths: np.ndarray, bits: int) -> bytes:
    """Residues as one bit stream, each in its width's bits, least significant first, zero-padded to a byte."""
    w = widths.astype(np.int64)
    out = np.zeros((int(w.sum()) + 7) // 8, np.uint8)
    if not _pack(res.astype(np.int64), w, bits, out):
        raise ValueError(f"a value entry's residue does not fit its width (at most {bits} bits)")
    return out.tobytes()


def unpack(buf: bytes, widths: np.ndarray) -> np.ndarray:
    """The residues of a bit stream of `widths` (ValueError for a short stream or nonzero padding: one
    byte string per log, whose hash the leaf commits to)."""
    w = widths.astype(np.int64)
    total = int(w.sum())
    stream = np.frombuffer(buf, np.uint8, (total + 7) // 8)
    if total % 8 and stream[-1] >> (total % 8):
        raise ValueError("nonzero padding after the value residues")
    res = np.empty(w.size, np.int64)
    _unpack(stream, w, res)
    return res


# A byte at a time through a 64-bit accumulator (widths <= 32 plus < 8 pending bits fit): a bit at a time
# took 3 ns a bit, 0.1 ms a step on the scale CNN's 35,000.

@njit(cache=True, nogil=True)
def _pack(res: np.ndarray, widths: np.ndarray, bits: int, out: np.ndarray) -> bool:
    acc, pending, at = 0, 0, 0
    for i in range(res.size):
        w, r = widths[i], res[i]
        if w > bits or r < 0 or r >> w:
            return False
        acc |= r << pending
        pending += w
        while pending >= 8:
            out[at] = acc & 0xFF
            acc >>= 8
            pending -= 8
            at += 1
    if pending:
        out[at] = acc & 0xFF
    return True


@njit(cache=True, nogil=True)
def _unpack(stream: np.ndarray, widths: np.ndarray, res: np.ndarray) -> None:
    acc, pending, at = 0, 0, 0
    for i in range(widths.size):
        w = widths[i]
        while pending < w:
            acc |= np.int64(stream[at]) << pending
            pending += 8
            at += 1
        res[i] = acc & ((1 << w) - 1)
        acc >>= w
        pending -= w
