"""RoundedExecution: record on one device, replay on another; errors name step, site, op and index."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from numkit import batch, make_model, make_optimizer, params_equal, run
from vtrain.devices import get_device, list_devices
from vtrain.grid import round_to_grid
from vtrain.ops import UnsupportedOpError
from vtrain.rounding import (BAND_SLACK, IllegitimateLogEntryError, NonFiniteError, RoundedExecution,
                             TraceMismatchError)
from vtrain.roundlog import SiteLog, StepLog
from vtrain.valuecode import encode

EMULATED = [d.name for d in list_devices() if d.emulated]
STEPS = {"mlp": 16, "cnn": 10}


@pytest.fixture(scope="module")
def trainer_runs() -> dict:
    return {kind: run(kind, "cpu", "record", STEPS[kind]) for kind in ("mlp", "cnn")}


@pytest.mark.parametrize("kind", ["mlp", "cnn"])
@pytest.mark.parametrize("auditor", EMULATED)
def test_log_makes_every_device_bit_identical(trainer_runs: dict, kind: str, auditor: str) -> None:
    model, logs, stats = trainer_runs[kind]
    replayed, _, rstats = run(kind, auditor, "replay", STEPS[kind], logs=logs)
    assert params_equal(model, replayed)
    # Each correction is an element where this device's own rounding disagreed with the trainer's (float32
    # work, bits = 19: the scale model), so rounding without the log is not enough. Whether the weights
    # absorb those flips within a few steps varies (even with MKL's alignment-dependent float32 paths);
    # the weight-level ablation over a longer run is the engine's test.
    assert sum(s["corrections"] for s in rstats) > 0


def test_emulated_trainer_cpu_auditor_sgd_float64_and_tau_policy() -> None:
    model, logs, _ = run("mlp", "emu:lanes8-butterfly", "record", 4)
    replayed, _, rstats = run("mlp", "cpu", "replay", 4, logs=logs)
    assert params_equal(model, replayed)
    # logistic regression with SGD (momentum, weight decay: add with alpha), float64 work at bits = 32
    model, logs, _ = run("logreg", "emu:splitk16-revseq", "record", 4, dtype=torch.float64, bits=32)
    replayed, _, _ = run("logreg", "emu:splitk8-tree", "replay", 4, logs=logs, dtype=torch.float64, bits=32)
    assert params_equal(model, replayed)
    model, logs, stats = run("mlp", "cpu", "record", 3, policy="tau")
    replayed, _, _ = run("mlp", "emu:splitk8-tree", "replay", 3, logs=logs, policy="tau")
    assert all(s["logged_values"] == 0 and s["logged"] > 0 for s in stats)
    assert params_equal(model, replayed)


def test_stats_and_storage_numbers(trainer_runs: dict) -> None:
    _, logs, stats = trainer_runs["mlp"]
    s = stats[0]
    for key in ("rounded", "logged", "logged_values", "corrections", "sites", "seconds", "dense_bytes",
                "dense_zip_bytes", "log_bytes"):
        assert key in s
    assert s["dense_bytes"] == -(-s["rounded"] // 5)
    assert s["log_bytes"] == len(logs[0].to_bytes())
    assert s["logged"] == logs[0].num_entries() and s["sites"] == len(logs[0].sites)


def test_every_output_is_on_the_grid() -> None:
    model, _, _ = run("cnn", "emu:splitk16-revseq", "plain", 2)
    opt_state = make_optimizer("cnn", model)
    for p in model.parameters():
        assert torch.equal(p, round_to_grid(p, 19))
        assert torch.equal(p.grad, round_to_grid(p.grad, 19))
    del opt_state


def _one_step(kind: str, log: StepLog | None, mode: str, device: str = "cpu", step: int = 0):
    model = make_model(kind, torch.float32, 19)
    opt = make_optimizer(kind, model)
    x, y = batch(step, torch.float32)
    with RoundedExecution(bits=19, device=get_device(device), mode=mode, replay_log=log, step=step) as rx:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return rx


def test_trace_mismatch_names_step_and_site(trainer_runs: dict) -> None:
    cnn_log = trainer_runs["cnn"][1][0]
    with pytest.raises(TraceMismatchError) as err:
        _one_step("mlp", cnn_log, "replay", step=0)
    assert err.value.step == 0 and err.value.site == 0
    mlp_log = trainer_runs["mlp"][1][0]
    short = StepLog(mlp_log.sites[:-1], mlp_log.policy, mlp_log.bits)
    with pytest.raises(TraceMismatchError, match="end of the step"):
        _one_step("mlp", short, "replay")


def _far_from_boundaries(rx_log: StepLog, kind: str) -> tuple[int, int, bool]:
    """A site and an unlogged element whose value is far from every boundary, and its rounding direction."""
    captured = {}
    site_of_interest = next(s for s in rx_log.sites if s.op == "aten.addmm.default")

    class Capture(RoundedExecution):
        def _round_near(self, spec, args, kwargs, floats, i, factor, bounds, in_place=False):  # noqa: ANN001, ANN202
            near = super()._round_near(spec, args, kwargs, floats, i, factor, bounds)  # (not in place: v stays)
            if self._counts["sites"] - 1 == site_of_interest.site:
                captured["v"], captured["r"] = floats[i].reshape(-1).clone(), near.r.reshape(-1).clone()
            return near

    model = make_model(kind, torch.float32, 19)
    x, _ = batch(0, torch.float32)
    with Capture(bits=19, device=get_device("cpu"), mode="record"):
        model(x)
    v, r = captured["v"], captured["r"]
    frac = ((v - r).abs() / (r.abs() * 2.0**-10)).numpy()
    logged = set(site_of_interest.dir_pos.tolist()) | set(site_of_interest.val_pos.tolist())
    # a quarter spacing from its grid value and from the boundary: unambiguous on every device
    index = next(i for i in np.argsort(np.abs(frac - 0.25)) if i not in logged and r[i] != 0)
    return site_of_interest.site, int(index), bool(v[index] > r[index])


def test_flipped_entry_outside_the_band_is_illegitimate(trainer_runs: dict) -> None:
    log = trainer_runs["mlp"][1][0]
    site, index, v_above_r = _far_from_boundaries(log, "mlp")
    sites = list(log.sites)
    s = sites[site]
    # claim the grid value across the nearest boundary: the trainer steering a value that was not ambiguous
    k = int(np.searchsorted(s.dir_pos, index))
    sites[site] = SiteLog(s.site, s.op, s.shape, np.insert(s.dir_pos, k, index), np.insert(s.dir_up, k, v_above_r),
                          s.val_pos, s.val_res, s.val_bits)
    with pytest.raises(IllegitimateLogEntryError) as err:
        _one_step("mlp", StepLog(sites, log.policy, log.bits), "replay", device="emu:splitk8-tree")
    assert (err.value.step, err.value.site, err.value.index) == (0, site, index)
    assert err.value.op == "aten.addmm.default"
    # the same entry claiming the auditor's own side is harmless: no error, no correction
    sites[site] = SiteLog(s.site, s.op, s.shape, np.insert(s.dir_pos, k, index),
                          np.insert(s.dir_up, k, not v_above_r), s.val_pos, s.val_res, s.val_bits)
    rx = _one_step("mlp", StepLog(sites, log.policy, log.bits), "replay", device="emu:splitk8-tree")
    assert rx.stats["logged"] == log.num_entries() + 1


def test_a_direction_and_a_value_entry_at_one_position_are_illegitimate(trainer_runs: dict) -> None:
    log = trainer_runs["mlp"][1][0]
    site = next(i for i, s in enumerate(log.sites) if s.dir_pos.size)
    s = log.sites[site]
    index = int(s.dir_pos[0])
    where = int(np.searchsorted(s.val_pos, index))
    sites = list(log.sites)
    sites[site] = SiteLog(s.site, s.op, s.shape, s.dir_pos, s.dir_up, np.insert(s.val_pos, where, index),
                          np.insert(s.val_res, where, 0), np.insert(s.val_bits, where, 1))
    with pytest.raises(IllegitimateLogEntryError, match="same position") as err:
        _one_step("mlp", StepLog(sites, log.policy, log.bits), "replay")
    assert (err.value.site, err.value.index) == (site, index)


def _pool_ties() -> torch.Tensor:
    """One 2x2 window per image whose mean is an exact float32 tie, 1 + 2^-24: in image 0 every term is a
    multiple of 2^-22 (a sum exact in float64 in any order: certified), in image 1 two terms of +-2^-60
    cancel (exact here too, but no grain-based certificate can say so)."""
    x = torch.zeros(2, 1, 2, 2, dtype=torch.float64)
    x[:, 0, 0, 0], x[:, 0, 0, 1] = 4.0, 2.0**-22
    x[1, 0, 1, 0], x[1, 0, 1, 1] = 2.0**-60, -(2.0**-60)
    return x


def _pool_log(mode: str, log: StepLog | None = None) -> tuple[torch.Tensor, RoundedExecution]:
    with RoundedExecution(bits=32, device=get_device("emu:splitk8-tree"), mode=mode, replay_log=log) as rx:
        out = F.avg_pool2d(_pool_ties(), 2)
    return out.reshape(-1), rx


def test_certified_exact_ties_need_no_entry_and_admit_none() -> None:
    out, rx = _pool_log("record")
    (site,) = rx.log.sites
    assert out.tolist() == [1.0, 1.0]  # round half to even, on every device
    # only the uncertified tie is logged; the certified one is nobody's choice
    assert site.dir_pos.tolist() == [1] and site.dir_up.tolist() == [False] and rx.stats["certified"] == 1
    up = 1.0 + 2.0**-23
    for pos in (0, 1):
        forged = SiteLog(0, site.op, site.shape, np.array([pos]), np.array([True]))  # claim the upper neighbour
        if pos == 0:  # an exact value has no band: steering it is illegitimate
            with pytest.raises(IllegitimateLogEntryError) as err:
                _pool_log("replay", StepLog([forged]))
            assert (err.value.site, err.value.index) == (0, 0)
        else:  # within the band of an uncertified value: the auditor follows the log
            replayed, rx2 = _pool_log("replay", StepLog([forged]))
            assert replayed.tolist() == [1.0, up] and rx2.stats["corrections"] == 1
    # the certified value's own rounding is accepted, and changes nothing
    agrees = SiteLog(0, site.op, site.shape, np.array([0]), np.array([False]))
    replayed, rx3 = _pool_log("replay", StepLog([agrees]))
    assert replayed.tolist() == [1.0, 1.0] and rx3.stats["corrections"] == 0


@pytest.mark.parametrize("resolution", ["log", "exact"])
def test_a_certificate_is_handed_the_unrounded_values_it_is_asked_about(resolution: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # Rows 0 and 2 sum to exact float32 midpoints (1 + 2^-23 + 2^-24, 4 + 2^-21 + 2^-22), candidates that the
    # grains certify (row 3, 1 + 2^-60, is inexact: the whole op is not, so each candidate is asked about); the
    # trainer (the log's entries, or the exact resolution's ambiguous values) must hand
    # vtrain.resolve.certify the op's own unrounded values at exactly the positions it asks about, which the
    # values' rule reads (resolve._certify_lines, a matmul's certificate).
    from vtrain import resolve  # noqa: PLC0415
    calls: list = []
    real = resolve.certify

    def spy(op, args, kwargs, outs, e, i, pos, held=None):  # noqa: ANN001, ANN202
        calls.append((pos.tolist(), None if held is None else held.tolist()))
        return real(op, args, kwargs, outs, e, i, pos, held)

    monkeypatch.setattr(resolve, "certify", spy)
    a = torch.tensor([[1 + 2.0**-23, 2.0**-24], [1.5, 0.25], [4 + 2.0**-21, 2.0**-22], [1.0, 2.0**-60]],
                     dtype=torch.float64)
    b = torch.ones(2, 1, dtype=torch.float64)
    want = (a @ b).reshape(-1)
    with RoundedExecution(bits=32, device=get_device("cpu"), mode="record", resolution=resolution) as rx:
        out = torch.mm(a, b)
    assert calls and all(held is not None for _, held in calls)
    assert all(held == want[pos].tolist() for pos, held in calls)
    assert sorted(p for pos, _ in calls for p in pos) == [0, 2] and rx.stats["certified"] == 2
    assert out.reshape(-1).tolist() == [1 + 2.0**-22, 1.75, 4 + 2.0**-20, 1.0]  # (ties to even)


def test_tf32_cudnn_and_nnpack_are_off_inside_rounded_execution_and_restored_after() -> None:
    # TF32's 10-bit products, cuDNN's FFT and Winograd convolutions and NNPACK's (the CPU's where oneDNN is off)
    # fall outside every error bound. The flags are process-wide (read the same on a machine without CUDA), so
    # this checks them on any machine.
    backends = torch.backends
    saved = (backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32, backends.cudnn.enabled)
    nnpack = backends.nnpack.set_flags(True)[0]
    try:
        backends.cuda.matmul.allow_tf32 = backends.cudnn.allow_tf32 = backends.cudnn.enabled = True
        with pytest.raises(RuntimeError, match="inside"):
            with RoundedExecution(bits=32, device=get_device("cpu"), mode="plain"):
                assert not (backends.cuda.matmul.allow_tf32 or backends.cudnn.allow_tf32 or backends.cudnn.enabled)
                assert not torch._C._get_nnpack_enabled()
                raise RuntimeError("inside")  # (restored on the way out of an error too)
        assert backends.cuda.matmul.allow_tf32 and backends.cudnn.allow_tf32 and backends.cudnn.enabled
        assert torch._C._get_nnpack_enabled()
    finally:
        backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32, backends.cudnn.enabled = saved
        backends.nnpack.set_flags(nnpack)


def _entries_case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, RoundedExecution]:
    """(v, its rounding r, a band E of two spacings at 2.5, a replaying RoundedExecution) for four values."""
    v = torch.tensor([1.5 + 2.0**-26, 1.5 - 2.0**-26, 2.5 + 2.0**-24 - 2.0**-28, 3.25 + 2.0**-25], dtype=torch.float64)
    rx = RoundedExecution(bits=32, device=get_device("cpu"), mode="replay", replay_log=StepLog([]))
    return v, round_to_grid(v, 32), torch.full((4,), 2.0**-22, dtype=torch.float64), rx


def _value_entry(v: torch.Tensor, named: torch.Tensor, e: torch.Tensor, at: int) -> SiteLog:
    """A site with one value entry at `at` naming `named` (the trainer's band: 2 E BAND_SLACK)."""
    res, widths = encode(v[at:at + 1].numpy(), named.reshape(1).numpy(), (e[at:at + 1] * (2 * BAND_SLACK)).numpy(),
                         32)
    return SiteLog(0, "aten.mm.default", tuple(v.shape), val_pos=np.array([at]), val_res=res, val_bits=widths)


def test_the_band_is_read_only_where_an_entry_changes_a_value() -> None:
    """An entry that claims the auditor's own rounding passes the check whatever the band (rounding is
    monotone), and a residue that is r's own names r, so E and the certificates are asked for only where an
    entry changes r."""
    v, r, e, rx = _entries_case()
    own = _value_entry(v, r[3], e, 3)
    # positions 0 and 1 claim r's own value (the near boundary above, then below), 2 the value across it
    entry = SiteLog(0, own.op, own.shape, np.array([0, 1, 2]), np.array([False, True, True]), own.val_pos,
                    own.val_res, own.val_bits)
    asked: dict[str, list] = {"E": [], "certificate": [], "held": []}

    def bound_at(pos: torch.Tensor) -> torch.Tensor:
        asked["E"] += pos.tolist()
        return e[pos]

    def certify(pos: torch.Tensor, e_pos: torch.Tensor, held: np.ndarray) -> torch.Tensor:
        asked["certificate"] += pos.tolist()
        asked["held"] += held.tolist()  # (the auditor's own unrounded values there, which may rule it out)
        return torch.zeros(pos.numel(), dtype=torch.bool)

    out = rx._apply_entries(entry, entry.op, v, r.clone(), bound_at, certify)
    assert asked == {"E": [2], "certificate": [2], "held": [v[2].item()]}
    assert out.tolist() == [1.5, 1.5, 2.5 + 2.0**-22, 3.25]
    assert rx.stats["corrections"] == 1 and rx.stats["logged"] == 4 and rx.stats["logged_values"] == 1


def test_a_value_entry_that_changes_a_value_is_followed_unless_the_value_is_certified_exact() -> None:
    v, r, e, rx = _entries_case()
    up = r[3] + 2.0**-22  # the next grid value up, within E's band
    moved = _value_entry(v, up, e, 3)
    never = torch.zeros(1, dtype=torch.bool)
    assert rx._apply_entries(moved, moved.op, v, r.clone(), lambda pos: e[pos], lambda pos, e_pos, held: never)[3] == up
    with pytest.raises(IllegitimateLogEntryError) as err:  # an exact value admits only its own rounding
        rx._apply_entries(moved, moved.op, v, r.clone(), lambda pos: e[pos], lambda pos, e_pos, held: ~never)
    assert err.value.index == 3
    # a value entry naming -0 where the auditor rounded to +0: no correction, but the trainer's zero is written
    tiny = torch.tensor([2.0**-160], dtype=torch.float64)
    band = torch.tensor([2.0**-150], dtype=torch.float64)
    zero = _value_entry(tiny, torch.tensor(-0.0, dtype=torch.float64), band, 0)
    out = rx._apply_entries(zero, zero.op, tiny, round_to_grid(tiny, 32), lambda pos: band,
                            lambda pos, e_pos, held: never)
    assert out.item() == 0.0 and torch.signbit(out).item() and rx.stats["corrections"] == 1


@pytest.mark.parametrize("side", [-1.0, 1.0])
def test_a_direction_entry_across_half_the_smallest_subnormal_writes_the_trainer_s_zero(side: float) -> None:
    # The trainer's value lies between the boundary at -+2^-150 and zero (its rounding: a zero of the boundary's
    # sign), the auditor's just beyond that boundary (its rounding: -+2^-149); the entry moves it across to that
    # zero, sign bit and all, as the trainer's state holds it.
    s = 2.0**-149
    trainer = RoundedExecution(bits=32, device=get_device("cpu"), mode="record")
    v_t = np.array([side * 0.45 * s])
    r_t = round_to_grid(torch.from_numpy(v_t), 32)
    assert r_t.item() == 0.0 and torch.signbit(r_t).item() == (side < 0)
    near_lo = trainer._classify(v_t, r_t.numpy(), np.array([0.2 * s]))[0]
    entry = SiteLog(0, "aten.mm.default", (1,), np.array([0]), near_lo)
    v = torch.tensor([side * 0.55 * s], dtype=torch.float64)
    rx = RoundedExecution(bits=32, device=get_device("cpu"), mode="replay", replay_log=StepLog([]))
    out = rx._apply_entries(entry, entry.op, v, round_to_grid(v, 32), lambda pos: torch.full((1,), 0.1 * s,
                                                                                                dtype=torch.float64))
    assert out.item() == 0.0 and torch.signbit(out).item() == (side < 0)
    assert rx.stats["corrections"] == 1


def test_the_exact_resolution_retries_failed_certificates_on_a_doubling_schedule(monkeypatch) -> None:  # noqa: ANN001
    """Under `exact` a certificate only spares an exact recomputation: one that failed lately at an op is
    skipped (as vtrain.grains' whole-op tests are), and the values are the correctly rounded ones either way."""
    x = _pool_ties()[1:]  # a tie that no grain-based certificate proves exact
    steps: list[int] = []
    certified = RoundedExecution._certified

    def counted(self: RoundedExecution, *args: object) -> torch.Tensor | None:
        steps.append(self.step)
        return certified(self, *args)

    monkeypatch.setattr(RoundedExecution, "_certified", counted)
    hints: dict = {}
    for t in range(1, 10):
        with RoundedExecution(bits=32, device=get_device("cpu"), resolution="exact", step=t, grain_hints=hints) as rx:
            assert F.avg_pool2d(x, 2).item() == 1.0  # the exact tie, to even
        assert rx.stats["ambiguous"] == 1 and rx.stats["recomputed"] == 1 and rx.stats["certified"] == 0
    assert steps == [1, 2, 4, 8]


def test_entry_outside_the_output_is_named() -> None:
    out, rx = _pool_log("record")
    (site,) = rx.log.sites
    bad = StepLog.from_bytes(StepLog([SiteLog(0, site.op, site.shape, np.array([2]), np.array([True]))]).to_bytes())
    with pytest.raises(IllegitimateLogEntryError, match="element 2.*has 2 elements") as err:
        _pool_log("replay", bad)
    assert err.value.site == 0 and err.value.op == "aten.avg_pool2d.default"
    # a log made in memory (not decoded: its positions need not increase) is refused alike, not read past the output
    for positions in ([2, 0], [-1, 0], [10**12, 1]):
        made = StepLog([SiteLog(0, site.op, site.shape, np.array(positions), np.array([True, False]))])
        with pytest.raises(IllegitimateLogEntryError, match="has 2 elements"):
            _pool_log("replay", made)


def test_unsupported_op_is_named() -> None:
    x = torch.randn(4, dtype=torch.float64)
    with pytest.raises(UnsupportedOpError, match="aten.special_bessel_j0"):
        with RoundedExecution(bits=32, device=get_device("cpu")):
            torch.special.bessel_j0(x)


@pytest.mark.parametrize("bits", [32, 19])
def test_a_constant_off_the_grid_that_an_exact_op_writes_is_rounded_onto_it(bits: int) -> None:
    # clamp, hardtanh, masked_fill, where, pad and their kin copy their numbers into the output: with 0.1 that is
    # a value off the grid, which every output must be on; grid numbers and -inf (a mask before a softmax) are
    # left as they are, with no rounding pass
    x = round_to_grid(torch.randn(8, dtype=torch.float64) * 0.3, bits)
    keep = x > 0
    tenth = float(round_to_grid(torch.tensor(0.1, dtype=torch.float64), bits))
    with RoundedExecution(bits=bits, device=get_device("cpu"), mode="record") as rx:
        outs = [torch.clamp(x, min=0.1), x.clamp_max(0.1), x.masked_fill(keep, 0.1), torch.where(keep, x, 0.1),
                F.pad(x, (1, 1), value=0.1), x.clone().masked_fill_(keep, 0.1), torch.arange(0.0, 1.0, 0.1),
                F.hardtanh(x, -0.1, 0.1)]
        rounded = rx.stats["rounded"]
        grid = [x.masked_fill(keep, -128.0), x.masked_fill(keep, float("-inf")), torch.clamp(x, 0.0, 1.0)]
        assert rx.stats["rounded"] == rounded
    for out in outs:
        assert torch.equal(out, round_to_grid(out, bits))
    assert torch.equal(outs[0], torch.clamp(x, min=tenth)) and torch.equal(outs[2], x.masked_fill(keep, tenth))
    assert torch.equal(grid[1], x.masked_fill(keep, float("-inf")))
    with pytest.raises(NonFiniteError, match=r"op #0 \(aten.masked_fill"):
        with RoundedExecution(bits=bits, device=get_device("cpu"), mode="record"):
            x.masked_fill(keep, float("nan"))


@pytest.mark.parametrize("work", [torch.float64, torch.float32])
def test_constants_beyond_the_grid_stay_and_integers_and_aranges_are_rounded(work: torch.dtype) -> None:
    # at bits = 12 the grid has 4 significant bits: 257 and arange(300)'s 257, 259, ... lie off it; finfo's
    # smallest value (a mask before a softmax) lies beyond its range and stays, as -inf does
    bits = 12
    x = round_to_grid(torch.randn(8, dtype=torch.float64), bits).to(work)
    keep = x > 0
    with RoundedExecution(bits=bits, device=get_device("cpu"), mode="record"):
        whole = x.masked_fill(keep, torch.tensor(257))
        counted = torch.arange(300.0, dtype=work)
        stepped = torch.arange(1.0, 2.0, 2.0**-8, dtype=work)
        lowest = x.masked_fill(keep, torch.finfo(work).min)
    for out in (whole, counted, stepped):
        assert torch.equal(out, round_to_grid(out, bits))
    assert torch.equal(whole[keep], torch.full_like(whole[keep], 256.0)) and counted[257] == 256
    assert torch.equal(lowest, x.masked_fill(keep, torch.finfo(work).min))


def test_an_index_put_that_writes_refuses_a_position_named_twice_by_integer_indices() -> None:
    # x[idx] = v: at a repeated position the kernel keeps one of the values, which one its order decides (one CPU
    # thread's last, any on parallel threads or a GPU), so the step would depend on the device; distinct positions
    # and boolean masks write as torch does
    x, v = torch.zeros(6, dtype=torch.float64), torch.tensor([1.5, -2.0, 3.25], dtype=torch.float64)
    with RoundedExecution(bits=32, device=get_device("cpu"), mode="record"):
        once = x.clone().index_put_((torch.tensor([4, 0, 2]),), v)
        masked = x.clone().index_put_((torch.tensor([True, False, True, False, False, True]),), v)
        scalar = x.clone().index_put_((torch.tensor([1, 3]),), torch.tensor(0.75, dtype=torch.float64))
        with pytest.raises(UnsupportedOpError, match="index_put.*names twice"):
            x.clone().index_put_((torch.tensor([4, 0, 4]),), v)
    assert once.tolist() == [-2.0, 0, 3.25, 0, 1.5, 0] and masked.tolist() == [1.5, 0, -2.0, 0, 0, 3.25]
    assert scalar.tolist() == [0, 0.75, 0, 0.75, 0, 0]


def test_an_index_put_that_sums_is_rounded_and_refused_where_a_position_repeats() -> None:
    # x[idx]'s backward sums the gradients into zeros at idx (index_put with accumulate): one IEEE addition a
    # position where the positions differ, rounded like one; a sum in the device's order where one repeats
    bits = 12
    x = round_to_grid(torch.randn(6, dtype=torch.float64), bits).requires_grad_()
    w = round_to_grid(torch.tensor([0.3, 0.7, 1.1], dtype=torch.float64), bits)
    with RoundedExecution(bits=bits, device=get_device("cpu"), mode="record"):
        (x[torch.tensor([0, 2, -1])] * w).sum().backward()
    assert torch.equal(x.grad, torch.zeros(6, dtype=torch.float64).index_put((torch.tensor([0, 2, 5]),), w))
    for repeated in (torch.tensor([1, 1, 3]), torch.tensor([5, 0, -1])):
        with pytest.raises(UnsupportedOpError, match="index_put.*named twice"):
            with RoundedExecution(bits=bits, device=get_device("cpu"), mode="record"):
                (x[repeated] * w).sum().backward()
    # columns picked (the indices hold None for the rows), and integer counts, which repeat in any order alike
    m = round_to_grid(torch.randn(2, 6, dtype=torch.float64), bits).requires_grad_()
    counts = torch.zeros(4, dtype=torch.long)
    with RoundedExecution(bits=bits, device=get_device("cpu"), mode="record"):
        (m[:, torch.tensor([1, 3, -1])] * w).sum().backward()
        counts.index_put_((torch.tensor([1, 1, 2]),), torch.tensor(1), accumulate=True)
    want = torch.zeros(2, 6, dtype=torch.float64)
    want[:, [1, 3, 5]] = w
    assert torch.equal(m.grad, want) and counts.tolist() == [0, 2, 1, 0]
    # positions named by two indices: distinct pairs whose rows and columns repeat apart (-5 the column 1), and a
    # pair named twice (-1 the column 5)
    rows, cols = torch.tensor([0, 1, 1]), torch.tensor([1, 0, -5])
    with RoundedExecution(bits=bits, device=get_device("cpu"), mode="record"):
        got = torch.zeros(2, 6, dtype=torch.float64).index_put((rows, cols), w, accumulate=True)
    assert torch.equal(got, torch.zeros(2, 6, dtype=torch.float64).index_put((rows, cols), w))
    with pytest.raises(UnsupportedOpError, match="index_put.*named twice"):
        with RoundedExecution(bits=bits, device=get_device("cpu"), mode="record"):
            torch.zeros(2, 6, dtype=torch.float64).index_put((rows, torch.tensor([1, 5, -1])), w, accumulate=True)


def test_overflow_is_a_non_finite_error_naming_step_and_op() -> None:
    a = torch.full((2, 2), 1e30, dtype=torch.float64)
    with pytest.raises(NonFiniteError) as err:
        with RoundedExecution(bits=32, device=get_device("emu:splitk8-tree"), step=5):
            a @ a
    assert err.value.step == 5 and "aten.mm" in err.value.op
    with pytest.raises(NonFiniteError):
        with RoundedExecution(bits=19, device=get_device("cpu"), step=1):
            torch.zeros(3, dtype=torch.float32) / torch.zeros(3, dtype=torch.float32)


def test_plain_rounding_and_a_quiet_replay_round_in_place_leaving_inputs_and_errors_as_they_were() -> None:
    # Plain rounding and a replayed site without entries round a device op's lone output in its own memory:
    # the same values as out of place, the inputs untouched, and a value off the grid still named as it was.
    gen = torch.Generator().manual_seed(3)
    a, b = (round_to_grid(torch.randn(*shape, generator=gen, dtype=torch.float64), 32)
            for shape in ((64, 48), (48, 40)))
    a0, b0 = a.clone(), b.clone()
    with RoundedExecution(bits=32, device=get_device("cpu"), mode="record") as rx:
        want = a @ b
    (site,) = rx.log.sites
    quiet = StepLog([SiteLog(0, site.op, site.shape)])
    for mode, log in (("plain", None), ("replay", quiet)):
        with RoundedExecution(bits=32, device=get_device("cpu"), mode=mode, replay_log=log):
            got = a @ b
        assert torch.equal(got, want) and torch.equal(a, a0) and torch.equal(b, b0), mode
    big = torch.full((2, 2), 1e30, dtype=torch.float64)
    for mode, log in (("plain", None), ("replay", StepLog([SiteLog(0, site.op, (2, 2))]))):
        with pytest.raises(NonFiniteError, match=r"value 2\.0000000000000003e\+60 is NaN, infinite or beyond"):
            with RoundedExecution(bits=32, device=get_device("cpu"), step=5, mode=mode, replay_log=log):
                big @ big


@pytest.mark.parametrize("make_opt", [
    lambda p: torch.optim.Adam(p, amsgrad=True, weight_decay=0.1, foreach=False),
    lambda p: torch.optim.AdamW(p, foreach=False),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01, foreach=False),
    lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1, foreach=False),
])
def test_optimizer_variants_and_smooth_activations_replay_exactly(make_opt) -> None:  # noqa: ANN001
    def train(device: str, mode: str, logs: list[StepLog] | None) -> tuple[list[torch.Tensor], list[StepLog]]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                                    torch.nn.Sigmoid(), torch.nn.Linear(16, 3)).double()
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(round_to_grid(p, 30))
        opt = make_opt(model.parameters())
        gen = torch.Generator().manual_seed(1)
        out = []
        for t in range(3):
            x = round_to_grid(torch.randn(16, 8, generator=gen, dtype=torch.float64), 30)
            y = torch.randint(0, 3, (16,), generator=gen)
            with RoundedExecution(bits=30, device=get_device(device), mode=mode, step=t,
                                  replay_log=None if logs is None else logs[t]) as rx:
                opt.zero_grad()
                F.cross_entropy(model(x), y).backward()
                opt.step()
            out.append(rx.log)
        state = [p.detach().clone() for p in model.parameters()]
        state += [v for p in model.parameters() for v in opt.state[p].values() if isinstance(v, torch.Tensor)]
        return state, out

    trainer, logs = train("emu:splitk16-revseq", "record", None)
    auditor, _ = train("emu:lanes8-butterfly", "replay", logs)
    assert len(trainer) == len(auditor) and all(torch.equal(a, b) for a, b in zip(trainer, auditor))


def test_float32_work_at_bits32_is_plain_float32_with_an_empty_log() -> None:
    model, logs, stats = run("mlp", "cpu", "record", 2, dtype=torch.float32, bits=32)
    assert all(log.num_entries() == 0 and not log.sites for log in logs)
    replayed, _, _ = run("mlp", "cpu", "replay", 2, logs=logs, dtype=torch.float32, bits=32)
    assert params_equal(model, replayed)


class _TinyDecoder(torch.nn.Module):
    """Embedding, a hand-written layer norm, causal attention, GELU MLP and a tied head."""

    def __init__(self, vocab: int = 17, width: int = 16, context: int = 8) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, width)
        self.wpe = torch.nn.Embedding(context, width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.fc = torch.nn.Linear(width, 2 * width)
        self.proj = torch.nn.Linear(2 * width, width)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t))
        xc = x - x.mean(-1, keepdim=True)
        h = xc / torch.sqrt((xc * xc).mean(-1, keepdim=True) + 1e-5)
        q, k, v = self.qkv(h).split(x.shape[-1], dim=-1)
        att = (q @ k.transpose(-2, -1)) / 4.0  # (B, T, T)
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        x = x + att @ v
        x = x + self.proj(torch.nn.functional.gelu(self.fc(x)))
        return x @ self.wte.weight.T  # tied head


def test_decoder_ops_replay_exactly_across_devices() -> None:
    def train(device: str, mode: str, logs: list[StepLog] | None) -> tuple[list[torch.Tensor], list[StepLog], int]:
        torch.manual_seed(0)
        model = _TinyDecoder().float()
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(round_to_grid(p, 19))
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=False)
        gen = torch.Generator().manual_seed(1)
        out, corrections = [], 0
        for t in range(4):
            idx = torch.randint(0, 17, (4, 8), generator=gen)
            with RoundedExecution(bits=19, device=get_device(device), mode=mode, step=t,
                                  replay_log=None if logs is None else logs[t]) as rx:
                opt.zero_grad()
                logits = model(idx[:, :-1])
                F.cross_entropy(logits.reshape(-1, 17), idx[:, 1:].reshape(-1)).backward()
                opt.step()
            out.append(rx.log)
            corrections += rx.stats["corrections"]
        return [p.detach().clone() for p in model.parameters()], out, corrections

    trainer, logs, _ = train("cpu", "record", None)
    ops = {s.op for log in logs for s in log.sites}
    assert {"aten.gelu.default", "aten.gelu_backward.default", "aten.embedding_dense_backward.default",
            "aten.bmm.default", "aten._softmax.default"} <= ops
    for auditor in ("emu:lanes8-butterfly", "emu:splitk8-tree"):
        replayed, _, corrections = train(auditor, "replay", logs)
        assert all(torch.equal(a, b) for a, b in zip(trainer, replayed))
