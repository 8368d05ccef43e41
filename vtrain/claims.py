"""What a site's log entries claim, as the auditor reads them (RoundedExecution._apply_entries), in one compiled pass.

The auditor holds its own unrounded value v and rounding r at each entry's position. A direction entry claims the
grid neighbour of r on the side it names of the boundary nearer v (a zero there takes the boundary's sign, as the
trainer's value between that boundary and zero rounded to); a value entry claims the value its residue names in
the auditor's range, which is r itself wherever the residue is r's own (`valuecode.names_own`). Only the entries
whose claim may differ from r need the band to be checked, and only they are taken further. This pass reads the
entries' v and r, makes the direction entries' claims, and finds those entries: on the GPT-2 scale model's ~480K
entries a step, numpy's ~20 passes over them took ~10 ms of the auditor's ~68 ms step. It runs the numpy path's IEEE
operations in r's dtype, so it makes the same claims; RoundedExecution keeps that path for tensors the kernels do
not take.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from vtrain.fused import _spacings
from vtrain.grid import check_bits, grid_max
from vtrain.roundlog import SiteLog
from vtrain.valuecode import names_own_one, top_index


class Claims(NamedTuple):
    pos: np.ndarray  # the direction entries' positions, then the value entries'
    vv: np.ndarray  # the auditor's unrounded values there
    rr: np.ndarray  # and its roundings
    claim: np.ndarray  # the direction entries' claims; r at the value entries (decoded where needed)
    need: np.ndarray  # whether an entry's claim may differ from r (a direction entry's claim is not r; a value
    # entry's residue is not r's own)
    twice: int  # the first position that both a direction and a value entry claim, or -1


def read(v: np.ndarray, r: np.ndarray, entry: SiteLog, bits: int) -> Claims:
    """The claims of `entry`'s entries on flat v and r (numpy arrays of one float dtype, the entries' positions
    inside them: the caller checks)."""
    m = check_bits(bits)
    nd = entry.dir_pos.size
    if entry.dir_up.size != nd or not entry.val_res.size == entry.val_bits.size == entry.val_pos.size:
        raise ValueError(f"site {entry.site}: entry arrays of different lengths")  # (the kernel reads them unchecked)
    pos = np.concatenate([entry.dir_pos, entry.val_pos])
    vv, rr, claim = np.empty(pos.size, r.dtype), np.empty(pos.size, r.dtype), np.empty(pos.size, r.dtype)
    need = np.empty(pos.size, np.bool_)
    one = r.dtype.type  # (the constants in r's dtype, as numpy takes Python floats: the products round in it)
    twice = _read(v, r, pos, nd, entry.dir_up, entry.val_res, entry.val_bits, one(1.0 - 2.0 ** -(m + 1)), 2.0**-m,
                  one(0.5), m, top_index(bits), grid_max(bits), vv, rr, claim, need)
    return Claims(pos, vv, rr, claim, need, twice)


@njit(cache=True, nogil=True, error_model="numpy")
def _read(v: np.ndarray, r: np.ndarray, pos: np.ndarray, nd: int, dir_up: np.ndarray, val_res: np.ndarray,
          val_bits: np.ndarray, shrink: float, q: float, half: float, m: int, top: int, gmax: float, vv: np.ndarray,
          rr: np.ndarray, claim: np.ndarray, need: np.ndarray) -> int:
    """`read`'s pass: vv, rr, claim and need filled; returns `Claims.twice`."""
    spacing = np.empty(2, r.dtype)  # (the spacings stored in r's dtype, as `fused.geometry` returns them)
    for i in range(pos.size):
        vv[i], rr[i] = v[pos[i]], r[pos[i]]
    for i in range(nd):
        g = rr[i]
        spacing[0], spacing[1] = _spacings(g, shrink, q)
        down, up = spacing[0], spacing[1]
        diff = vv[i] - g
        near_lo = diff + down * half <= up * half - diff
        side = (g if near_lo else g + up) if dir_up[i] else (g - down if near_lo else g)
        boundary = g - down * half if near_lo else g + up * half
        claim[i] = np.copysign(side, boundary) if side == 0 else side
        need[i] = claim[i] != g
    for i in range(nd, pos.size):
        claim[i] = rr[i]
        need[i] = not names_own_one(rr[i], val_res[i - nd], val_bits[i - nd], m, top, gmax)
    # both lists strictly increase: one merge walk finds a position in both
    a, b = 0, nd
    while a < nd and b < pos.size:
        if pos[a] == pos[b]:
            return pos[a]
        if pos[a] < pos[b]:
            a += 1
        else:
            b += 1
    return -1
