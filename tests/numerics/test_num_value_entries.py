"""Value entries as residues (vtrain.valuecode): an honest trainer's code names
its own grid value on every auditor whose value and band an honest device could have, signed zeros,
subnormals, infinite bands and the grid's ends included; a code outside the auditor's range names nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vtrain.grid import grid_at_index, grid_index, grid_max, round_unchecked
from vtrain.devices import get_device
from vtrain.rounding import BAND_SLACK, RoundedExecution
from vtrain.roundlog import SiteLog, StepLog
from vtrain.valuecode import decode, encode, entries, names_own


def _round(x: np.ndarray, bits: int) -> np.ndarray:
    return round_unchecked(torch.from_numpy(x), bits).numpy()


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(np.asarray(a, np.float64).view(np.int64), np.asarray(b, np.float64).view(np.int64))


def _cases(bits: int, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """Unrounded values and bands (E * 2 * BAND_SLACK, as the trainer's) across the grid: ordinary values with
    bands from an eighth of a spacing to thousands of spacings, values astride zero and in the subnormal
    range, and values by the largest grid value."""
    gen = np.random.default_rng(bits)
    q_rel = 2.0 ** -(bits - 9)
    v = gen.standard_normal(4000) * 10.0 ** gen.integers(-3, 4, 4000)
    e = np.abs(v) * q_rel * 2.0 ** gen.uniform(-4, 12, 4000)
    tiny = 2.0 ** (-126 - (bits - 9))  # the subnormal spacing
    v_small = gen.uniform(-3, 3, 400) * tiny
    e_small = tiny * 2.0 ** gen.uniform(-3, 6, 400)
    top = grid_max(bits)
    v_top = top * (1 - gen.uniform(0, 2.0**-(bits - 11), 50)) * gen.choice([-1, 1], 50)
    e_top = top * 2.0 ** gen.uniform(-(bits - 7), -1, 50)
    v = np.concatenate([v, v_small, v_top, [-0.3 * tiny, 0.3 * tiny, -0.0, 0.0]]).astype(dtype)
    e = np.concatenate([e, e_small, e_top, [tiny, tiny, tiny, tiny]]).astype(dtype)
    return v, e * dtype(2 * BAND_SLACK)


@pytest.mark.parametrize("bits,dtype", [(19, np.float32), (32, np.float64)])
def test_a_sites_entries_are_its_selections_in_one_pass(bits: int, dtype: type) -> None:
    # valuecode.entries (the trainer's one pass from a site's within-band candidates to its log entries): the
    # candidates a certificate does not prove exact, the wide ones as value entries (`encode`'s codes) under the
    # bound policy and as direction entries under tau, in the candidates' order
    gen = np.random.default_rng(bits)
    v, w = _cases(bits, dtype)
    r = _round(v, bits)
    pos = np.sort(gen.choice(10 * v.size, v.size, replace=False)).astype(np.int64)
    near_lo, wide = gen.random(v.size) < 0.5, gen.random(v.size) < 0.7
    for exact in (None, gen.random(v.size) < 0.3, np.zeros(v.size, np.bool_)):
        keep = np.ones(v.size, np.bool_) if exact is None else ~exact
        for values in (True, False):
            as_value = keep & wide & values
            as_dir = keep & ~as_value
            got = entries(pos, v, r, w, near_lo, wide, exact, values, bits)
            want = (pos[as_dir], near_lo[as_dir], pos[as_value], *encode(v[as_value], r[as_value], w[as_value], bits))
            for g, x in zip(got, want):
                assert g.dtype == x.dtype and g.tolist() == x.tolist()
            assert got[2].size == (int(as_value.sum()) if values else 0) and got[0].size + got[2].size == keep.sum()
    with pytest.raises(ValueError, match="other lengths"):  # (the kernel reads them unchecked)
        entries(pos, v, r, w, near_lo, wide, np.zeros(v.size - 1, np.bool_), True, bits)


@pytest.mark.parametrize("bits,dtype", [(19, np.float32), (19, np.float64), (32, np.float64), (10, np.float64)])
def test_an_honest_code_names_the_trainers_value_on_every_honest_auditor(bits: int, dtype: type) -> None:
    v, w = _cases(bits, dtype)
    r = _round(v, bits)
    res, widths = encode(v, r, w, bits)
    assert (widths <= bits).all() and (res >= 0).all() and (res < (1 << widths.astype(np.int64))).all()
    e = w / dtype(2 * BAND_SLACK)
    # an honest auditor's value is within 2E of the trainer's; its own bound differs from the trainer's in the
    # last bits (summed in another order)
    for shift in (-1.0, -0.5, 0.0, 0.25, 1.0):
        for rel in (1 - 2.0**-12, 1.0, 1 + 2.0**-12):
            with np.errstate(over="ignore"):
                v_aud = (v + dtype(2 * shift) * e).astype(dtype)
            real = np.isfinite(v_aud)  # (a device whose value overflows stops the run: it replays nothing)
            claims, named = decode(v_aud[real], (w[real] * dtype(rel)).astype(dtype), res[real],
                                          widths[real], bits)
            assert named.all()
            assert _same_bits(claims, r[real].astype(np.float64)), (shift, rel)  # -0.0 stays -0.0
            # the residue is the auditor's own value's exactly where that is the trainer's (no band needed)
            mine = _round(v_aud[real], bits)
            same = np.asarray(mine, np.float64).view(np.int64) == np.asarray(r[real], np.float64).view(np.int64)
            assert np.array_equal(names_own(mine, res[real], widths[real], bits), same), (shift, rel)
            assert not same.all() or shift == 0.0  # (the auditors off the trainer's value test the other side)


def test_signed_zero_and_the_subnormal_grid() -> None:
    bits = 19
    tiny = 2.0 ** (-126 - 10)
    v = np.array([-0.3 * tiny, 0.3 * tiny, -1.4 * tiny, 2.6 * tiny])
    r = _round(v, bits)
    assert np.signbit(r).tolist() == [True, False, True, False] and r[0] == 0 == r[1]
    res, widths = encode(v, r, np.full(4, 2 * tiny), bits)
    claims, named = decode(v[::-1].copy()[::-1], np.full(4, 2 * tiny), res, widths, bits)
    assert named.all() and _same_bits(claims, r)
    # -0 and +0 are two values of the numbering, next to each other
    assert grid_index(np.array([-tiny, -0.0, 0.0, tiny]), bits).tolist() == [-2, -1, 0, 1]
    assert _same_bits(grid_at_index(np.array([-2, -1, 0, 1]), bits), np.array([-tiny, -0.0, 0.0, tiny]))


@pytest.mark.parametrize("bits", [10, 19, 32])
def test_the_kernels_number_the_grid_as_grid_index(bits: int) -> None:
    """With no band the auditor's range is its own value, so a full-width residue decodes to that value
    only if the compiled numbering agrees with vtrain.grid.grid_index, both ways, bit for bit."""
    gen = np.random.default_rng(bits)
    v = gen.standard_normal(2000) * 10.0 ** gen.integers(-40, 38, 2000)
    tiny = 2.0 ** (-126 - (bits - 9))
    v = np.concatenate([v, gen.integers(-50, 50, 200) * tiny, [grid_max(bits), -grid_max(bits), -0.0, 0.0]])
    g = _round(v, bits)
    res = np.mod(grid_index(g, bits), 2**bits)
    values, named = decode(g, np.zeros(g.size), res, np.full(g.size, bits, np.uint8), bits)
    assert named.all() and _same_bits(values, g)
    assert _same_bits(grid_at_index(grid_index(g, bits), bits), g)


def test_an_infinite_band_takes_a_full_width_code_and_names_any_grid_value() -> None:
    bits = 19
    values = np.array([grid_max(bits), -grid_max(bits), 1.5, -0.0, 0.0, 2.0**-136])
    res, widths = encode(np.zeros(values.size), values, np.full(values.size, np.inf), bits)
    assert widths.tolist() == [bits] * values.size
    claims, named = decode(np.full(values.size, 7.0), np.full(values.size, np.inf), res, widths, bits)
    assert named.all() and _same_bits(claims, values)


def test_a_code_outside_the_auditors_range_names_nothing() -> None:
    bits = 19
    v = np.array([1.0 + 2.0**-12, 1.0 + 2.0**-12])
    r = np.array([1.0, 1.0 + 2.0**-10])
    res, widths = encode(v, r, np.full(2, 2.0**-12), bits)
    # an auditor that certifies its value exact admits only its own rounding, 1.0
    claims, named = decode(v, np.zeros(2), res, widths, bits)
    assert named.tolist() == [True, False] and claims[0] == 1.0
    # a residue no value of a narrow range has: the range is two values, the width two bits
    far = np.mod(grid_index(np.array([1.0 + 3 * 2.0**-10]), bits), 4)
    _, named = decode(v[:1], np.full(1, 2.0**-12), far, np.array([2], np.uint8), bits)
    assert not named[0]


def test_codes_take_about_two_bits_on_moderate_bands() -> None:
    """The saving itself: a band of a few spacings costs a width of a few bits, not a whole grid value."""
    bits = 19
    v = np.linspace(1.0, 2.0, 1001)
    for spacings, most in ((0.2, 2), (1.0, 3), (8.0, 6)):
        _, widths = encode(v, _round(v, bits), np.full(v.size, spacings * 2.0**-10), bits)
        assert widths.max() <= most, spacings


def test_an_auditor_applies_honest_codes_whose_band_passes_the_float32_range() -> None:
    """Float32 work by the largest grid values: v' + w' overflows float32, and the legitimacy check rounds
    the range's end instead of reading inf / inf = NaN (which rejected the honest entry)."""
    v = torch.tensor([3.0e38, -3.0e38, 1.0], dtype=torch.float32)
    r = round_unchecked(v, 19)
    e = torch.tensor([5e37, 5e37, 1e-3], dtype=torch.float32)
    res, widths = encode(v.numpy(), r.numpy(), (e * (2 * BAND_SLACK)).numpy(), 19)
    entry = SiteLog(0, "aten.mm.default", (3,), val_pos=np.arange(3), val_res=res, val_bits=widths)
    rx = RoundedExecution(bits=19, device=get_device("cpu"), mode="replay", replay_log=StepLog([entry], bits=19))
    out = rx._apply_entries(entry, "aten.mm.default", v.clone(), r.clone(), lambda pos: e[pos])
    assert torch.equal(out, r)
