"""The auditor's reading of a site's log entries in one compiled pass (vtrain.claims) against the numpy path it
stands for (RoundedExecution._claims): the same positions, values, claims bit for bit (signed zeros included),
the same entries taken further, the same doubly claimed position."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vtrain import claims, fused
from vtrain.devices import get_device
from vtrain.grid import round_unchecked
from vtrain.rounding import RoundedExecution
from vtrain.roundlog import SiteLog
from vtrain.valuecode import encode


def _site(gen: np.random.Generator, v: np.ndarray, r: np.ndarray, bits: int, overlap: bool) -> SiteLog:
    """Direction entries (either side) and value entries at disjoint sorted positions (one shared if `overlap`),
    the value entries' codes those of r, of a neighbour of r, or of values far off."""
    n = v.size
    pos = np.sort(gen.choice(n, n // 2, replace=False))
    as_value = gen.random(pos.size) < 0.4
    dir_pos, val_pos = pos[~as_value], pos[as_value]
    if overlap:  # (two positions claimed twice: the first is named)
        val_pos = np.sort(np.concatenate([val_pos, dir_pos[len(dir_pos) // 2:][:1], dir_pos[-1:]]))
    named = r[val_pos] * np.where(gen.random(val_pos.size) < 0.6, 1, gen.choice([1 + 2.0**-8, -3.0], val_pos.size))
    named = round_unchecked(torch.from_numpy(named.astype(r.dtype)), bits).numpy()
    band = np.abs(v[val_pos]) * 2.0 ** -(bits - 11) + 1e-30
    res, widths = encode(v[val_pos], named, band.astype(r.dtype), bits)
    return SiteLog(0, "aten.mm.default", (n,), dir_pos.astype(np.int64), gen.random(dir_pos.size) < 0.5,
                   val_pos.astype(np.int64), res, widths)


@pytest.mark.parametrize("dtype,bits", [(np.float64, 32), (np.float32, 19), (np.float64, 19)])
def test_the_compiled_reading_makes_the_numpy_paths_claims(dtype: type, bits: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    gen = np.random.default_rng(bits)
    tiny = 2.0 ** (-126 - (bits - 9))  # the subnormal spacing: values astride zero and its boundaries
    v = np.concatenate([gen.standard_normal(3000) * 10.0 ** gen.integers(-3, 4, 3000),
                        gen.uniform(-3, 3, 300) * tiny, [-0.4 * tiny, 0.4 * tiny, -0.0, 0.0]]).astype(dtype)
    r = round_unchecked(torch.from_numpy(v), bits).numpy()
    rx = RoundedExecution(bits=bits, device=get_device("cpu"), mode="record")
    for overlap in (False, True):
        entry = _site(gen, v, r, bits, overlap)
        got = claims.read(v, r, entry, bits)
        monkeypatch.setattr(fused, "ENABLED", False)  # (the reference: numpy's geometry too)
        want = rx._claims(entry, torch.from_numpy(v), torch.from_numpy(r))
        monkeypatch.undo()
        as_bits = np.int64 if r.itemsize == 8 else np.int32
        for name in ("pos", "vv", "rr", "claim"):
            g, w = getattr(got, name), getattr(want, name)
            assert g.dtype == w.dtype and np.array_equal(g.view(as_bits) if name != "pos" else g,
                                                         w.view(as_bits) if name != "pos" else w), name
        assert got.need.tolist() == want.need.tolist() and got.twice == want.twice
        nd = entry.dir_pos.size
        # (what the data makes of the entries: direction claims either side, zeros of both signs among them,
        # value entries naming r and others)
        assert 0 < got.need[:nd].sum() < nd and 0 < got.need[nd:].sum() < entry.val_pos.size
        assert ((got.claim[:nd] == 0) & np.signbit(got.claim[:nd])).any()
        assert got.twice == (entry.dir_pos[len(entry.dir_pos) // 2] if overlap else -1)
    entry.val_bits = entry.val_bits[1:]
    with pytest.raises(ValueError, match="different lengths"):  # (the kernel reads them unchecked)
        claims.read(v, r, entry, bits)
