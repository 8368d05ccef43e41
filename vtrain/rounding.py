"""Rounded execution: a TorchDispatchMode that puts every floating op output on the grid (DESIGN.md §1.2-1.3).

    with RoundedExecution(bits=32, device=get_device("cpu"), mode="record", step=t) as rx:
        loss = loss_fn(model(x), y); loss.backward(); optimizer.step()
    rx.log, rx.stats

Forward, backward and optimizer ops all pass through the mode. Each aten op is classified by vtrain.ops:
exact ops run as they are; single IEEE ops run natively and are rounded; device-dependent ops are computed
by the Device, rounded, and (mode "record") logged, or (mode "replay") forced to the trainer's log.

Which values are logged (record mode). For a device-dependent output v with grid rounding r, let b be the
rounding boundary (midpoint of two grid neighbours) nearest to v, and w a band half-width:
- policy "bound": w = 2E, E the a-priori error bound of vtrain.bounds (two honest devices are each within
  E of the exact value, so within 2E of each other). v is logged when dist(v, b) < w. (Where a large matmul or
  convolution takes vtrain.prefilter's U >= E, the trainer logs with w = 2U instead, a wider band: E is not
  gathered at its candidates. See `UPPER_BAND`.) If w >= 1/8 of the
  grid spacing the entry is a value entry (which grid value of the band the trainer holds, as a residue,
  see vtrain.valuecode: with a band that wide the auditor cannot be sure which boundary a direction refers
  to); otherwise a direction entry. A value
  that vtrain.resolve certifies as computed exactly (every partial sum exact in any order: the same value
  on every device) is not logged, ties included: round-half-even settles it everywhere (stats
  "certified" counts them). An op that vtrain.grains proves exact as a whole, every element, has no band
  at all (stats "exact_sums").
- policy "tau" (the paper's): v is logged when |v - r| > tau * spacing, i.e. within (0.5 - tau) spacings
  of b, the spacing taken with the true binary exponent; direction entries only.

Replay: for a direction entry the auditor finds the boundary nearest to its own value v' and takes the
grid neighbour on the logged side; for a value entry it takes the value of its legitimate range (below)
that the residue names (vtrain.valuecode; one that names none is illegitimate). An entry is legitimate
when the value it imposes is the rounding of some value within the band of the auditor's own v':
round(v' - w') <= claimed <= round(v' + w'), with the auditor's own band w' (2E' for "bound", 0 where
the auditor certifies v' exact, (0.5 - tau) spacings for "tau"). For an honest trainer that always
holds, since its value was within 2E of the auditor's (and equal to it where either certifies).
Otherwise the trainer steered a value no honest device could have produced: IllegitimateLogEntryError.
Entries that agree with the auditor's own rounding are never illegitimate; the ones that change it are counted
as corrections.

Bands carry a relative slack of 2^-10 (see vtrain.bounds for how E itself is inflated).

Resolution "exact" (DESIGN.md §1.3b) replaces the log: every device-dependent output element becomes
RNE_grid(exact value), the same on every device with no log at all. An element whose value v lies
farther than E from every rounding boundary already rounds to that (the exact value is within E of v);
the others are "ambiguous". Of those, the ones vtrain.resolve certifies as computed exactly (every
partial sum provably exact in any order) need nothing more; the rest are recomputed exactly by
vtrain.resolve and correctly rounded. Under float32 work, the device-dependent ops are computed in float64
from the start, whose far smaller error leaves almost nothing ambiguous (vtrain.refine, stats "refined":
the outputs computed so). Composite ops are first decomposed into primitives (vtrain.canonical). Zeros
are made +0: the sign of an exact zero sum depends on the summation order.
Record mode computes the canonical values; replay has nothing to replay; plain skips the resolution
(the ablation: rounding alone, which diverges).
"""

from __future__ import annotations

import functools
import time
from typing import Any, NamedTuple

import numpy as np
import torch
from torch.autograd.graph import increment_version
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from vtrain import claims, draws, native_views, refine, spare, valuecode
from vtrain.accumulation import sole_gradient, sole_owners
from vtrain.prefilter import LineNorms, Prefilter, gather_pays
from vtrain.canonical import DECOMPOSITIONS
from vtrain.devices import Device
from vtrain.errors import UnsupportedOpError, VtrainError
from vtrain.grid import (GridOverflowError, check_bits, check_finite_range, grid_max, round_to_grid,
                         round_unchecked, spacing_below, spacings_np)
from vtrain.ops import OpClass, OpSpec, classify
from vtrain.roundlog import POLICIES, SiteLog, StepLog, dense_ternary_size, site_tag

MODES = ("record", "replay", "plain")
RESOLUTIONS = ("log", "exact")
BAND_SLACK = 1 + 2.0**-10
VALUE_FRACTION = 1 / 8  # a band this wide (in grid spacings) makes an entry a value entry
# The recording trainer's band where an output takes the pre-filter (vtrain.prefilter): 2U, U >= E the
# Cauchy-Schwarz bound its kernels filter with (DESIGN.md §1.3's "cheap valid upper bound"), in place of 2E
# gathered at U's candidates. The auditor checks with its own E, as ever. Every entry of E's log is in U's; each
# other one holds the trainer's own rounding, which the check accepts: the auditor's value lies within 2E <= 2U of
# the trainer's, so a direction entry (a band under 1/8 of a spacing) refers to the auditor's nearest boundary
# too, and a value entry's residue, whose width spans the trainer's wider band, names one value of the auditor's
# range (vtrain.valuecode). Gathering E at every candidate cost ~10 ms a step of GPT-2-tiny d_model 256's matmuls
# and of resnet-tiny width 32's convolutions; the logs grow by what U's looser band takes in (docs/benchmarks.md,
# session 51). False: E's band everywhere (the tests compare the two).
UPPER_BAND = True


class Near(NamedTuple):
    """An output rounded and its values near a rounding boundary: r, the candidate positions (flat), the
    unrounded values there (`held`: the filters read the output at its candidates only, so the recording
    trainer may round it in place), E there (None: the output has no bound; for the recording trainer where the
    pre-filter took the output, `UPPER_BAND`, the Prefilter, U read from its factors where the log is made), the
    op's full bounds where computed, and whether a value rounded off the grid (only in the exact resolution, where
    r is v rounded in place: see `RoundedExecution._fused_near`)."""

    r: torch.Tensor
    cand: torch.Tensor
    held: np.ndarray
    e_cand: torch.Tensor | Prefilter | None
    bounds: list | None
    bad: bool = False


class NonFiniteError(VtrainError):
    """NaN, inf or grid overflow in an op output: the run diverged."""

    def __init__(self, step: int, site: int, op: str, detail: str = ""):
        self.step, self.site, self.op = step, site, op
        super().__init__(f"step {step}: op #{site} ({op}) produced a non-finite or overflowing value: the run "
                         f"diverged{': ' + detail if detail else ''}. Lower the learning rate or check the data")


class TraceMismatchError(VtrainError):
    """The auditor's op trace differs from the one the trainer's log was recorded on."""

    def __init__(self, step: int, site: int, expected: str, got: str):
        self.step, self.site, self.expected, self.got = step, site, expected, got
        super().__init__(f"step {step}, op site {site}: the rounding log expects {expected} but the replay computed "
                         f"{got}; the log belongs to a different model, spec or step")


class IllegitimateLogEntryError(VtrainError):
    """A log entry imposes a value that no honest device could have produced (outside the band)."""

    def __init__(self, step: int, site: int, op: str, index: int,
                 why: str = "the auditor's value is outside the band in which the trainer could have been: the "
                            "trainer steered an unambiguous value"):
        self.step, self.site, self.op, self.index = step, site, op, index
        super().__init__(f"step {step}, op site {site} ({op}), element {index}: illegitimate rounding-log entry "
                         f"({why})")


def _describe(op: str, shape: tuple[int, ...]) -> str:
    return f"{op} {list(shape)}"


class RoundedExecution(native_views.ViewsPastModes, TorchDispatchMode):
    """Round every floating op output to the `bits`-bit grid; record or replay the rounding log."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in a Dynamo-disabling shim (two extra Python frames per
        # aten op, ~10 % of a small step). Rounded training never runs under torch.compile, so skip it.
        return False

    def __init__(self, *, bits: int, device: Device, policy: str = "bound", tau: float = 0.25,
                 mode: str = "record", replay_log: StepLog | None = None, step: int = 0,
                 measure_storage: bool = True, resolution: str = "log", grain_hints: dict | None = None,
                 seed: int | None = None):
        super().__init__()
        check_bits(bits)
        if resolution not in RESOLUTIONS:
            raise ValueError(f"resolution must be one of {RESOLUTIONS}, got {resolution!r}")
        if resolution == "exact" and mode == "replay":
            raise ValueError("resolution 'exact' has no log to replay: use mode 'record'")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if mode == "replay" and replay_log is None:
            raise ValueError("mode 'replay' needs replay_log")
        if not 0 <= tau < 0.5:
            raise ValueError(f"tau must be in [0, 0.5), got {tau}")
        self.bits, self.device, self.policy, self.tau, self.mode, self.step = bits, device, policy, tau, mode, step
        from vtrain import fused, fused_binary  # noqa: PLC0415 (numba's import: only processes that round pay it)
        self._fused = fused
        self._binary = fused_binary.binary
        self._limit = grid_max(bits)
        self.replay_log = replay_log
        self.exact = resolution == "exact" and mode == "record"
        self._plus = 0.0 if self.exact else -0.0  # what the fused kernels add to a rounding (see round_near)
        self.resolution = resolution
        self.measure_storage = measure_storage  # stats with log_bytes / dense_bytes / dense_zip_bytes
        # Which ops failed vtrain.grains' whole-op test lately (see `_exact_all`): kept by the caller across
        # steps (a TrainingSession's), or None to test every op every time.
        self.grain_hints = grain_hints
        # Random draws (dropout's masks, noise) come from this seed and the step, in the order the step draws them
        # (vtrain.draws); without one they are refused.
        self._stream = None if seed is None else draws.Stream(seed, step, bits)
        self._sites: list[SiteLog] = []
        self._offsets: list[int] = []  # where each logged site starts in the step's stream of rounded values
        self._counts = {"rounded": 0, "logged": 0, "logged_values": 0, "corrections": 0, "sites": 0, "ops": 0,
                        "checked": 0, "ambiguous": 0, "certified": 0, "refined": 0, "recomputed": 0,
                        "exact_sums": 0}
        self._exact_seconds = 0.0  # time spent in certificates and exact recomputation
        self._uppers: tuple[int, list | None] = (-1, None)  # (op count, its outputs' pre-filters): `_prefilter`
        self._norms: LineNorms | None = None  # the matmul and convolution operands' norms while the mode is entered
        self._scratch_bufs: dict[Any, np.ndarray] = {}  # (`_scratch`)
        self.by_op: dict[str, list[int]] = {}  # exact: op -> [checked, ambiguous, certified, refined, recomputed]
        self._seconds = 0.0
        self._t0 = 0.0
        self._derived: dict[str, int] | None = None

    # -- context ------------------------------------------------------------------------------------

    def __enter__(self) -> RoundedExecution:
        self._t0 = time.perf_counter()
        # TF32 matmuls/convolutions (on by default for cuDNN) carry 10-bit products: far outside the
        # float32 error bounds. Inside rounded execution float32 means IEEE float32. And cuDNN is off: its FFT
        # and Winograd convolutions are not sums of the products, which every error bound here assumes
        # (torch's own CUDA convolutions are: im2col and cuBLAS, or direct sums). Likewise NNPACK on the CPU, whose
        # float32 convolutions torch takes where oneDNN is off: 1.9x gamma_K sum|terms| measured on a 3x3 one
        # (tests/numerics/test_num_devices.py); oneDNN's and torch's im2col convolutions stay within it.
        backends = torch.backends
        self._cuda_flags = (backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32, backends.cudnn.enabled)
        backends.cuda.matmul.allow_tf32 = backends.cudnn.allow_tf32 = backends.cudnn.enabled = False
        self._nnpack = backends.nnpack.set_flags(False)[0]
        self._norms = LineNorms()  # (it holds operands: they go with it at the end)
        sole_owners()  # (measured once a process: see vtrain.accumulation)
        super().__enter__()  # (views skip the modes while this runs: native_views.ViewsPastModes)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        super().__exit__(exc_type, exc, tb)
        self._norms = None
        backends = torch.backends
        backends.cuda.matmul.allow_tf32, backends.cudnn.allow_tf32, backends.cudnn.enabled = self._cuda_flags
        backends.nnpack.set_flags(self._nnpack)
        self._seconds += time.perf_counter() - self._t0
        self._derived = None  # storage numbers are computed (once) on the first stats access after this
        if exc_type is None and self.mode == "replay" and self._counts["sites"] != len(self.replay_log.sites):
            nxt = self.replay_log.sites[self._counts["sites"]]
            raise TraceMismatchError(self.step, nxt.site, nxt.describe(), "the end of the step")

    @property
    def log(self) -> StepLog:
        if self.mode == "replay":
            return self.replay_log
        return StepLog(self._sites if self.mode == "record" else [], self.policy, self.bits)

    @property
    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self._counts)
        out["seconds"] = self._seconds
        out["exact_seconds"] = self._exact_seconds
        if self._derived is None and self.measure_storage:
            log = self.log
            dense, dense_zip = dense_ternary_size(self._counts["rounded"], self._offsets, log)
            self._derived = {"log_bytes": len(log.to_bytes()) if self.mode != "plain" else 0,
                             "dense_bytes": dense, "dense_zip_bytes": dense_zip}
        out.update(self._derived or {})
        out["policy"], out["mode"], out["bits"], out["device"] = self.policy, self.mode, self.bits, self.device.name
        out["resolution"] = self.resolution
        if self.by_op:
            out["by_op"] = {name: list(t) for name, t in self.by_op.items()}
        return out

    # -- dispatch -----------------------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        spec = classify(func, args, kwargs)
        if spec.cls is OpClass.EXACT:
            out = func(*args, **kwargs)
            if spec.integer and any(t is not None for t in _outputs(out)[1]):
                raise UnsupportedOpError(spec.name, "it returned floating values from integer operands, which no "
                                         "class of vtrain.ops covers; convert the operands to the work dtype first")
            if spec.constants and self._off_grid(args, kwargs):  # (in-place ops return args[0], rounded here)
                self._counts["ops"] += 1  # (counted as the rounded op it has become: errors name it by number)
                return _map_floats(out, lambda t: self._round_into(t, spec))
            return out
        if spec.cls is OpClass.COMPOSITE:  # (its ops are counted, rounded and logged one by one)
            return spec.decomposed(self.call, *args, **kwargs)
        if spec.cls is OpClass.DRAW:  # (values on the grid, or products of them dispatched through `call`)
            return draws.draw(func, self.call, self._stream, args, kwargs)
        self._counts["ops"] += 1
        if spec.cls is OpClass.IEEE:
            try:  # (an in-place op's output, and autograd's sum into a sole gradient, are args[0] itself)
                out = self._binary(func, args, kwargs, self.bits - 9, self._limit, sole_gradient(func, args))
            except GridOverflowError as exc:  # (raised for a value off the grid where it was written in place)
                raise self._diverged(spec, str(exc)) from None
            if out is not None:  # a large binary op, computed and rounded in one pass
                self._counts["rounded"] += out.numel()
                return out
            # An IEEE op's (or its decomposition's) output is a fresh tensor: rounded in place.
            if spec.decomposed is not None:
                out = spec.decomposed(*args, **kwargs)
                self._round_into(out, spec)
                if spec.inplace:
                    args[0].copy_(out)
                    return args[0]
                return out
            out = func(*args, **kwargs)
            if spec.inplace:
                self._round_into(args[0], spec)
                return out
            return _map_floats(out, lambda t: self._round_into(t, spec))
        return self._device_op(func, spec, args, kwargs)

    def _off_grid(self, args: tuple, kwargs: dict) -> bool:
        """Whether a number among the arguments (a Python number, or a one-value tensor on the CPU, where torch puts
        the numbers it wraps) is not a grid value (see ops._CONSTANTS). Values beyond the grid's range are left as
        they are, as infinities: a mask's -inf or torch.finfo(dtype).min before a softmax. A NaN is off the grid,
        so that rounding the output names the op that wrote it. (One-value tensors elsewhere are op outputs, on the
        grid already: reading them would wait for their device.)"""
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                if a.dim() or a.dtype is torch.bool or not a.is_cpu:
                    continue
                a = a.item()
            elif not isinstance(a, (int, float)) or isinstance(a, bool):
                continue
            v = float(a)
            if not abs(v) > self._limit and \
                    self._fused.round_scalar(v, self.bits - 9, self.bits == 32) != v:
                return True
        return False

    def count_rounded(self, elements: int, ops: int) -> None:
        """Account for `ops` IEEE op outputs of `elements` values in all rounded outside the dispatch path
        (vtrain.fused_optim), so the step's statistics read as if they had been dispatched."""
        self._counts["rounded"] += elements
        self._counts["ops"] += ops

    def _trivial(self, t: torch.Tensor) -> bool:
        # float32 work at bits = 32: every float32 is a grid value and no rounding can differ.
        return t.dtype == torch.float32 and self.bits == 32

    def _round(self, t: torch.Tensor, spec: OpSpec) -> torch.Tensor:
        if self._trivial(t):
            if t.numel():
                self._check_finite(t, spec)
            return t
        self._counts["rounded"] += t.numel()
        if t.numel() and self._fused.usable(t):
            out = spare.take(t)
            if self._fused.round_into(self._fused.flat(t), self._fused.flat(out), self.bits - 9, self._limit) < 0:
                return out
            # out of range: the torch path below raises the error that names the value
        try:
            return round_to_grid(t, self.bits)
        except GridOverflowError as exc:
            raise self._diverged(spec, str(exc)) from None

    def _done_with(self, site: int, floats: list) -> bool:
        """Whether a device op's output at `site` is not read unrounded after its rounding: plain rounding reads
        none; a replay reads one at its log entries (and E there, which may read any of the op's outputs), so
        only a lone output whose site has no entries. (The recording trainer's kernels keep the unrounded
        values at their candidates: see `_in_place`.)"""
        if self.mode == "plain":
            return True
        if self.mode != "replay" or sum(f is not None for f in floats) != 1:
            return False
        sites = self.replay_log.sites
        return site < len(sites) and sites[site].num_entries == 0

    @staticmethod
    def _in_place(spec: OpSpec, args: tuple, floats: list, v: torch.Tensor) -> bool:
        """Whether the recording trainer may round output v in place (`_fused_near`): a tensor of its own
        (`_fresh`), and the op's only floating output, or any output of a matmul or a convolution, whose
        bounds read the operands only (a layer norm's could read the mean it output beside v)."""
        return (spec.bound_upper is not None or sum(f is not None for f in floats) == 1) and _fresh(v, args)

    def _diverged(self, spec: OpSpec, detail: str) -> NonFiniteError:
        """The error naming this step and the op being dispatched (`spec`), whose output left the grid."""
        return NonFiniteError(self.step, self._counts["ops"] - 1, spec.name, detail)

    def _check_finite(self, t: torch.Tensor, spec: OpSpec) -> None:
        try:
            check_finite_range(t, self.bits)
        except GridOverflowError as exc:
            raise self._diverged(spec, str(exc)) from None

    def _round_into(self, t: torch.Tensor, spec: OpSpec) -> torch.Tensor:
        """Round t in place (t returned)."""
        if t.is_floating_point() and not self._trivial(t) and t.numel() and self._fused.usable(t):
            if self._fused.round_in_place(self._fused.flat(t), self.bits - 9, self._limit) < 0:
                self._counts["rounded"] += t.numel()
                return t
            # out of range: `_round` below raises the error that names the op
        if t.is_floating_point():
            r = self._round(t, spec)
            if r is not t:
                t.copy_(r)
        return t

    def call(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one aten op as this mode would if it were dispatched to it (rounded, and resolved if need be):
        the primitives of a decomposition, and ops of code that computes the rest itself (vtrain.fused_optim;
        call it with dispatch modes off, or the op would come through this mode a second time)."""
        return self.__torch_dispatch__(func, (), args, kwargs)

    def _device_op(self, func: Any, spec: OpSpec, args: tuple, kwargs: dict) -> Any:
        if self.resolution == "exact":  # the decomposition defines the op, resolved or not (plain)
            decomposed = DECOMPOSITIONS.get(func)
            if decomposed is not None:
                return decomposed(self.call, *args, **kwargs)
        op = spec.functional or func
        if self.exact and refine.widens(args, kwargs):  # float32 work's, in float64 (vtrain.refine)
            wide = refine.widen(args)
            out = self.device.execute(op, wide, kwargs)  # (cuDNN is off in here: `__enter__`)
            # the correctly rounded values are grid values at bits <= 32: float32s (an in-place op's result
            # lands in the float64 copy of its operand, and from there in the operand)
            out = self._canonical(func, spec, wide, kwargs, out, widened=True)
            return args[0].copy_(out) if spec.inplace else _map_floats(out, lambda t: t.to(torch.float32))
        out = self.device.execute(op, args, kwargs)
        if self.exact:
            return self._canonical(func, spec, args, kwargs, out)
        outs, floats = _outputs(out)
        bounds: list[torch.Tensor | None] | None = None
        held: list = [None]  # (a replay's full bounds, once computed: `_replay_bound`)
        for i, v in enumerate(floats):
            if v is None:
                continue
            if self._trivial(v):  # nothing to round, so no site: trainer and auditor skip it alike
                outs[i] = self._round(v, spec)
                continue
            site = self._counts["sites"]
            self._counts["sites"] += 1
            offset = self._counts["rounded"]
            if self.mode == "record" and self.policy == "bound":
                near = self._round_near(spec, args, kwargs, floats, i, 2 * BAND_SLACK, bounds,
                                        self._in_place(spec, args, floats, v))
                r, cand, values, e_cand, bounds = near[:5]  # (values: v's at the candidates)
            else:
                # In place where nothing reads v unrounded afterwards and nothing else sees its memory: 1.0
                # against 1.7 ms a million values just computed, out of place into a kept buffer (no second
                # buffer's lines to fetch and write back). The in-place kernel leaves values off the grid as
                # they were, so the error still names them.
                done = self._done_with(site, floats) and _fresh(v, args)
                r = self._round_into(v, spec) if done else self._round(v, spec)
            if self.mode == "plain":
                outs[i] = r
                continue
            shape = tuple(v.shape)
            certify = functools.partial(self._certified, func, spec, args, kwargs, floats, i) \
                if self.policy == "bound" else None
            if self.mode == "record":
                # (the candidates, E and the band there in numpy: torch's calls on their few values cost ~5 us
                # each in a training step, numpy's ~1)
                if self.policy == "bound":
                    idx = cand.cpu().numpy()
                    # (None: no band at all; a Prefilter: U at the candidates, from its factors; 2 BAND_SLACK is
                    # exact in float32 too, so float32 work's band is the float32 product, as torch's)
                    e_at = e_cand if e_cand is None or isinstance(e_cand, Prefilter) else e_cand.cpu().numpy()
                    entry = self._find_entries(site, spec.name, shape, values, r, idx, e_at, 2 * BAND_SLACK,
                                               certify)
                else:
                    band = spacing_below(r.reshape(-1), self.bits) * (0.5 - self.tau)
                    cand = self._candidates(v, r, band)
                    idx = cand.cpu().numpy()
                    # (the paper's band itself, times one)
                    entry = self._find_entries(site, spec.name, shape, _at(v, idx), r, idx, band[cand].cpu().numpy(),
                                               1.0)
                self._sites.append(entry)
                self._offsets.append(offset)
                self._counts["logged"] += entry.num_entries
                self._counts["logged_values"] += int(entry.val_pos.size)
            else:
                entry = self._expect_site(site, spec.name, shape)
                self._offsets.append(offset)
                if entry.num_entries:
                    bound_at = functools.partial(self._replay_bound, spec, args, kwargs, floats, i, held) \
                        if self.policy == "bound" else None
                    r = self._apply_entries(entry, spec.name, v, r, bound_at, certify)
            outs[i] = r
        _release(floats, outs, args)
        if spec.inplace:
            args[0].copy_(outs[0])
            return args[0]
        return tuple(outs) if isinstance(out, (tuple, list)) else outs[0]

    # -- exact resolution ---------------------------------------------------------------------------

    def _canonical(self, func: Any, spec: OpSpec, args: tuple, kwargs: dict, out: Any, widened: bool = False) -> Any:
        """The op's outputs `out` (computed in float64 from float32 work's inputs where `widened`), each element
        the correctly rounded exact value."""
        op = spec.functional or func
        outs, floats = _outputs(out)
        bounds: list[torch.Tensor | None] | None = None
        for i, v in enumerate(floats):
            if v is None:
                continue
            self._counts["sites"] += 1
            self._counts["checked"] += v.numel()
            tally = self.by_op.setdefault(spec.name, [0, 0, 0, 0, 0])
            tally[0] += v.numel()
            if widened:
                self._counts["refined"] += v.numel()
                tally[3] += v.numel()
            start = time.perf_counter()
            fused = self._fused_near(spec, args, kwargs, floats, i, BAND_SLACK, bounds,
                                     self._in_place(spec, args, floats, v))
            if fused is not None and fused.bad:
                # v was rounded in place but for its values off the grid, and the settling below reads the
                # others: the op runs again. (Any honest device's output serves: the exact values are the same.)
                v = floats[i] = _outputs(self.device.execute(op, args, kwargs))[1][i]
                fused = None
            any_bad = False
            if fused is None:
                self._counts["rounded"] += v.numel()
                r = round_unchecked(v, self.bits).contiguous()
                # A device whose value (or a float32 partial sum) overflowed may still have a finite exact
                # value that another device computes: such elements are settled exactly like ambiguous ones
                # (the resolver raises when the exact value itself overflows).
                if r.numel():  # one pass in the common case; NaN fails both comparisons
                    lo, hi = torch.aminmax(r)
                    any_bad = not (-self._limit <= lo.item() and hi.item() <= self._limit)
                if any_bad:
                    bad = (~torch.isfinite(r)) | (r.abs() > self._limit)
                    r[bad] = 0.0
            if v.numel():
                if fused is not None:
                    r, cand, held, e_cand, bounds = fused[:5]
                else:
                    cand, held, e_cand, bounds = self._near(spec, args, kwargs, floats, i, r, BAND_SLACK, bounds)[1:5]
                if e_cand is None:  # an output without an error bound is an exact count
                    if any_bad:
                        raise self._diverged(spec, "an exact count overflowed")
                    cand, held = cand[:0], held[:0]
                pos, e_pos, held_pos = cand, e_cand, held
                if cand.numel():
                    pos, e_pos, held_pos = self._ambiguous(held, r, cand, e_cand)
                if any_bad:
                    pos = torch.cat([pos, bad.reshape(-1).nonzero().squeeze(1)]).unique()
                    e_pos = self._bound_at(spec, args, kwargs, floats, i, pos, full=bounds)
                    held_pos = None  # (v's values off the grid are not held)
                if pos.numel():
                    self._counts["ambiguous"] += pos.numel()
                    tally[1] += pos.numel()
                    # Certificates only spare the exact recomputation its work, and certify nothing in most
                    # matmuls (all of GPT-2-tiny's at d_model 256, where sums have all theirs certified): where
                    # they failed lately at this op, skipped. Either way each value is the correctly rounded one.
                    key, exact = (self._counts["ops"], i, spec.name, "certificates"), None
                    if self._worth_trying(key):
                        exact = self._certified(func, spec, args, kwargs, floats, i, pos, e_pos, held_pos)
                        # (in numpy from here: torch's calls on these few values cost ~5 us each in a step)
                        exact = None if exact is None else exact.cpu().numpy()
                        self._tried(key, exact is not None and bool(exact.any()))
                    if exact is not None:
                        if any_bad:  # an exactly computed overflow is still an overflow: the resolver says so
                            exact = exact & ~bad.reshape(-1)[pos].cpu().numpy()
                        certified = int(exact.sum())
                        self._counts["certified"] += certified
                        tally[2] += certified
                        if certified:
                            pos = pos[torch.from_numpy(~exact).to(pos.device)]
                if pos.numel():
                    self._counts["recomputed"] += pos.numel()
                    tally[4] += pos.numel()
                    values = self._resolve(op, spec, args, kwargs, i, pos) + 0.0
                    if self._fused.usable(r):  # (numpy's scatter: the values are grid values, exact in r's dtype)
                        self._fused.flat(r)[pos.numpy()] = values
                        increment_version(r)  # (as torch's own write would: caches key on it)
                    else:
                        r.view(-1)[pos] = torch.from_numpy(values).to(device=r.device, dtype=r.dtype)
                self._exact_seconds += time.perf_counter() - start
            # -0 + 0 = +0: one zero for every summation order (the fused kernels added it as they rounded)
            outs[i] = r.add_(0.0) if r.numel() and fused is None else r
        _release(floats, outs, args)
        if spec.inplace:
            args[0].copy_(outs[0])
            return args[0]
        return tuple(outs) if isinstance(out, (tuple, list)) else outs[0]

    def _certified(self, func: Any, spec: OpSpec, args: tuple, kwargs: dict, floats: list, i: int,
                   pos: torch.Tensor, e: torch.Tensor | np.ndarray,
                   held: np.ndarray | None = None) -> torch.Tensor | None:
        """Where output i at flat positions `pos` (E there: `e`, float64 if numpy; v's unrounded values there:
        `held`, if known) is provably its exact value whatever order any device summed in (vtrain.resolve's
        certificates), or None: there every honest device holds the same value, so its rounding is nobody's
        choice (no log entry, no exact recomputation)."""
        return _resolve_module().certify(spec.functional or func, args, kwargs, floats, e, i, pos, held)

    def _round_near(self, spec: OpSpec, args: tuple, kwargs: dict, floats: list, i: int, factor: float,
                    bounds: list | None, in_place: bool = False) -> Near:
        """Output i rounded, its candidates for a band of factor * E and E there (`Near`): in one fused pass
        where the kernels take it (in place where `in_place`). Raises for a value off the grid."""
        near = self._fused_near(spec, args, kwargs, floats, i, factor, bounds, in_place)
        if near is not None:
            return near
        r = self._round(floats[i], spec)  # raises for a value off the grid (left in v as it was, if rounded in place)
        return self._near(spec, args, kwargs, floats, i, r, factor, bounds)

    def _fused_near(self, spec: OpSpec, args: tuple, kwargs: dict, floats: list, i: int, factor: float,
                    bounds: list | None, in_place: bool = False) -> Near | None:
        """`_round_near` by the fused kernels (counting the rounded values), or None where they cannot take
        the output or a value is off the grid (NaN, infinite, beyond the largest grid value). The exact
        resolution's rounding comes with +0 for -0.

        `in_place`: v itself is rounded, for an output that nothing reads afterwards but at its candidates
        (their values come with the result). Against rounding into a kept buffer, 0.61 against 0.78 ms for a
        (16, 128, 128) attention product fresh from the matmul, 2.2 against 2.5 ms for a 1024 x 1024 output.
        A value off the grid is then left in v as it was, so that `_round` names it (None); the exact
        resolution, which settles such values exactly, gets the result with `Near.bad` instead, and runs the
        op again (`_canonical`), since v's other values are gone."""
        v, fused, pre = floats[i], self._fused, None
        if not (v.numel() and fused.usable(v)):
            return None
        out = v if in_place else spare.take(v)
        fv = fused.flat(v)  # (v's and out's numpy views, made once: ~5 us each in a training step)
        fo = fv if out is v else fused.flat(out)
        cand, held = self._scratch(v.numel(), np.int64), self._scratch(v.numel(), fv.dtype)
        e_cand: torch.Tensor | None = None
        if spec.exact_all is not None and self._exact_all(spec, args, kwargs, floats, i):
            # every element is its exact value on every device (vtrain.grains): no band, no candidates
            count, bad = 0, self._round_alone(fv, fo)
            self._counts["exact_sums"] += v.numel() if bad < 0 else 0
        else:
            inline = rows = None
            if bounds is None and self._cast32(v):
                if spec.bound_inline:
                    inline = spec.bound_inline(args, kwargs, floats)
                elif spec.bound_rows:
                    rows = spec.bound_rows(args, kwargs, floats)
            if inline is not None or rows is not None:
                e_all = self._scratch(v.numel(), np.float64, "band")  # (the kernel writes E at the candidates)
                if inline is not None:  # a small matmul's E, computed as it rounds (vtrain.inline)
                    count, bad = fused.round_near_mm(fv, inline.a, inline.b, inline.bias, inline.alpha,
                                                     inline.beta, inline.scale, inline.floor, factor, self._limit,
                                                     fo, cand, held, e_all, self._plus)
                else:  # a softmax's E, computed row by row as it rounds (vtrain.bounds.ROWS)
                    count, bad = rows(fv, factor, self._limit, fo, cand, held, e_all, self._plus)
                e_cand = torch.from_numpy(e_all[:count].copy())
            elif bounds is None and spec.bound_relative is not None and self._cast32(v):
                # a function's E, computed as it rounds
                k, a, c, f = spec.bound_relative(v.dtype)
                count, bad = fused.round_near_relative(fv, k, a, c, f, factor, self._limit, fo, cand, held,
                                                       self._plus)
                e_cand = torch.from_numpy(fused.relative_at(held[:count], k, a, c, f))
            else:
                pre = self._prefilter(spec, args, kwargs, floats, i) if bounds is None else None
                if pre is not None:  # the matmul pre-filter (vtrain.prefilter)
                    count, bad = self._kernel_near(v, pre, factor, fv, fo, cand, held)
                else:
                    bounds = bounds if bounds is not None else spec.bound(args, kwargs, floats)
                    e = bounds[i]
                    if e is None:  # an output without a bound (an exact count)
                        count, bad = 0, self._round_alone(fv, fo)
                    else:
                        if e.numel() == 1:
                            e = e.reshape(1)
                        elif e.shape != v.shape or not e.is_contiguous():  # (most bounds come in the output's shape)
                            e = e.expand(v.shape).contiguous()
                        count, bad = self._kernel_near(v, e, factor, fv, fo, cand, held)
                        # E at the candidates gathered in numpy: a fraction of torch's indexing cost on a few values
                        e_cand = torch.from_numpy(fused.flat(e)[cand[:count]]) if e.numel() > 1 \
                            else e.expand(count)
        if bad >= 0 and not (in_place and self.exact):
            return None
        if bad < 0:  # (`Near.bad`: the op runs again, and its values are counted there)
            self._counts["rounded"] += v.numel()
        found, values = torch.from_numpy(cand[:count].copy()), held[:count].copy()
        if pre is not None:
            return self._near_pre(spec, args, kwargs, floats, i, out, found, values, pre, self._cast32(v), bad >= 0)
        return Near(out, found, values, e_cand, bounds, bad >= 0)

    def _scratch(self, n: int, dtype: Any, use: str = "") -> np.ndarray:
        """n values of dtype from a buffer kept for the step (one for each `use`): where the fused kernels write an
        output's candidates and E there (room for every value; a few hundred come, as a rule), which `_fused_near`
        copies out before the next op can write there. Fresh, two such arrays per device op took ~20 us each at
        GPT-2-tiny d_model 256 (6 MB: mapped anew every time), 4 ms a step."""
        buf = self._scratch_bufs.get((use, dtype))
        if buf is None or buf.size < n:
            buf = self._scratch_bufs[use, dtype] = np.empty(n, dtype)
        return buf[:n]

    def _exact_all(self, spec: OpSpec, args: tuple, kwargs: dict, floats: list, i: int) -> bool:
        """spec.exact_all for output i, skipped where it failed lately at this op of the step (`_worth_trying`).
        Skipping it never changes a result, only what it costs: the band's candidates are then certified one
        by one, as they would be without vtrain.grains. A test costs ~10-30 us on a small model, and most ops
        (any dot product over FP32-grid values) always fail."""
        key = (self._counts["ops"], i, spec.name)
        if not self._worth_trying(key):
            return False
        passed = spec.exact_all(args, kwargs, floats, i)
        self._tried(key, passed)
        return passed

    def _worth_trying(self, key: tuple) -> bool:
        """Whether to run the speed-only test `key` (this op's position in the step, output, name, and which
        test) at this step: a test that failed f times running is next run 2^(f-1) steps after its last
        failure (at most 16). Always, without hints."""
        if self.grain_hints is None:
            return True
        failures, last = self.grain_hints.get(key, (0, 0))
        return not failures or self.step - last >= min(1 << (failures - 1), 16)

    def _tried(self, key: tuple, passed: bool) -> None:
        """Remember how the test `key` went (`_worth_trying`): a pass starts its schedule over."""
        hints = self.grain_hints
        if hints is None:
            return
        if passed:
            hints.pop(key, None)
        else:
            hints[key] = (hints.get(key, (0, 0))[0] + 1, self.step)

    def _round_alone(self, fv: np.ndarray, fo: np.ndarray) -> int:
        """v rounded into out (their flat views fv and fo; fo fv itself: in place) for an output with no band (an
        exact count, or exact sums), with the exact resolution's +0 for -0: the first position off the grid, or
        -1."""
        fused, m = self._fused, self.bits - 9
        if fo is fv:
            bad = fused.round_in_place(fv, m, self._limit)
        else:
            bad = fused.round_into(fv, fo, m, self._limit)
        if self.exact:  # (the kernels below do it as they round; out is fresh, so no cache keys on its version)
            fo += 0.0
        return bad

    def _kernel_near(self, v: torch.Tensor, e: torch.Tensor | Prefilter, factor: float, fv: np.ndarray,
                     fo: np.ndarray, cand: np.ndarray, held: np.ndarray) -> tuple[int, int]:
        """v rounded into out (their flat views fv and fo, which may be fv), and in cand[:count] and held[:count]
        the candidate positions for a band of factor * e and v's values there: (count, the first bad position or
        -1)."""
        fused = self._fused
        if isinstance(e, Prefilter):
            if self._cast32(v):  # the kernel builds U as it goes
                # (and drops the sums with no nonzero term as it goes: `_settle` need not)
                return fused.round_near_outer(fv, e.rows, e.cols, e.add, factor, self._limit, fo, cand, held,
                                              self._plus, e.support)
            e = e.upper()
        return fused.round_near(fv, fused.flat(e), factor, self.bits - 9, self._limit, fo, cand, held, self._plus)

    def _prefilter(self, spec: OpSpec, args: tuple, kwargs: dict, floats: list, i: int) -> Prefilter | None:
        """Output i's norm pre-filter (vtrain.prefilter), where the op has one and it applies: built for all
        the op's outputs at the first one asked, so that a convolution's backward reads its operands once."""
        if spec.bound_upper is None:
            return None
        op = self._counts["ops"]  # (one count per dispatched op: the key of this op's pre-filters)
        if self._uppers[0] != op:
            self._uppers = (op, spec.bound_upper(args, kwargs, floats, self._norms))
        pres = self._uppers[1]
        return None if pres is None else pres[i]

    def _cast32(self, v: torch.Tensor) -> bool:
        """Float64 work at bits = 32, rounded by the hardware cast: where the kernels that build the band as
        they go take v (fused.round_near_outer for the pre-filter, fused.round_near_mm for small matmuls,
        fused.round_near_relative for functions of the output, the softmax family's of bounds.ROWS)."""
        return v.dtype is torch.float64 and self.bits == 32

    def _candidates(self, v: torch.Tensor, r: torch.Tensor, band: torch.Tensor) -> torch.Tensor:
        """Flat positions where |v - r| + band >= half the spacing below r: a superset of the values within
        `band` (flat) of a rounding boundary, since the nearest boundary is at least that far away. (In
        place on the temporaries: these passes run over every value of every device op.)"""
        half = spacing_below(r.reshape(-1), self.bits).mul_(0.5)
        return torch.sub(v.reshape(-1), r.reshape(-1)).abs_().add_(band).ge_(half).nonzero().squeeze(1)

    def _near(self, spec: OpSpec, args: tuple, kwargs: dict, floats: list, i: int, r: torch.Tensor, factor: float,
              bounds: list | None) -> Near:
        """r with its candidate positions for a band of factor * E, v's values and E there (None: no bound),
        and the op's bounds (`Near`), v and r apart.

        E is computed everywhere, once per op call, except for large matmuls: there the pre-filter of
        vtrain.prefilter finds the candidates and E is taken at them only (`_settle`). (Small matmuls keep
        the full bound: the exact ties of quantised and few-term sums are candidates whatever the bound.)"""
        v = floats[i]
        if bounds is None:
            pre = self._prefilter(spec, args, kwargs, floats, i)
            if pre is not None:
                cand = self._candidates(v, r, pre.upper().reshape(-1) * factor)
                return self._near_pre(spec, args, kwargs, floats, i, r, cand, _at(v, cand.cpu().numpy()), pre)
            bounds = spec.bound(args, kwargs, floats)
        if bounds[i] is None:
            return Near(r, torch.zeros(0, dtype=torch.long, device=v.device), _at(v, np.zeros(0, np.int64)), None,
                        bounds)
        e = bounds[i].expand(v.shape).reshape(-1)
        cand = self._candidates(v, r, e * factor)
        return Near(r, cand, _at(v, cand.cpu().numpy()), e[cand], bounds)

    def _near_pre(self, spec: OpSpec, args: tuple, kwargs: dict, floats: list, i: int, r: torch.Tensor,
                  cand: torch.Tensor, held: np.ndarray, pre: Prefilter, dropped: bool = False,
                  bad: bool = False) -> Near:
        """`Near` from the pre-filter's candidates: with E there (`_settle`), or for the recording trainer's log
        (`UPPER_BAND`) with the pre-filter itself, whose factors give U there (no operand read: `_find_entries`).
        (Only the recording trainer's bound policy and the exact resolution come here.)"""
        if self.exact or not UPPER_BAND:
            return Near(r, *self._settle(spec, args, kwargs, floats, i, cand, held, pre, dropped), bad)
        cand, held = self._nonzero(pre, cand, held, dropped)
        return Near(r, cand, held, pre, None, bad)

    @staticmethod
    def _nonzero(pre: Prefilter, cand: torch.Tensor, held: np.ndarray,
                 dropped: bool) -> tuple[torch.Tensor, np.ndarray]:
        """The candidates (and v's values there) whose sum has a nonzero term (prefilter.Prefilter), unless the
        kernel `dropped` the others already."""
        if pre.nonzero is not None and cand.numel() and not dropped:
            keep = pre.nonzero(cand)
            cand, held = cand[keep], held[keep.cpu().numpy()]
        return cand, held

    def _settle(self, spec: OpSpec, args: tuple, kwargs: dict, floats: list, i: int, cand: torch.Tensor,
                held: np.ndarray, pre: Prefilter,
                dropped: bool = False) -> tuple[torch.Tensor, np.ndarray, torch.Tensor, list | None]:
        """(the pre-filter's candidates, v's values there (`held`, given for them), E at them, the full bounds
        or None). Candidates whose sum has no nonzero term are dropped (E could not make them candidates, see
        prefilter.Prefilter), unless the kernel `dropped` them already; E at the others is gathered where that
        pays, else taken from the full bound (which reads the operands only: v may be rounded by now). Either
        way the decisions that follow (which candidates lie within the band) use E itself; U only chose where
        to look."""
        cand, held = self._nonzero(pre, cand, held, dropped)
        v = floats[i]
        if cand.numel() == 0:  # nothing near a boundary: no E to gather
            return cand, held, torch.zeros(0, dtype=v.dtype, device=v.device), None
        if gather_pays(spec.name, cand.numel(), v.numel()):
            return cand, held, spec.bound_at(args, kwargs, floats, i, cand), None
        bounds = spec.bound(args, kwargs, floats)
        return cand, held, bounds[i].expand(v.shape).reshape(-1)[cand], bounds

    def _ambiguous(self, held: np.ndarray, r: torch.Tensor, cand: torch.Tensor,
                   e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """The candidates (flat positions `cand` of output r, the unrounded values there `held`, E there `e`)
        that lie within the band BAND_SLACK E of a rounding boundary, ties included: (their positions, E there,
        their values). (Selected in numpy: torch's boolean indexing of the three cost ~2.6 ms a step more at
        GPT-2-tiny d_model 256, ~57 calls.)"""
        idx, e_np = cand.cpu().numpy(), e.cpu().numpy()
        within = self._classify(held, _at(r, idx), e_np * BAND_SLACK, inclusive=True)[1]
        pos = torch.from_numpy(idx[within]).to(cand.device)
        return pos, torch.from_numpy(e_np[within]).to(e.device), held[within]

    def _resolve(self, op: Any, spec: OpSpec, args: tuple, kwargs: dict, i: int, pos: torch.Tensor) -> np.ndarray:
        try:
            return _resolve_module().resolver_for(op)(args, kwargs, i, pos.cpu().numpy(), self.bits)
        except GridOverflowError as exc:
            raise self._diverged(spec, str(exc)) from None

    # -- record -------------------------------------------------------------------------------------

    def _bound_at(self, spec: OpSpec, args: tuple, kwargs: dict, floats: list, i: int, pos: torch.Tensor,
                  full: list | None = None) -> torch.Tensor:
        """The error bound E of output i at flat positions `pos` (gathered when that is much cheaper)."""
        v = floats[i]
        if full is None and spec.bound_at is not None and gather_pays(spec.name, pos.numel(), v.numel()):
            return spec.bound_at(args, kwargs, floats, i, pos)
        full = full if full is not None else spec.bound(args, kwargs, floats)
        if full[i] is None:  # an output without an error bound (an exact count): nothing is ambiguous
            return torch.zeros(pos.numel(), dtype=v.dtype, device=v.device)
        return full[i].expand(v.shape).reshape(-1)[pos]

    def _find_entries(self, site: int, op: str, shape: tuple[int, ...], held: np.ndarray, r: torch.Tensor,
                      idx: np.ndarray, e: np.ndarray | Prefilter | None, factor: float,
                      certify: Any = None) -> SiteLog:
        """The log entries of one output: the candidates (flat positions idx, see _candidates; `held`: the
        unrounded values there) within the band factor * e (e: E at them, or U from a Prefilter, `UPPER_BAND`;
        None: no band) of a boundary, less those `certify` (with e at them) proves exact: an exact tie of a
        quantised sum is a tie on every device, and round-half-even settles it."""
        if idx.size == 0 or e is None:
            return SiteLog(site, op, shape)
        pos, vv, rr, ww, e, near_lo, wide = self._logged(held, r, idx, e, factor)
        if not pos.size:
            return SiteLog(site, op, shape)
        exact = None
        if certify is not None:
            # (gathered in numpy: torch indexing costs ~20 us a call here; the certifiers read numpy anyway)
            exact = certify(torch.from_numpy(pos), e, vv)
            if exact is not None:
                exact = exact.cpu().numpy()
                certified = int(np.count_nonzero(exact))
                self._counts["certified"] += certified
                if certified == pos.size:  # (the common outcome: exact ties, all certified)
                    return SiteLog(site, op, shape)
        return SiteLog(site, op, shape, *valuecode.entries(pos, vv, rr, ww, near_lo, wide, exact,
                                                           self.policy == "bound", self.bits))

    def _logged(self, held: np.ndarray, r: torch.Tensor, idx: np.ndarray, e: np.ndarray | Prefilter,
                factor: float) -> tuple[np.ndarray, ...]:
        """The candidates (flat positions idx of output r, `held` there) within the band factor * e of a boundary,
        in idx's order: (their positions, held, r, the band, e, whether the boundary below r is the nearer one,
        whether the band makes a value entry). One compiled call where the kernels take them (fused.logged: the
        ~20 numpy and torch calls below cost ~100 us a matmul in a training step), else these: the same IEEE
        operations in the same dtype, so the same answers."""
        fused = self._fused
        outer = isinstance(e, Prefilter)
        if fused.usable(r):
            fast = fused.logged(held, fused.flat(r), idx, (e.rows, e.cols, e.add) if outer else e, factor,
                                self.bits - 9, VALUE_FRACTION)
            if fast is not None:
                return fast
        e = e.at(torch.from_numpy(idx)).numpy() if outer else e
        ww = e * factor
        rr = _at(r, idx)
        near_lo, within, wide = self._classify(held, rr, ww)
        sel = np.flatnonzero(within)
        return idx[sel], held[sel], rr[sel], ww[sel], e[sel], near_lo[sel], wide[sel]

    def _classify(self, vv: np.ndarray, rr: np.ndarray, ww: np.ndarray,
                  inclusive: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For values vv, their roundings rr and the bands ww there: (whether the boundary below r is the
        nearer one, whether that one lies strictly within ww (`inclusive`: or at ww), whether ww reaches
        VALUE_FRACTION of the smaller grid spacing). One compiled call where the kernels take them
        (fused.classify), else these numpy operations: the same IEEE operations in the same dtype, so the
        same decisions."""
        fast = self._fused.classify(vv, rr, ww, self.bits - 9, VALUE_FRACTION, inclusive)
        if fast is not None:
            return fast
        diff, down, up = self._geometry(vv, rr)
        d_lo = diff + down * 0.5  # distance to the boundary below r
        d_hi = up * 0.5 - diff  # distance to the boundary above r
        dist = np.minimum(d_lo, d_hi)
        return d_lo <= d_hi, dist <= ww if inclusive else dist < ww, ww >= np.minimum(down, up) * VALUE_FRACTION

    def _geometry(self, vv: np.ndarray, rr: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(v - r, the grid spacing below r, the grid spacing above r) for grid values r."""
        fast = self._fused.geometry(vv, rr, self.bits - 9)
        if fast is not None:
            return fast
        toward_zero, away = spacings_np(rr, self.bits)
        negative = rr < 0
        return vv - rr, np.where(negative, away, toward_zero), np.where(negative, toward_zero, away)

    # -- replay -------------------------------------------------------------------------------------

    def _expect_site(self, site: int, op: str, shape: tuple[int, ...]) -> SiteLog:
        sites = self.replay_log.sites
        if site >= len(sites):
            raise TraceMismatchError(self.step, site, "the end of the step", _describe(op, shape))
        entry = sites[site]
        if entry.tag != site_tag(op, shape):
            raise TraceMismatchError(self.step, site, entry.describe(), _describe(op, shape))
        return entry

    def _replay_bound(self, spec: OpSpec, args: tuple, kwargs: dict, floats: list, i: int, held: list,
                      pos: torch.Tensor) -> torch.Tensor:
        """E of output i at the replayed entries `pos`: gathered where that pays, else from the op's full bounds,
        computed once for all its outputs (kept in held[0])."""
        gather = spec.bound_at is not None and gather_pays(spec.name, pos.numel(), floats[i].numel())
        if held[0] is None and not gather:
            held[0] = spec.bound(args, kwargs, floats)
        return self._bound_at(spec, args, kwargs, floats, i, pos, full=held[0])

    def _apply_entries(self, entry: SiteLog, op: str, v: torch.Tensor, r: torch.Tensor,
                       bound_at: Any, certify: Any = None) -> torch.Tensor:
        """r (v rounded) with the site's entries imposed, each checked first: the value it claims must lie
        between the roundings of v - w and v + w, w the band there (zero where a certificate proves v exact).

        An entry that claims r's own value passes that check whatever w is (rounding is monotone and r is v's
        rounding), and a value entry whose residue is r's own names r (`valuecode.names_own`). So E and the
        certificates are computed only at the direction entries that change r and the other value entries
        (whose decoding reads the band). Honest replays on the trainer's own device change nothing, so they
        compute neither: E and a certificate cost ~100-200 us a site at GPT-2-tiny's default size, about a
        tenth of its auditor step in all. (A value entry is decoded with the band E gives: where a certificate
        proves the value exact, the value it names must be r.)"""
        r = r.contiguous()
        n = r.numel()
        for where in (entry.dir_pos, entry.val_pos):  # (the kernels read by position, unchecked)
            if where.size and (where.max() >= n or where.min() < 0):
                bad = int(where.max() if where.max() >= n else where.min())
                raise IllegitimateLogEntryError(self.step, entry.site, op, bad, f"the op's output has {n} elements")
        dev = r.device
        nd = entry.dir_pos.size
        if self._fused.usable(v) and self._fused.usable(r) and v.dtype == r.dtype:
            pos, vv, rr, claim, need, twice = claims.read(self._fused.flat(v), self._fused.flat(r), entry, self.bits)
        else:
            pos, vv, rr, claim, need, twice = self._claims(entry, v, r)
        if twice >= 0:  # (two claims on one value: which one wins would be up to the device's scatter)
            raise IllegitimateLogEntryError(self.step, entry.site, op, twice,
                                            "a direction entry and a value entry at the same position")
        sel = np.flatnonzero(need)  # (the value entries last, as in pos)
        ok = np.ones(pos.size, bool)
        if sel.size:
            at = torch.from_numpy(pos[sel]).to(dev)
            vs = torch.from_numpy(vv[sel]).to(dev)
            if self.policy == "bound":
                e = bound_at(at)
                w = e * (2 * BAND_SLACK)
            else:
                w = spacing_below(torch.from_numpy(rr[sel]).to(dev), self.bits) * (0.5 - self.tau) * BAND_SLACK
            vals = np.flatnonzero(sel >= nd)  # (where in sel: a residue must name a value of its range)
            if vals.size:
                at_v = sel[vals]
                claim[at_v], ok[at_v] = valuecode.decode(vv[at_v], w[torch.from_numpy(vals)].cpu().numpy(),
                                                         entry.val_res[at_v - nd], entry.val_bits[at_v - nd],
                                                         self.bits)
            exact = certify(at, e, vv[sel]) if certify is not None else None
            if exact is not None:  # an exact value has no band: only its own rounding is legitimate there
                w = w.masked_fill(exact, 0.0)
            cs = torch.from_numpy(claim[sel]).to(dev)
            big = torch.finfo(vs.dtype).max  # (v' -+ w' past the work dtype: its rounding, not inf / inf = NaN)
            within = (round_unchecked((vs - w).clamp(-big, big), self.bits) <= cs) \
                & (cs <= round_unchecked((vs + w).clamp(-big, big), self.bits))
            within |= w == float("inf")  # no finite bound (e.g. an overflowing |A||B|): any grid value is possible
            ok[sel] &= within.cpu().numpy()
        if not ok.all():
            raise IllegitimateLogEntryError(self.step, entry.site, op, int(pos[np.flatnonzero(~ok)[0]]))
        self._counts["corrections"] += int((claim != rr).sum())
        self._counts["logged"] += entry.num_entries
        self._counts["logged_values"] += int(entry.val_pos.size)
        as_bits = np.int64 if claim.itemsize == 8 else np.int32
        changed = claim.view(as_bits) != rr.view(as_bits)  # (bit patterns: a zero's sign is the trainer's too)
        if changed.any():
            r.view(-1)[torch.from_numpy(pos[changed]).to(dev)] = torch.from_numpy(claim[changed]).to(dev)
        return r

    def _claims(self, entry: SiteLog, v: torch.Tensor, r: torch.Tensor) -> claims.Claims:
        """`claims.read` for tensors the kernels do not take, in numpy (the same operations in r's dtype)."""
        nd = entry.dir_pos.size
        twice = -1
        if nd and entry.val_pos.size:  # (both lists strictly increase, so numpy's intersect1d's sort is not needed)
            k = np.searchsorted(entry.dir_pos, entry.val_pos).clip(max=nd - 1)
            both = entry.val_pos[entry.dir_pos[k] == entry.val_pos]
            twice = int(both[0]) if both.size else -1
        pos = np.concatenate([entry.dir_pos, entry.val_pos])
        vv, rr = _at(v, pos), _at(r, pos)  # (numpy: a few values a site)
        claim = rr.copy()
        if nd:
            rd = rr[:nd]
            diff, down, up = self._geometry(vv[:nd], rd)
            near_lo = diff + down * 0.5 <= up * 0.5 - diff
            lo = np.where(near_lo, rd - down, rd)
            hi = np.where(near_lo, rd, rd + up)
            side = np.where(entry.dir_up, hi, lo)
            # a zero across the boundary at -+2^-150 (-s + s, s - s) is the zero of the boundary's sign, as the
            # trainer's value between that boundary and zero rounded to
            boundary = np.where(near_lo, rd - down * 0.5, rd + up * 0.5)
            claim[:nd] = np.where(side == 0, np.copysign(0.0, boundary), side)
        # the entries that may change r: direction entries claiming the other neighbour, value entries whose
        # residue is not r's own (those name r whatever the band: `valuecode.names_own`)
        need = claim != rr
        need[nd:] = ~valuecode.names_own(rr[nd:], entry.val_res, entry.val_bits, self.bits)
        return claims.Claims(pos, vv, rr, claim, need, twice)


@functools.cache
def _resolve_module() -> Any:
    """vtrain.resolve, imported at its first use: it pulls in mpmath, which only ops near a boundary need. (An
    import statement in the function that asks costs ~10 us a call in a training step, ~55 calls a step.)"""
    import vtrain.resolve  # noqa: PLC0415
    return vtrain.resolve


def active_rounding() -> RoundedExecution | None:
    """The RoundedExecution the current code runs under (the innermost dispatch mode), if any."""
    mode = _get_current_dispatch_mode()
    return mode if isinstance(mode, RoundedExecution) else None


def _at(t: torch.Tensor, idx: np.ndarray) -> np.ndarray:
    """t's values at flat positions idx, as numpy (gathered by numpy on CPU: a few values per op)."""
    t = t.detach() if t.requires_grad else t
    if t.is_cpu and t.is_contiguous():
        return t.view(-1).numpy()[idx]
    return t.reshape(-1)[torch.from_numpy(idx).to(t.device)].cpu().numpy()


def _fresh(v: torch.Tensor, args: tuple) -> bool:
    """Whether a device op's output v is a tensor of its own: none of the op's inputs, and no other tensor
    sees its memory, so that rounding it in place shows nowhere else."""
    return spare.sole(v) and not any(v is a for a in args)


def _release(floats: list, outs: list, args: tuple) -> None:
    """Hand the device's unrounded outputs, now replaced by their roundings, to vtrain.spare."""
    for v, r in zip(floats, outs):
        if v is not None and r is not v and v.numel() * v.element_size() >= spare.MIN_BYTES \
                and not any(v is a for a in args):
            spare.give(v)


def _outputs(out: Any) -> tuple[list, list]:
    """(the op's outputs as a list, the same with None for every non-floating output)."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return outs, [o if isinstance(o, torch.Tensor) and o.is_floating_point() else None for o in outs]


def _map_floats(out: Any, fn: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return fn(out) if out.is_floating_point() else out
    if isinstance(out, (tuple, list)):
        return type(out)(_map_floats(o, fn) for o in out)
    return out


