"""The trainer's matmul pre-filter (vtrain.prefilter): U bounds E everywhere, E gathered at positions is a
rigorous bound, and the engine logs and resolves exactly what the definition says whichever path it takes: with
E's band, or with U's (rounding.UPPER_BAND), whose log holds E's entries and otherwise only the trainer's own
roundings, which an auditor with its own E accepts."""

from __future__ import annotations

import dataclasses
import math
import weakref
import zlib
from fractions import Fraction

import numpy as np
import pytest
import torch

from numkit import without_grains
from test_num_resolve import CASES, Case
from vtrain import bounds, prefilter, resolve, rounding, valuecode
from vtrain.bounds import BOUNDS, gamma, unit_roundoff
from vtrain.bounds import BOUNDS_AT as TORCH_BOUNDS_AT
from vtrain.devices import get_device
from vtrain.grid import round_to_grid, round_unchecked
from vtrain.roundlog import StepLog
from vtrain.rounding import BAND_SLACK, IllegitimateLogEntryError, RoundedExecution

aten = torch.ops.aten
GRIDS = [(torch.float64, 32), (torch.float32, 19)]


def _operand(shape: tuple[int, ...], gen: torch.Generator, dtype: torch.dtype, bits: int, kind: str) -> torch.Tensor:
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    if kind == "relu":  # half the values zero, whole rows too
        x = x.clamp_min(0)
        if x.dim() > 1:
            x[..., :3, :] = 0
    elif kind == "neg-relu":  # as relu, non-positive: the nonzero filter must not read a sign
        x = -x.clamp_min(0)
        if x.dim() > 1:
            x[..., :3, :] = 0
    elif kind == "dropped":  # dense but for whole rows of zeros (dropout's fully dropped causal rows)
        if x.dim() > 1:
            x[..., :3, :] = 0
    elif kind == "flat":  # one magnitude: the products of block norms equal the block sums, so U is as
        x = torch.where(x < 0, -1.0, 1.0) * 0.375  # tight as E and any term a kernel dropped would show
    elif kind == "tiny":  # float32 products underflow
        x = x * 2.0**-70
    elif kind == "huge":
        x = x * 2.0**60
    elif kind == "quant":  # k/16: exact ties
        x = torch.round(x * 16) / 16
    return round_to_grid(x, bits).to(dtype)


def _cases(gen: torch.Generator, dtype: torch.dtype, bits: int, kind: str) -> list:
    def op(shape: tuple[int, ...]) -> torch.Tensor:
        return _operand(shape, gen, dtype, bits, kind)

    # the layouts the pre-filter takes: a linear layer's forward x @ W^T, weight gradient g^T @ x and input
    # gradient g @ W
    a, b, bias = op((24, 200)), op((20, 200)).T, op((20,))
    return [
        ("mm", aten.mm.default, (a, b), {}),
        ("mm-weight-grad", aten.mm.default, (op((200, 24)).T, op((200, 20))), {}),
        ("mm-input-grad", aten.mm.default, (a, op((200, 20))), {}),
        ("mm-k-odd", aten.mm.default, (op((24, 151)), op((20, 151)).T), {}),
        ("mm-k-3", aten.mm.default, (op((24, 3)), op((20, 3)).T), {}),
        # views of wider tensors: neither orientation contiguous, the kernels read contiguous copies
        ("mm-sliced", aten.mm.default, (op((24, 300))[:, :200], op((20, 300))[:, 50:250].T), {}),
        ("addmm", aten.addmm.default, (bias, a, b), {}),
        ("addmm-scaled", aten.addmm.default, (bias, a, b), {"beta": -0.5, "alpha": 3.0}),
        ("addmm-bias-only", aten.addmm.default, (bias, a, b), {"beta": 2.0, "alpha": 0.0}),
        # 2-d biases, broadcast over rows, columns or neither
        ("addmm-bias-2d", aten.addmm.default, (op((24, 20)), a, b), {"beta": -0.5}),
        ("addmm-bias-row", aten.addmm.default, (op((1, 20)), a, b), {}),
        ("addmm-bias-column", aten.addmm.default, (op((24, 1)), a, b), {}),
        ("bmm", aten.bmm.default, (op((3, 24, 270)), op((3, 20, 270)).transpose(1, 2)), {}),
    ]


def prefilter_of(func: object, args: tuple, kwargs: dict, outs: list, i: int = 0) -> prefilter.Prefilter | None:
    """The pre-filter of output i (UPPERS gives every output's, or None for all)."""
    pres = prefilter.UPPERS[func](args, kwargs, outs)
    return None if pres is None else pres[i]


def products(monkeypatch: pytest.MonkeyPatch, least: int) -> None:
    """Ops of at least `least` products (outputs times K) take the pre-filter, in either work dtype."""
    monkeypatch.setattr(prefilter, "MIN_PRODUCTS", {torch.float64: least, torch.float32: least})


@pytest.fixture
def everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """Small test operands take the pre-filter (and float64 work's float32 full bound)."""
    products(monkeypatch, 0)
    monkeypatch.setattr("vtrain.bounds._F32_MIN_WORK", 0)


@pytest.mark.parametrize("kind", ["normal", "relu", "neg-relu", "dropped", "flat", "tiny", "huge", "quant"])
@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
def test_upper_bounds_the_full_and_the_gathered_bound(everywhere: None, dtype: torch.dtype, bits: int,
                                                      kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{kind}/{bits}".encode()))
    filtered, unfiltered = [], []  # (the cases taking the filter; the sums without a term of those that do not)
    for name, func, args, kwargs in _cases(gen, dtype, bits, kind):
        v = func(*args, **kwargs)
        pre = prefilter_of(func, args, kwargs, [v])
        pos = torch.arange(v.numel())
        gathered = prefilter.BOUNDS_AT[func](args, kwargs, [v], 0, pos)
        (full,) = BOUNDS[func](args, kwargs, [v])  # float64 work: its float32 path (see the fixture)
        monkeypatch.setattr("vtrain.bounds._F32_MIN_WORK", 1 << 40)
        (full64,) = BOUNDS[func](args, kwargs, [v])
        monkeypatch.setattr("vtrain.bounds._F32_MIN_WORK", 0)
        if pre is None:  # only near float32 overflow (sums of 2^120 products), where the full bound may be
            assert kind == "huge" and dtype == torch.float32, name  # infinite, which no finite U covers
            continue
        upper = pre.upper()
        assert upper.dtype == v.dtype and upper.shape == v.shape, name
        u = upper.reshape(-1)
        for e in (gathered, full.reshape(-1), full64.reshape(-1)):
            assert (u >= e).all(), (name, kind, float((e - u).max()))
        if kind == "normal":  # and not uselessly loose (Cauchy-Schwarz on Gaussian lines: ~1.6x typically)
            assert torch.median(u / gathered) <= 2.5, name
        # the nonzero-term filter, against its definition: sums with an addend have none, nor g @ W; products
        # whose lines hold K nonzeros or fewer between some row of a and column of b (the most zeros in a row
        # plus the most in a column, lines of zeros only left out, reach K) have it. Without it every sum has a
        # nonzero term but those of lines of zeros only: exact zeros whose U (the floor) no band (at most 4 U)
        # can carry to a boundary (2^-150 the nearest), so that the filter has nothing to drop
        a3, b3 = (args[-2], args[-1]) if func is aten.bmm.default else (args[-2][None], args[-1][None])
        has_term = ((a3 != 0).double() @ (b3 != 0).double() > 0).reshape(-1)
        k = a3.shape[2]
        row_zeros, col_zeros = (a3 == 0).sum(2), (b3 == 0).sum(1)
        crowded = sum(int(z[z < k].max()) if bool((z < k).any()) else 0 for z in (row_zeros, col_zeros)) >= k
        if func is aten.addmm.default or name == "mm-input-grad":
            assert pre.nonzero is None, name
        elif crowded:
            assert pre.nonzero is not None, name
        if pre.nonzero is not None:
            filtered.append(name)
            shuffled = torch.randperm(v.numel(), generator=gen)
            assert torch.equal(pre.nonzero(shuffled), has_term[shuffled]), name
        elif func is not aten.addmm.default and name != "mm-input-grad":
            lacking = ~has_term
            empty = ((row_zeros == k)[:, :, None] | (col_zeros == k)[:, None, :]).reshape(-1)
            assert bool((empty | has_term).all()), name  # (the pigeonhole, lines of zeros aside)
            assert bool((v.reshape(-1)[lacking] == 0).all() and (4 * u[lacking].double() < 2.0**-150).all()), name
            unfiltered.append(int(lacking.sum()))
    if kind in ("relu", "neg-relu"):
        assert filtered, kind  # (relu's zeros can cover lines: the filter stays in use, and tested)
    if kind == "dropped":  # whole rows of zeros alone: float64 work leaves them to U, float32 work's floor cannot
        assert (not filtered and sum(unfiltered) > 0) if dtype == torch.float64 else filtered, kind


@pytest.mark.parametrize("side", ["a-row", "b-column"])
@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
def test_lines_of_zeros_only_need_the_nonzero_filter_where_the_floor_reaches_a_boundary(
        everywhere: None, dtype: torch.dtype, bits: int, side: str) -> None:
    # a dense batched product but for one line of zeros only (a row of a in a forward's layout, read along
    # memory; or a column of b in a weight gradient's, read across it): its sums are exact zeros, U there is
    # the floor, and float32 work's floor reaches the nearest boundary (2^-150), float64 work's does not:
    # only float32 work takes the filter
    gen = torch.Generator().manual_seed(zlib.crc32(f"{side}/{bits}".encode()))
    if side == "a-row":
        a, b = _operand((2, 24, 150), gen, dtype, bits, "normal"), _operand((2, 20, 150), gen, dtype, bits, "normal")
        b = b.transpose(1, 2)
        a[1, 5] = 0
    else:
        a, b = _operand((2, 150, 24), gen, dtype, bits, "normal"), _operand((2, 150, 20), gen, dtype, bits, "normal")
        a = a.transpose(1, 2)
        b[0, :, 7] = 0
    v = torch.bmm(a, b)
    pre = prefilter_of(aten.bmm.default, (a, b), {}, [v])
    lacking = ((a != 0).double() @ (b != 0).double() == 0).reshape(-1)
    assert int(lacking.sum()) == (20 if side == "a-row" else 24)
    u = pre.upper().reshape(-1).double()  # (2^-150 is no float32: compared in float64)
    if dtype == torch.float64:
        assert pre.nonzero is None and bool((4 * u[lacking] < 2.0**-150).all())
    else:
        assert pre.nonzero is not None and bool((4 * u[lacking] >= 2.0**-150).all())
        assert torch.equal(pre.nonzero(torch.arange(v.numel())), ~lacking)


def test_upper_leaves_small_and_non_finite_ops_to_the_full_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(64, 256, generator=gen, dtype=torch.float64)
    b = torch.randn(64, 256, generator=gen, dtype=torch.float64).T
    mm = aten.mm.default
    # 16 * 16 * 256: the full bound is cheap
    assert prefilter_of(mm, (a[:16], b[:, :16]), {}, [a[:16] @ b[:, :16]]) is None
    assert prefilter_of(mm, (a, b), {}, [a @ b]) is not None  # 64 * 64 * 256 products in float64 work
    a32, b32 = a.float(), b.float()
    assert prefilter_of(mm, (a32, b32), {}, [a32 @ b32]) is None  # float32 work's wide bands: too many candidates
    products(monkeypatch, 0)
    # x @ W^T, g^T @ x and g @ W take it, not a left operand strided along K with an addend
    assert prefilter_of(mm, (a, b.contiguous()), {}, [a @ b]) is not None
    wa, wb = a.T.contiguous().T, b.contiguous()
    assert prefilter_of(mm, (wa, wb), {}, [wa @ wb]) is not None
    bias = torch.zeros(64, dtype=torch.float64)
    assert prefilter_of(aten.addmm.default, (bias, wa, wb), {}, [wa @ wb]) is None
    assert prefilter_of(aten.addmm.default, (bias, a, b.contiguous()), {}, [a @ b]) is None
    for bad in (float("inf"), float("nan"), 2.0**500, 2.0**-600):  # (a square of 2^-600 underflows)
        b2 = b.clone(memory_format=torch.preserve_format)
        b2[5, 7] = bad
        assert prefilter_of(mm, (a, b2), {}, [a @ b2]) is None, bad


@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
def test_gathered_bound_is_rigorous_and_agrees_with_torch_gathering(dtype: torch.dtype, bits: int) -> None:
    gen = torch.Generator().manual_seed(17)
    for name, func, args, kwargs in _cases(gen, dtype, bits, "normal") + _cases(gen, dtype, bits, "tiny"):
        v = func(*args, **kwargs)
        # every position, some twice, in a shuffled order
        pos = torch.cat([torch.randperm(v.numel(), generator=gen), torch.randint(v.numel(), (50,), generator=gen)])
        got = prefilter.BOUNDS_AT[func](args, kwargs, [v], 0, pos)
        ref = TORCH_BOUNDS_AT[func](args, kwargs, [v], 0, pos)
        assert got.dtype == v.dtype and got.shape == pos.shape
        k = args[-1].shape[-2] + (3 if func is aten.addmm.default else 0)
        # the same sums in another order (and float32 work's in float64): apart by rounding, or by products
        # that underflow float32 (the torch gathering's) below k smallest subnormals
        tiny = 2.0**-149 if dtype == torch.float32 else 2.0**-1074
        assert ((got.double() - ref.double()).abs() <= 4 * k * unit_roundoff(dtype) * ref.double()
                + 4 * (k + 1) * tiny).all(), name
        # at least gamma_k times the exact sum of |terms| (Fractions) at a sample of positions
        _, beta, alpha, a, b = _operands(func, args, kwargs)
        m, n = a.shape[1], b.shape[2]
        g = Fraction(gamma(k, unit_roundoff(dtype)))
        for p in pos[:40].tolist():
            t, i, j = p // (m * n), (p % (m * n)) // n, p % n
            terms = zip(a[t, i].tolist(), b[t, :, j].tolist())
            s = sum((abs(Fraction(x) * Fraction(y)) for x, y in terms), Fraction(0)) * abs(Fraction(alpha))
            if func is aten.addmm.default:
                s += abs(Fraction(beta)) * abs(Fraction(float(args[0].expand(m, n)[i, j])))
            assert Fraction(float(got[pos.tolist().index(p)])) >= g * s, (name, p)


def _operands(func: object, args: tuple, kwargs: dict) -> tuple:
    from vtrain.bounds import _mm_operands

    bias, beta, alpha, a, b, _ = _mm_operands(func, args, kwargs)
    return bias, beta, alpha, a, b


def _record(func: object, args: tuple, bits: int, resolution: str = "log") -> tuple[torch.Tensor, RoundedExecution]:
    with RoundedExecution(bits=bits, device=get_device("cpu"), mode="record", resolution=resolution) as rx:
        out = func(*args)
    return out, rx


def _layer(dtype: torch.dtype, bits: int, kind: str = "quant") -> tuple[tuple, torch.Tensor]:
    # quantised operands: some outputs land exactly on a rounding boundary of a coarse grid (log entries)
    gen = torch.Generator().manual_seed(23)
    x = _operand((160, 192), gen, dtype, bits, kind).clamp_min(0)
    w = _operand((160, 192), gen, dtype, bits, kind) / 8
    bias = _operand((160,), gen, dtype, bits, kind)
    return (bias, x, w.T), x  # w.T: contiguous along K, as the pre-filter wants


LOG_GRIDS = [(torch.float64, 14), (torch.float32, 14)]


LAYOUTS = ["forward", "weight-grad", "input-grad"]


def _layout(layout: str, dtype: torch.dtype, bits: int, kind: str = "quant") -> tuple:
    """(aten op, torch function, operands) of a linear layer's product in one of the pre-filter's layouts."""
    args, x = _layer(dtype, bits, kind)
    if layout == "weight-grad":  # g^T @ x with relu-sparse x: sums with no nonzero term
        grad = _operand((160, 160), torch.Generator().manual_seed(31), dtype, bits, "relu")
        return aten.mm.default, torch.mm, (grad.T, x)
    if layout == "input-grad":  # g @ W, W row-major: its columns strided along K
        grad = _operand((160, 160), torch.Generator().manual_seed(37), dtype, bits, "relu")
        return aten.mm.default, torch.mm, (grad, args[2].T.contiguous())
    return aten.addmm.default, torch.addmm, args


def _ties_logged(monkeypatch: pytest.MonkeyPatch) -> None:
    """The quantised sums are exact, so their ties would be certified and not logged (test_num_rounding), and
    whole ops would need no band at all (vtrain.grains): with both off they are the entries whose selection
    is compared."""
    monkeypatch.setattr(resolve, "CERTIFIERS", {})
    without_grains(monkeypatch)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype,bits", LOG_GRIDS, ids=["f64-b14", "f32-b14"])
def test_engine_logs_what_its_band_defines_on_both_paths(everywhere: None, dtype: torch.dtype, bits: int, layout: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # E's band on every path (the trainer's U band is the test after this one's)
    monkeypatch.setattr(rounding, "UPPER_BAND", False)
    func, fn, args = _layout(layout, dtype, bits)
    assert prefilter_of(func, args, {}, [func(*args)]) is not None  # the case takes the pre-filter
    _ties_logged(monkeypatch)
    products(monkeypatch, 1 << 60)
    plain_out, plain = _record(fn, args, bits)  # no pre-filter: E everywhere
    products(monkeypatch, 0)
    monkeypatch.setattr(prefilter, "GATHER_COST", 1 << 60)
    fallback_out, fallback = _record(fn, args, bits)  # U's candidates, E from the full bound
    monkeypatch.setattr(prefilter, "GATHER_COST", 1)
    gathered_out, gathered = _record(fn, args, bits)  # U's candidates, E gathered at them
    assert torch.equal(plain_out, fallback_out) and torch.equal(plain_out, gathered_out)
    (site,) = plain.log.sites
    assert site.num_entries > 0  # the case has entries to lose
    # the fallback decides with the same E on a superset of the candidates: the same log, byte for byte
    assert fallback.log.to_bytes() == plain.log.to_bytes()
    # the gathered path: what the engine's own test logs with the gathered E at every position
    v = func(*args)
    everything = torch.arange(v.numel())
    e = prefilter.BOUNDS_AT[func](args, {}, [v], 0, everything)
    want = gathered._find_entries(0, site.op, tuple(v.shape), v.reshape(-1).numpy(), gathered_out, everything.numpy(),
                                  e.numpy(), 2 * BAND_SLACK)
    (got,) = gathered.log.sites
    for field in ("dir_pos", "dir_up", "val_pos", "val_res", "val_bits"):
        assert np.array_equal(getattr(got, field), getattr(want, field)), field
    # and an auditor on another device accepts the log and lands on the trainer's values
    for log in (fallback.log, gathered.log):
        with RoundedExecution(bits=bits, device=get_device("emu:splitk8-tree"), mode="replay", replay_log=log) as rx:
            replayed = fn(*args)
        assert torch.equal(replayed, plain_out)
        assert rx.stats["logged"] == log.sites[0].num_entries


def _upper_log_holds(e_log: StepLog, u_log: StepLog, rx: RoundedExecution, unrounded: list, rounded: list,
                     pres: list, bits: int) -> int:
    """Checks the log of U's band (`u_log`) against E's (`e_log`) for the same outputs (their unrounded and rounded
    values and pre-filters, site by site): every position E's log names, U's names too; each entry of U's lies
    within 2U of a boundary, a direction entry on the trainer's own side of it where that band is narrow (under
    VALUE_FRACTION of a spacing, as the engine's classification says), else a value entry whose residue names
    the trainer's own value. Returns how many positions U's log names beyond E's."""
    assert len(u_log.sites) == len(e_log.sites) == len(unrounded)
    extra = 0
    for e_site, u_site, v, r, pre in zip(e_log.sites, u_log.sites, unrounded, rounded, pres):
        assert u_site.tag == e_site.tag
        e_pos = np.concatenate([e_site.dir_pos, e_site.val_pos])
        u_pos = np.concatenate([u_site.dir_pos, u_site.val_pos])
        assert np.isin(e_pos, u_pos).all()
        extra += u_pos.size - e_pos.size
        vv, rr = v.reshape(-1).numpy()[u_pos], r.reshape(-1).numpy()[u_pos]
        own_side, within, wide = rx._classify(vv, rr, pre.upper().reshape(-1).numpy()[u_pos] * (2 * BAND_SLACK))
        nd = u_site.dir_pos.size
        assert within.all()
        assert not wide[:nd].any() and wide[nd:].all()
        assert np.array_equal(u_site.dir_up, own_side[:nd])
        assert valuecode.names_own(rr[nd:], u_site.val_res, u_site.val_bits, bits).all()
    return extra


def _shifted_auditors_accept(log: StepLog, bits: int, unrounded: list, rounded: list, e: list) -> int:
    """Replays each site of the trainer's log (its unrounded and rounded values and E, site by site) as auditors
    whose own values lie 1.999 E from the trainer's, all above, all below and anywhere between, each with E and
    1.2 E as its own bound (two honest devices' bounds of one sum): every entry is accepted, the logged positions
    come out as the trainer's values, and no position the log leaves alone rounds otherwise. Returns how many
    entries changed the auditors' own roundings."""
    rng = np.random.default_rng(7)
    corrections = 0
    for site, v, r, e_site in zip(log.sites, unrounded, rounded, e):
        v, r, e_site = v.reshape(-1), r.reshape(-1), e_site.reshape(-1).double()
        pos = torch.from_numpy(np.concatenate([site.dir_pos, site.val_pos]))
        alone = torch.ones(v.numel(), dtype=torch.bool)
        alone[pos] = False
        for shift in (np.ones(v.numel()), -np.ones(v.numel()), rng.uniform(-1, 1, v.numel())):
            vp = (v.double() + torch.from_numpy(shift) * 1.999 * e_site).to(v.dtype)
            rp = round_unchecked(vp, bits)
            assert torch.equal(rp[alone], r[alone])
            for scale in (1.0, 1.2):
                auditor = RoundedExecution(bits=bits, device=get_device("cpu"), mode="replay", replay_log=log,
                                           measure_storage=False)
                out = auditor._apply_entries(site, site.op, vp, rp.clone(),
                                             lambda at, scale=scale: (e_site[at] * scale).to(v.dtype))
                assert torch.equal(out[pos], r[pos])
                corrections += auditor.stats["corrections"]
    return corrections


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype,bits", LOG_GRIDS, ids=["f64-b14", "f32-b14"])
def test_upper_band_logs_e_s_entries_and_own_roundings_besides(everywhere: None, dtype: torch.dtype, bits: int,
                                                               layout: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Operands off the coarse grid's ties: float32 work's sums of 192 products then fall within 2U of a boundary
    # and not 2E, ~1 % of them (float64 work's bands are ~2^-29 of a spacing: its ties are its entries)
    func, fn, args = _layout(layout, dtype, bits, "normal" if dtype == torch.float32 else "quant")
    _ties_logged(monkeypatch)
    monkeypatch.setattr(rounding, "UPPER_BAND", False)
    e_out, e_rx = _record(fn, args, bits)
    monkeypatch.setattr(rounding, "UPPER_BAND", True)
    gathers = {name: getattr(RoundedExecution, name) for name in ("_settle", "_bound_at")}
    for name in gathers:  # (E is not asked for anywhere)
        monkeypatch.setattr(RoundedExecution, name, None)
    u_out, u_rx = _record(fn, args, bits)
    assert torch.equal(u_out, e_out)
    for name, gather in gathers.items():  # (the auditors below gather E at their entries)
        monkeypatch.setattr(RoundedExecution, name, gather)
    v = func(*args)
    extra = _upper_log_holds(e_rx.log, u_rx.log, u_rx, [v], [u_out], [prefilter_of(func, args, {}, [v])], bits)
    assert (extra > 0) == (dtype == torch.float32)  # where U's band takes in more than E's
    # auditors as far from the trainer as honest devices can be accept the log and land on its values, correcting
    corrected = _shifted_auditors_accept(u_rx.log, bits, [v], [u_out],
                                         [prefilter.BOUNDS_AT[func](args, {}, [v], 0, torch.arange(v.numel()))])
    assert corrected > 0
    # and so do the devices' own: another, and the trainer's, where no entry changes anything
    for device in ("emu:splitk8-tree", "cpu"):
        with RoundedExecution(bits=bits, device=get_device(device), mode="replay", replay_log=u_rx.log) as rx:
            replayed = fn(*args)
        assert torch.equal(replayed, e_out), device
        assert rx.stats["logged"] == u_rx.log.sites[0].num_entries
    assert rx.stats["corrections"] == 0
    # and an entry of U's band turned to the other side of its boundary is no more legitimate than one of E's
    (u_site,) = u_rx.log.sites
    (e_site,) = e_rx.log.sites
    beyond = np.flatnonzero(~np.isin(u_site.dir_pos, e_site.dir_pos))
    assert beyond.size or dtype == torch.float64
    if beyond.size:
        k = int(beyond[0])
        flipped = u_site.dir_up.copy()
        flipped[k] = not flipped[k]
        log = StepLog([dataclasses.replace(u_site, dir_up=flipped)], u_rx.log.policy, u_rx.log.bits)
        with pytest.raises(IllegitimateLogEntryError, match=f"element {u_site.dir_pos[k]}"):
            with RoundedExecution(bits=bits, device=get_device("cpu"), mode="replay", replay_log=log):
                fn(*args)


@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
def test_exact_resolution_is_the_same_with_and_without_the_prefilter(everywhere: None, dtype: torch.dtype, bits: int,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    args, x = _layer(dtype, bits)
    grad = _operand((160, 160), torch.Generator().manual_seed(29), dtype, bits, "relu")
    without_grains(monkeypatch)  # (the quantised layer's ops are exact: with it, no op would have a band)
    outs = {}
    for name, least, cost in (("full", 1 << 60, 1), ("fallback", 0, 1 << 60), ("gathered", 0, 1)):
        products(monkeypatch, least)
        monkeypatch.setattr(prefilter, "GATHER_COST", cost)
        fwd, rx = _record(torch.addmm, args, bits, "exact")
        wgrad, rx2 = _record(torch.mm, (grad.T, x), bits, "exact")
        outs[name] = (fwd, wgrad)
        assert rx.stats["ambiguous"] + rx2.stats["ambiguous"] > 0
    for name in ("fallback", "gathered"):
        for want, got in zip(outs["full"], outs[name]):
            assert torch.equal(want, got), name


def test_a_zero_alpha_or_beta_drops_its_term_from_the_bound(everywhere: None) -> None:
    # torch's addmm skips the products when alpha is 0 and the bias when beta is 0, whatever they hold: an
    # inf operand or a NaN bias leaves the output finite. E must skip them too: a NaN E would hide every
    # candidate from the filter and reject every log entry there.
    gen = torch.Generator().manual_seed(3)
    a, b, bias = (_operand(s, gen, torch.float64, 32, "normal") for s in ((24, 200), (200, 20), (20,)))
    a_inf, bias_nan = a.clone(), torch.full_like(bias, math.nan)
    a_inf[0, 0] = math.inf
    for args, kwargs in (((bias, a_inf, b), {"alpha": 0.0}), ((bias_nan, a, b), {"beta": 0.0})):
        v = aten.addmm.default(*args, **kwargs)
        assert torch.isfinite(v).all()
        (full,) = BOUNDS[aten.addmm.default](args, kwargs, [v])
        pos = torch.arange(v.numel())
        for at in (prefilter.BOUNDS_AT, TORCH_BOUNDS_AT):
            got = at[aten.addmm.default](args, kwargs, [v], 0, pos)
            assert torch.isfinite(got).all() and (got - full.reshape(-1)).abs().max() <= 2.0**-40 * full.max()


# -- convolutions -------------------------------------------------------------------------------------

CONV_CASES = [c for c in CASES if c.op in (aten.convolution.default, aten.convolution_backward.default)]


def _conv_k(op: object, args: tuple, i: int) -> int:
    return bounds._conv_k(args) + 1 if op is aten.convolution.default else bounds._convolution_backward_ks(args)[i]


@pytest.mark.parametrize("kind", ["normal", "quant", "tiny", "huge"])
@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
@pytest.mark.parametrize("case", CONV_CASES, ids=[c.name for c in CONV_CASES])
def test_convolution_gathered_bound(case: Case, dtype: torch.dtype, bits: int, kind: str) -> None:
    """E gathered at positions (compiled, and through vtrain.resolve's terms in torch) bounds gamma_k times the
    exact sum of |terms|, the two agree, and neither exceeds the full bound."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/{bits}/{kind}/conv-at".encode()))
    args, kwargs = case.make(gen, dtype, bits, "normal" if kind in ("tiny", "huge") else kind)
    scale = {"tiny": 2.0**-70, "huge": 2.0**60}.get(kind, 1.0)
    args = tuple(a * scale if isinstance(a, torch.Tensor) and a.is_floating_point() and j == 0 else a
                 for j, a in enumerate(args))
    outs = case.op(*args, **kwargs)
    floats = [o if isinstance(o, torch.Tensor) and o.is_floating_point() else None
              for o in (outs if isinstance(outs, tuple) else (outs,))]
    full = BOUNDS[case.op](args, kwargs, floats)
    exact = case.ref(tuple(a.abs() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args),
                     kwargs)
    for i, v in enumerate(floats):
        if v is None:
            continue
        pos = torch.arange(v.numel())
        got = prefilter.BOUNDS_AT[case.op](args, kwargs, floats, i, pos)
        ref = TORCH_BOUNDS_AT[case.op](args, kwargs, floats, i, pos)
        assert got.dtype == v.dtype and got.shape == (v.numel(),)
        g = Fraction(gamma(_conv_k(case.op, args, i), unit_roundoff(v.dtype)))
        for e in (got, ref):
            assert all(Fraction(float(x)) >= g * s for x, s in zip(e.tolist(), exact[i])), (case.name, i)
        assert torch.allclose(got, ref, rtol=2.0**-30, atol=0), (case.name, i)
        # and as tight as the full bound's E, give or take that one's float32 sums (its inflation)
        assert (got <= full[i].expand(v.shape).reshape(-1) * (1 + 2.0**-16)).all(), (case.name, i)


def test_convolution_gathered_bound_on_odd_geometries(everywhere: None) -> None:
    """The compiled gathering finds each position's taps and outputs from ranges (`prefilter._inside`): on
    geometries where some taps read only padding, strides skip pixels, dilations spread the window and
    groups split the channels, it sums the same terms as the torch gathering, to rounding (a term too many
    or too few would show far above 2^-30). And the pre-filter's U lies above it everywhere, its weight
    gradient's row sums (one product over all taps, from zero-padded rows) as written out below."""
    gen = torch.Generator().manual_seed(11)
    rng = np.random.default_rng(11)
    # first a 2 x 2 image padded by 3 whose last taps (dilated to 6) read only padding: no output column
    # of theirs lies inside the image
    geometries = [(1, 4, 4, [1, 1], [3, 3], [2, 2], 2, 2)]
    while len(geometries) < 60:
        groups, kh, kw = int(rng.integers(1, 3)), int(rng.integers(1, 5)), int(rng.integers(1, 5))
        stride, padding = [int(s) for s in rng.integers(1, 4, 2)], [int(p) for p in rng.integers(0, 5, 2)]
        dilation, h, w = [int(d) for d in rng.integers(1, 3, 2)], int(rng.integers(1, 9)), int(rng.integers(1, 9))
        if all((n + 2 * p - d * (k - 1) - 1) // s >= 0 for n, p, d, k, s in
               zip((h, w), padding, dilation, (kh, kw), stride)):  # at least one output
            geometries.append((groups, kh, kw, stride, padding, dilation, h, w))
    for groups, kh, kw, stride, padding, dilation, h, w in geometries:
        x = torch.randn(2, 2 * groups, h, w, generator=gen, dtype=torch.float64)
        wt = torch.randn(3 * groups, 2, kh, kw, generator=gen, dtype=torch.float64)
        bias = torch.randn(3 * groups, generator=gen, dtype=torch.float64)
        geometry = (stride, padding, dilation, False, [0, 0], groups)
        forward = (x, wt, bias, *geometry)
        v = aten.convolution.default(*forward)
        g = torch.randn(v.shape, generator=gen, dtype=torch.float64)
        backward = (g, x, wt, [bias.numel()], *geometry, [True, True, False])
        grads = list(aten.convolution_backward.default(*backward))
        for func, args, outs in ((aten.convolution.default, forward, [v]),
                                 (aten.convolution_backward.default, backward, grads)):
            for i, out in enumerate(outs):
                if out is None:
                    continue
                positions = torch.arange(out.numel())
                got = prefilter.BOUNDS_AT[func](args, {}, outs, i, positions)
                want = TORCH_BOUNDS_AT[func](args, {}, outs, i, positions)
                assert torch.allclose(got, want, rtol=2.0**-30, atol=0), (func, i, stride, padding, dilation, kh, kw)
                assert (prefilter.UPPERS[func](args, {}, outs)[i].upper().reshape(-1) >= got).all()
        g_rows, x_rows = g.square().sum(3).sqrt().numpy(), x.square().sum(3).sqrt().numpy()
        sums = np.zeros((3 * groups, 2, kh))
        for co, cl, a, n, oy in np.ndindex(3 * groups, 2, kh, 2, g.shape[2]):
            y = oy * stride[0] - padding[0] + a * dilation[0]
            if 0 <= y < h:
                sums[co, cl, a] += g_rows[n, co, oy] * x_rows[n, co // 3 * 2 + cl, y]
        got = prefilter._weight_sums(g_rows, x_rows, stride, padding, dilation, groups, kh, kw)
        assert np.allclose(got, np.repeat(sums[..., None], kw, axis=3).reshape(3 * groups, -1), rtol=2.0**-40, atol=0)


@pytest.mark.parametrize("transposed", [True, False], ids=["transposed", "3d"])
def test_convolutions_without_gathering_take_the_full_bound_at_positions(transposed: bool) -> None:
    # the exact resolution gathers no terms for these (vtrain.resolve refuses them): E is the full bound's
    gen = torch.Generator().manual_seed(7)
    if transposed:
        x, w = torch.randn(2, 3, 5, 5, generator=gen, dtype=torch.float64), torch.randn(3, 4, 3, 3, generator=gen,
                                                                                         dtype=torch.float64)
        args = (x, w, None, [2, 2], [1, 1], [1, 1], True, [1, 1], 1)
    else:
        x, w = torch.randn(2, 3, 4, 4, 4, generator=gen, dtype=torch.float64), torch.randn(4, 3, 3, 3, 3, generator=gen,
                                                                                            dtype=torch.float64)
        args = (x, w, None, [1, 1, 1], [1, 1, 1], [1, 1, 1], False, [0, 0, 0], 1)
    v = aten.convolution.default(*args)
    (full,) = BOUNDS[aten.convolution.default](args, {}, [v])
    pos = torch.randperm(v.numel(), generator=gen)[:20]
    for at in (prefilter.BOUNDS_AT, TORCH_BOUNDS_AT):
        assert torch.equal(at[aten.convolution.default](args, {}, [v], 0, pos), full.reshape(-1)[pos])


def _conv_operands(case: Case, gen: torch.Generator, dtype: torch.dtype, bits: int, kind: str) -> tuple:
    """(args, kwargs, outputs) of a convolution case: "relu" zeroes the input's negative values (and a whole
    channel), "tiny" and "huge" scale its first operand (the input, or the output gradient) far down or up."""
    args, kwargs = case.make(gen, dtype, bits, kind if kind == "quant" else "normal")
    args = list(args)
    scale = {"tiny": 2.0**-70, "huge": 2.0**60}.get(kind, 1.0)
    args[0] = args[0] * scale
    if kind == "relu":
        j = 0 if case.op is aten.convolution.default else 1
        args[j] = args[j].clamp_min(0)
        args[j][:, 0] = 0
    args = tuple(args)
    outs = case.op(*args, **kwargs)
    floats = [o if isinstance(o, torch.Tensor) and o.is_floating_point() else None
              for o in (outs if isinstance(outs, tuple) else (outs,))]
    return args, kwargs, floats


@pytest.mark.parametrize("kind", ["normal", "relu", "quant", "tiny", "huge"])
@pytest.mark.parametrize("dtype,bits", GRIDS, ids=["f64-b32", "f32-b19"])
@pytest.mark.parametrize("case", CONV_CASES, ids=[c.name for c in CONV_CASES])
def test_convolution_upper_bounds_the_full_and_the_gathered_bound(everywhere: None, case: Case, dtype: torch.dtype,
                                                                  bits: int, kind: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/{bits}/{kind}/conv-upper".encode()))
    args, kwargs, floats = _conv_operands(case, gen, dtype, bits, kind)
    pres = prefilter.UPPERS[case.op](args, kwargs, floats)
    assert pres is not None and len(pres) == len(floats)
    full = BOUNDS[case.op](args, kwargs, floats)  # float64 work: its float32 path (see the fixture)
    monkeypatch.setattr("vtrain.bounds._F32_MIN_WORK", 1 << 40)
    full64 = BOUNDS[case.op](args, kwargs, floats)
    for i, v in enumerate(floats):
        if v is None:
            assert pres[i] is None
            continue
        u = pres[i].upper()
        assert u.dtype == v.dtype and u.shape == v.shape, (case.name, i)
        u = u.reshape(-1)
        gathered = prefilter.BOUNDS_AT[case.op](args, kwargs, floats, i, torch.arange(v.numel()))
        for e in (gathered, full[i].expand(v.shape).reshape(-1), full64[i].expand(v.shape).reshape(-1)):
            assert (u >= e).all(), (case.name, i, kind, float((e - u).max()))
        if kind == "normal":  # and not uselessly loose where E has terms (not its floor alone)
            real = gathered > 2.0**-100
            assert torch.median(u[real] / gathered[real]) <= 16, (case.name, i)


def test_convolution_upper_leaves_small_transposed_and_non_finite_ops_to_the_full_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(8, 8, 32, 32, generator=gen, dtype=torch.float64)
    w = torch.randn(8, 8, 3, 3, generator=gen, dtype=torch.float64)
    conv = aten.convolution.default

    def args(x: torch.Tensor, w: torch.Tensor, transposed: bool = False) -> tuple:
        return (x, w, None, [1, 1], [1, 1], [1, 1], transposed, [0, 0], 1)

    assert prefilter_of(conv, args(x, w), {}, [conv(*args(x, w))]) is not None  # 8 * 8 * 32 * 32 * 73 products
    small = args(x[:1, :, :4, :4], w)
    assert prefilter_of(conv, small, {}, [conv(*small)]) is None  # 128 outputs: the full bound is cheap
    x32, w32 = x.float(), w.float()
    assert prefilter_of(conv, args(x32, w32), {}, [conv(*args(x32, w32))]) is None  # float32 work's wide bands
    products(monkeypatch, 0)
    assert prefilter_of(conv, args(x, w, True), {}, [conv(*args(x, w, True))]) is None  # transposed: no windows here
    for bad in (float("inf"), float("nan"), 2.0**500, 2.0**-600):  # (a square of 2^-600 underflows)
        x2 = x.clone()
        x2[1, 2, 3, 4] = bad
        assert prefilter_of(conv, args(x2, w), {}, [conv(*args(x2, w))]) is None, bad


# the cases whose quantised sums tie on the 5-bit grid (log entries to lose), forward and backward
LOG_CONV_CASES = [c for c in CONV_CASES if c.name in ("conv2d-s2p1d2g2", "conv-backward", "conv-backward-s1")]


def _record_op(func: object, args: tuple, kwargs: dict, bits: int, resolution: str = "log",
               device: str = "cpu", log: object = None) -> tuple[list, RoundedExecution]:
    mode = "replay" if log is not None else "record"
    with RoundedExecution(bits=bits, device=get_device(device), mode=mode, replay_log=log,
                          resolution=resolution) as rx:
        outs = func(*args, **kwargs)
    return list(outs) if isinstance(outs, tuple) else [outs], rx


@pytest.mark.parametrize("dtype,bits", LOG_GRIDS, ids=["f64-b14", "f32-b14"])
@pytest.mark.parametrize("case", LOG_CONV_CASES, ids=[c.name for c in LOG_CONV_CASES])
def test_engine_logs_convolutions_as_their_band_defines_on_both_paths(everywhere: None, case: Case,
                                                                      dtype: torch.dtype, bits: int,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rounding, "UPPER_BAND", False)  # (E's band on every path, as for the matmuls above)
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/{bits}/conv-log".encode()))
    args, kwargs, floats = _conv_operands(case, gen, dtype, bits, "quant")
    assert prefilter.UPPERS[case.op](args, kwargs, floats) is not None  # the case takes the pre-filter
    _ties_logged(monkeypatch)
    products(monkeypatch, 1 << 60)
    plain_out, plain = _record_op(case.op, args, kwargs, bits)  # no pre-filter: E everywhere
    products(monkeypatch, 0)
    monkeypatch.setattr(prefilter, "CONV_GATHER_COST", 1 << 60)
    fallback_out, fallback = _record_op(case.op, args, kwargs, bits)  # U's candidates, E from the full bound
    monkeypatch.setattr(prefilter, "CONV_GATHER_COST", 1)
    gathered_out, gathered = _record_op(case.op, args, kwargs, bits)  # U's candidates, E gathered at them
    for want, got, also in zip(plain_out, fallback_out, gathered_out):
        assert (want is None and got is None and also is None) or (torch.equal(want, got) and torch.equal(want, also))
    assert sum(site.num_entries for site in plain.log.sites) > 0  # the case has entries to lose
    assert fallback.log.to_bytes() == plain.log.to_bytes()
    # the gathered path logs what the band of the gathered E at every position defines
    computed = [(i, v) for i, v in enumerate(floats) if v is not None]
    assert len(gathered.log.sites) == len(computed)
    for site, (i, v) in zip(gathered.log.sites, computed):
        everything = torch.arange(v.numel())
        e = prefilter.BOUNDS_AT[case.op](args, kwargs, floats, i, everything)
        want = gathered._find_entries(site.site, site.op, tuple(v.shape), v.reshape(-1).numpy(), gathered_out[i],
                                      everything.numpy(), e.numpy(), 2 * BAND_SLACK)
        for field in ("dir_pos", "dir_up", "val_pos", "val_res", "val_bits"):
            assert np.array_equal(getattr(site, field), getattr(want, field)), (i, field)
    # and an auditor accepts either log and lands on the trainer's values (on cpu: the emulated devices
    # convolve with groups = 1 only), gathering E at its entries as the convolution's cost says (not the
    # matmuls': made prohibitive here), so without the full bound
    monkeypatch.setattr(prefilter, "GATHER_COST", 1 << 60)
    full_bounds, real = [], bounds.abs_bounds

    def counted(*a: object) -> list:
        full_bounds.append(a[0])
        return real(*a)

    monkeypatch.setattr(bounds, "abs_bounds", counted)
    for log in (fallback.log, gathered.log):
        replayed, rx = _record_op(case.op, args, kwargs, bits, log=log)
        for want, got in zip(plain_out, replayed):
            assert want is None or torch.equal(want, got)
        assert rx.stats["logged"] == sum(site.num_entries for site in log.sites)
    assert not full_bounds


@pytest.mark.parametrize("dtype,bits", LOG_GRIDS, ids=["f64-b14", "f32-b14"])
@pytest.mark.parametrize("case", LOG_CONV_CASES, ids=[c.name for c in LOG_CONV_CASES])
def test_upper_band_logs_convolutions_e_s_entries_and_own_roundings_besides(everywhere: None, case: Case,
                                                                            dtype: torch.dtype, bits: int,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/{bits}/conv-log".encode()))
    # (float32 work's sums off the ties fall within 2U and not 2E of a boundary: see the matmuls' test above)
    args, kwargs, floats = _conv_operands(case, gen, dtype, bits, "normal" if dtype == torch.float32 else "quant")
    _ties_logged(monkeypatch)
    monkeypatch.setattr(rounding, "UPPER_BAND", False)
    e_out, e_rx = _record_op(case.op, args, kwargs, bits)
    monkeypatch.setattr(rounding, "UPPER_BAND", True)
    monkeypatch.setattr(RoundedExecution, "_settle", None)  # (E at the candidates: not asked for)
    u_out, u_rx = _record_op(case.op, args, kwargs, bits)
    for want, got in zip(e_out, u_out):
        assert (want is None and got is None) or torch.equal(want, got)
    pres = prefilter.UPPERS[case.op](args, kwargs, floats)
    computed = [i for i, v in enumerate(floats) if v is not None]
    _upper_log_holds(e_rx.log, u_rx.log, u_rx, [floats[i] for i in computed], [u_out[i] for i in computed],
                     [pres[i] for i in computed], bits)
    e = [prefilter.BOUNDS_AT[case.op](args, kwargs, floats, i, torch.arange(floats[i].numel())) for i in computed]
    _shifted_auditors_accept(u_rx.log, bits, [floats[i] for i in computed], [u_out[i] for i in computed], e)
    # an auditor with its own E accepts it (on cpu: the emulated devices convolve with groups = 1 only)
    replayed, rx = _record_op(case.op, args, kwargs, bits, log=u_rx.log)
    for want, got in zip(e_out, replayed):
        assert want is None or torch.equal(want, got)
    assert rx.stats["logged"] == sum(site.num_entries for site in u_rx.log.sites)
    assert rx.stats["corrections"] == 0


@pytest.mark.parametrize("dtype,bits", LOG_GRIDS, ids=["f64-b14", "f32-b14"])
@pytest.mark.parametrize("case", LOG_CONV_CASES, ids=[c.name for c in LOG_CONV_CASES])
def test_exact_convolutions_are_the_same_with_and_without_the_prefilter(everywhere: None, case: Case,
                                                                        dtype: torch.dtype, bits: int,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{case.name}/{bits}/conv-exact".encode()))
    args, kwargs, _ = _conv_operands(case, gen, dtype, bits, "quant")
    without_grains(monkeypatch)  # (the quantised sums are exact: with it, no op would have a band)
    outs = {}
    for name, least, cost in (("full", 1 << 60, 1), ("fallback", 0, 1 << 60), ("gathered", 0, 1)):
        products(monkeypatch, least)
        monkeypatch.setattr(prefilter, "CONV_GATHER_COST", cost)
        outs[name], rx = _record_op(case.op, args, kwargs, bits, "exact")
        assert rx.stats["ambiguous"] > 0, name
    for name in ("fallback", "gathered"):
        for want, got in zip(outs["full"], outs[name]):
            assert (want is None and got is None) or torch.equal(want, got), name


def test_upper_covers_float32_products_below_the_normal_range(everywhere: None) -> None:
    # float64 work's full bound sums |a| |b| in float32, which rounds a product below 2^-126 up by as much as
    # 2^-150: U's floor must cover that too (found by a review: with 2^-148 a term it did not), for matmuls
    # and convolutions alike
    x = torch.full((1, 1, 1, 64), 2.0**-76, dtype=torch.float64)
    w = torch.full((1, 1, 1, 1), 2.0**-74 * 1.125, dtype=torch.float64)
    conv_args = (x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
    a, b = x.reshape(64, 1), w.reshape(1, 1).expand(1, 64).contiguous()
    for func, args in ((aten.convolution.default, conv_args), (aten.mm.default, (a, b))):
        v = func(*args)
        u = prefilter_of(func, args, {}, [v]).upper().reshape(-1)
        (full,) = BOUNDS[func](args, {}, [v])  # the float32 path (see the fixture)
        gathered = prefilter.BOUNDS_AT[func](args, {}, [v], 0, torch.arange(v.numel()))
        assert (full.reshape(-1) > gathered).all()  # the float32 path's rounding up shows
        assert (u >= full.reshape(-1)).all() and (u >= gathered).all(), func


def test_weight_gradient_upper_pairs_rows_not_whole_channels(everywhere: None) -> None:
    # Output gradients only in image 0's top rows, inputs only in image 1 and in image 0's bottom rows: no
    # weight gradient term is nonzero, and U pairs only rows that meet, so it stays at E's floor, where whole
    # channels' norms (the bound before session 16) lie orders of magnitude above it.
    gen = torch.Generator().manual_seed(16)
    g = torch.zeros(2, 4, 8, 8, dtype=torch.float64)
    x = torch.zeros(2, 3, 8, 8, dtype=torch.float64)
    g[0, :, :2] = round_to_grid(torch.randn(4, 2, 8, generator=gen, dtype=torch.float64), 32)
    x[1] = round_to_grid(torch.randn(3, 8, 8, generator=gen, dtype=torch.float64), 32)
    x[0, :, 5:] = round_to_grid(torch.randn(3, 3, 8, generator=gen, dtype=torch.float64), 32)
    w = torch.ones(4, 3, 3, 3, dtype=torch.float64)
    args = (g, x, w, [4], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [False, True, False])
    op = aten.convolution_backward.default
    floats = [None, op(*args)[1], None]
    assert torch.equal(floats[1], torch.zeros_like(floats[1]))
    u = prefilter_of(op, args, {}, floats, 1).upper().reshape(-1)
    full = BOUNDS[op](args, {}, floats)[1].reshape(-1)  # the float32 path (see the fixture)
    assert (u >= full).all() and (u <= 16 * full).all()
    channels = g.square().sum((0, 2, 3)).sqrt()[:, None] * x.square().sum((0, 2, 3)).sqrt()[None, :]
    assert (channels * gamma(2 * 8 * 8, unit_roundoff(torch.float64)) > 2.0**100 * full.max()).all()


def _linear_operands(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = round_to_grid(torch.randn(48, 40, generator=gen, dtype=torch.float64), 32)
    return x, round_to_grid(torch.randn(40, 24, generator=gen, dtype=torch.float64), 32)


def test_line_norms_serve_the_other_axis_from_one_pass_and_let_go(monkeypatch: pytest.MonkeyPatch) -> None:
    x, _ = _linear_operands(torch.Generator().manual_seed(3))
    passes = []
    real = prefilter._norms_both
    monkeypatch.setattr(prefilter, "_norms_both", lambda *a: passes.append(a[0].shape) or real(*a))
    cache = prefilter.LineNorms()
    rows, cols = np.empty((1, 48)), np.empty((1, 40))
    xt = x.t()[None]  # (x^T's rows: x's columns, a transposed view)
    held = weakref.ref(xt)
    assert cache.of(x[None], rows) == (True, False)
    assert cache.of(xt, cols) == (True, False)
    assert passes == [(48, 40)]  # one pass, over x as it lies in memory
    want_rows, want_cols = np.empty(48), np.empty(40)
    real(x.numpy(), want_rows, want_cols)
    assert np.array_equal(rows[0], want_rows) and np.array_equal(cols[0], want_cols)
    del xt
    assert held() is None  # both axes asked: the cache no longer holds the operand
    # a norm of each axis is within float64's rounding of the exact one
    for got, axis in ((rows[0], 1), (cols[0], 0)):
        exact = (x.square().sum(axis)).numpy()
        assert (np.abs(got * got - exact) <= 64 * 2.0**-53 * exact).all()


def test_a_batch_is_normed_in_one_call_as_slice_by_slice() -> None:
    # `_both_norms` hands a C-contiguous batch to one compiled call (`_norms_batched`): the norms and the flags
    # (finite and no tiny value, the most zeros in a row and in a column) are the slice-by-slice pass's
    rng = np.random.default_rng(5)
    for trial in range(12):
        x = rng.standard_normal((int(rng.integers(2, 7)), int(rng.integers(1, 30)), int(rng.integers(1, 30))))
        x[rng.random(x.shape) < 0.4] = 0
        x[int(rng.integers(x.shape[0])), 0] = 0  # (a row of zeros only: left out of the most zeros)
        if trial % 3 == 1:
            x.flat[int(rng.integers(x.size))] = 1e-300  # tiny
        if trial % 3 == 2:
            x.flat[int(rng.integers(x.size))] = np.inf
        along, across = np.empty(x.shape[:2]), np.empty((x.shape[0], x.shape[2]))
        flags = [prefilter._norms_both(x[n], along[n], across[n]) for n in range(x.shape[0])]
        finite, tiny = all(f[0] for f in flags), sum(f[1] for f in flags)
        want = (finite and tiny == 0, max(f[2] for f in flags), max(f[3] for f in flags))
        got = prefilter._both_norms(x)
        assert np.array_equal(got[0], along) and np.array_equal(got[1], across) and got[2] == want, trial
        gapped = np.empty((x.shape[0], x.shape[1] + 1, x.shape[2]))  # (batches apart in memory)
        gapped[:, :-1] = x
        again = prefilter._both_norms(gapped[:, :-1])
        assert np.array_equal(again[0], along) and np.array_equal(again[1], across) and again[2] == want, trial
        assert want[0] == (trial % 3 == 0) and want[1:] != (0, 0)


def test_both_axes_norms_and_flags_match_a_plain_reference_on_short_and_wide_rows() -> None:
    # `_norms_both` takes rows of `_WIDE_ROWS` values or more four at a time and the rest one by one, in blocks of
    # `NORM_BLOCK` rows whose column sums are summed in order (the last case: three blocks): on row counts
    # that leave remainders, with a row of zeros only (left out of the most zeros), the row with the most zeros,
    # and a tiny value, the largest one and an infinity, a NaN or a value whose square overflows in a third row,
    # each at every place of a block of four in some case and in a remainder row, its flags are numpy's (finite:
    # every square is) and each norm is within float64's rounding of the exact one
    rng = np.random.default_rng(17)
    # (rows, columns, the row with the most zeros, the row with the tiny, largest and non-finite values); the row of
    # zeros only is the middle one
    cases = [(9, 600, 3, 2), (4, 512, 1, 3), (7, 511, 2, 4), (13, 1030, 12, 1), (8, 520, 0, 7), (11, 700, 6, 4),
             (7, 600, 5, 1), (6, 900, 1, 5), (3, 40, 0, 2), (1, 700, 0, 0), (6, 1, 0, 5), (530, 600, 400, 260)]
    for trial, (m, k, busiest, hot) in enumerate(cases):
        x = rng.standard_normal((m, k)) * 2.0 ** rng.integers(-40, 40, (m, k))
        x[rng.random(x.shape) < 0.3] = 0
        x[m // 2] = 0  # a row of zeros only
        x[:, k // 3] = 0  # a column of zeros only
        if busiest != m // 2:
            x[busiest, 0], x[busiest, 1:] = 1.0, 0
        if hot not in (m // 2, busiest):
            x[hot, 5 % k] = 1e-300  # tiny
            x[hot, 7 % k] = 2.0**60  # the largest
            if trial % 3 == 2:
                x[hot, 9 % k] = (np.inf, np.nan, 2.0**520)[trial % 9 // 3]
        rows, cols = np.empty(m), np.empty(k)
        finite, tiny, row_zeros, col_zeros = prefilter._norms_both(x, rows, cols)
        with np.errstate(over="ignore", invalid="ignore"):
            assert finite == bool(np.isfinite(x * x).all()), trial
        assert tiny == int(((x != 0) & (np.abs(x) < prefilter._TINY_LINE)).sum()), trial
        for got, zeros, size in ((row_zeros, (x == 0).sum(1), k), (col_zeros, (x == 0).sum(0), m)):
            assert got == max([int(z) for z in zeros if z < size], default=0), trial
        if not finite:
            continue
        for got, axis in ((rows, 1), (cols, 0)):
            exact = np.array([math.fsum(float(v) * float(v) for v in line) for line in np.moveaxis(x, axis, -1)])
            assert (np.abs(got * got - exact) <= 4 * (k if axis else m) * 2.0**-53 * exact).all(), (trial, axis)


def test_line_norms_recompute_after_an_in_place_change(monkeypatch: pytest.MonkeyPatch) -> None:
    x, _ = _linear_operands(torch.Generator().manual_seed(4))
    cache, first, again = prefilter.LineNorms(), np.empty((1, 48)), np.empty((1, 40))
    cache.of(x[None], first)
    x.mul_(4.0)  # bumps the version counter that x's views share
    cache.of(x.t()[None], again)
    fresh = np.empty((1, 40))
    prefilter.LineNorms().of(x.t()[None], fresh)
    assert np.array_equal(again, fresh)


def test_line_norm_keys_from_torch_metadata_are_the_numpy_path_s() -> None:
    # every layout a matmul operand takes (row- and column-major batches, a batch of one with any batch stride,
    # offsets into storage, both dtypes), and ones the metadata path leaves to numpy (lines of one value,
    # strided lines): where it answers, its key and orientation are exactly what `_canonical` derives
    base = torch.arange(4 * 6 * 10, dtype=torch.float64).reshape(4, 6, 10) + 1
    cases = [base, base.transpose(1, 2), base[1:3], base[1:3].transpose(1, 2), base[2:3], base[2][None],
             base[:, 2:5, :].transpose(1, 2)[:, :, :], base.float(), base.float().transpose(1, 2),
             base[:, :, 1:7], base[:, :1], base[:, :, :1], base[:, ::2], base.transpose(0, 1)]
    answered = 0
    for t in cases:
        canon, rows = prefilter._canonical(t.numpy())
        found = prefilter._torch_key(t)
        if found is not None:
            answered += 1
            assert found == (prefilter._numpy_key(t, canon), rows)
            assert np.may_share_memory(canon, t.numpy())
    assert answered == 9
    # and the norms served through either key are the same
    t = base.transpose(1, 2)
    via_cache, direct = np.empty((4, 10)), np.empty((4, 10))
    prefilter.LineNorms().of(t, via_cache)
    prefilter._line_norms(t, direct)
    assert np.array_equal(via_cache, direct)


def test_fused_optimizer_updates_bump_version_counters() -> None:
    from vtrain.fused_optim import RoundedAdam  # noqa: PLC0415
    layer = torch.nn.Linear(8, 4, dtype=torch.float64)
    opt = RoundedAdam(layer.parameters(), lr=1e-3)
    with RoundedExecution(bits=32, device=get_device("cpu")):
        layer(torch.ones(2, 8, dtype=torch.float64)).sum().backward()
        before = [p._version for p in layer.parameters()]
        opt.step()
        after = [p._version for p in layer.parameters()]
    assert all(a > b for a, b in zip(after, before))


def test_engine_logs_the_same_with_and_without_the_line_norm_cache(everywhere: None,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # a linear layer's forward and backward, each operand normed along both axes, lines of many magnitudes
    # (so that a norm served for the wrong line would drop candidates)
    monkeypatch.setattr(resolve, "CERTIFIERS", {})  # (ties stay entries: there is something to compare)
    without_grains(monkeypatch)
    results = []
    for cached in (True, False):
        if not cached:
            monkeypatch.setattr(prefilter.LineNorms, "of", lambda self, t, out: prefilter._line_norms(t, out))
        gen = torch.Generator().manual_seed(8)
        x, w = (_operand(s, gen, torch.float32, 14, "normal") for s in ((48, 40), (24, 40)))
        scale = 4.0 ** -(torch.arange(40.0) % 8)
        x, w = (x * scale * 4.0 ** -(torch.arange(48.0) % 5)[:, None]).requires_grad_(), (w * scale).requires_grad_()
        with RoundedExecution(bits=14, device=get_device("cpu")) as rx:
            torch.nn.functional.linear(x, w).square().sum().backward()
        results.append((rx.log.to_bytes(), x.grad, w.grad, rx.stats["logged"]))
    (log, gx, gw, logged), (log2, gx2, gw2, _) = results
    assert logged > 0 and log == log2 and torch.equal(gx, gx2) and torch.equal(gw, gw2)


def _resnet_block(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """A block's input read by two convolutions (a 3 x 3 and a 1 x 1 shortcut, as resnet-tiny's), values of many
    magnitudes so that sums served for the wrong operand would move candidates."""
    x = round_to_grid(torch.randn(4, 6, 9, 9, generator=gen, dtype=torch.float64)
                      * 4.0 ** -(torch.arange(9.0) % 5), 12).requires_grad_()
    w3, w1 = (round_to_grid(torch.randn(s, generator=gen, dtype=torch.float64), 12).requires_grad_()
              for s in ((8, 6, 3, 3), (8, 6, 1, 1)))
    return x, w3, w1


def test_convolution_squares_are_read_once_a_step_and_log_the_same(everywhere: None,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Forward and backward of two convolutions sharing their input: with the cache each operand's sums of
    # squares come from one pass (the backward's gradients are new), and the step logs and computes exactly
    # what it does when every convolution reads its operands afresh.
    monkeypatch.setattr(resolve, "CERTIFIERS", {})  # (ties stay entries: there is something to compare)
    without_grains(monkeypatch)
    real = prefilter._squares
    results = []
    for cached in (True, False):
        if not cached:
            monkeypatch.setattr(prefilter.LineNorms, "squares", lambda self, t: prefilter._conv_squares(t))
        reads = []
        monkeypatch.setattr(prefilter, "_squares", lambda x, *a: reads.append(x.shape) or real(x, *a))
        x, w3, w1 = _resnet_block(torch.Generator().manual_seed(21))
        with RoundedExecution(bits=12, device=get_device("cpu")) as rx:
            y = torch.nn.functional.conv2d(x, w3, padding=1) * torch.nn.functional.conv2d(x, w1)
            y.square().sum().backward()
        results.append((rx.log.to_bytes(), x.grad, w3.grad, w1.grad, rx.stats["logged"], reads))
    (log, *grads, logged, reads), (log2, *grads2, _, reads2) = results
    assert logged > 0 and log == log2 and all(torch.equal(a, b) for a, b in zip(grads, grads2))
    # cached: x, w3 and w1 once each, then the two output gradients; afresh: x and a weight in each of four ops
    assert sorted(reads) == sorted([(4, 6, 9, 9), (8, 6, 3, 3), (8, 6, 1, 1), (4, 8, 9, 9), (4, 8, 9, 9)])
    assert sorted(reads2) == sorted([(4, 6, 9, 9)] * 4 + [(8, 6, 3, 3), (8, 6, 1, 1)] * 2 + [(4, 8, 9, 9)] * 2)


def test_convolution_squares_recompute_after_an_in_place_change() -> None:
    x, _, _ = _resnet_block(torch.Generator().manual_seed(22))
    x = x.detach()
    cache = prefilter.LineNorms()
    first = cache.squares(x)
    assert cache.squares(x) is first
    x.mul_(4.0)  # bumps the version counter
    again, fresh = cache.squares(x), prefilter._conv_squares(x)
    assert again is not first
    for a, b in zip(again, fresh):
        assert np.array_equal(a, b)


def test_the_compiled_maximum_and_scaling_are_numpy_s() -> None:
    gen = np.random.default_rng(21)
    for shape in ((1, 1), (2, 1024), (3, 7)):
        x = gen.random(shape) * 10.0 ** gen.integers(-300, 300, shape)
        for special in (None, math.inf, math.nan, 0.0):
            y = x.copy()
            if special is not None:
                y.flat[gen.integers(y.size)] = special
            got, want = prefilter._largest(y), y.max()
            assert got == want or (math.isnan(got) and math.isnan(want))
            scaled, add = y.copy(), np.empty((1, shape[1]))
            prefilter._scale_fill(scaled, 0.3 * math.pi, add, 2.0**-1000)
            assert np.array_equal((y * (0.3 * math.pi)).view(np.int64), scaled.view(np.int64))
            assert np.all(add == 2.0**-1000)
