"""Composite ops under rounded execution (vtrain.composites): nn.LayerNorm and nn.BatchNorm*d compute the
written-out modules' forward bits and logs, every composite its written definition's bits, gradients that agree
with torch's own kernels, and the same bits on every device, through the log or the exact resolution."""

from __future__ import annotations

import functools
import itertools
import math
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import distributions

from exactref import ref_round_q
from numkit import batch
from vtrain import resolve
from vtrain.devices import get_device, list_devices
from vtrain.errors import UnsupportedOpError
from vtrain.grid import round_to_grid
from vtrain.models.norms import BatchNorm2d, LayerNorm
from vtrain.ops import OpClass, classify
from vtrain.rounding import RoundedExecution
from vtrain.roundlog import StepLog

aten = torch.ops.aten
EMULATED = [d.name for d in list_devices() if d.emulated]


def _grid(*shape: int, seed: int, bits: int = 32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return round_to_grid(torch.randn(shape, generator=g, dtype=torch.float64) * 3 + 1, bits)


def _rounded(fn: Any, resolution: str = "log", device: str = "cpu") -> tuple[Any, bytes]:
    """fn() under a recording rounded execution: (its result, the step's log bytes)."""
    with RoundedExecution(bits=32, device=get_device(device), mode="record", resolution=resolution) as rx:
        out = fn()
    return out, rx.log.to_bytes()


def _written_layer_norm(x: torch.Tensor, dims: list[int], w: torch.Tensor | None, b: torch.Tensor | None,
                        eps: float) -> torch.Tensor:
    # vtrain.models.norms.LayerNorm's forward over any trailing dims, the affine parts optional
    xc = x - x.mean(dims, keepdim=True)
    y = xc / torch.sqrt((xc * xc).mean(dims, keepdim=True) + eps)
    y = y if w is None else y * w
    return y if b is None else y + b


def test_the_composites_are_in_the_registry() -> None:
    for op in (aten.native_layer_norm.default, aten.native_layer_norm_backward.default,
               aten.native_batch_norm.default, aten.native_batch_norm_backward.default,
               aten.native_group_norm.default, aten.native_group_norm_backward.default,
               aten.linalg_vector_norm.default, aten.var.correction, aten.std.correction, aten.var_mean.correction,
               aten.std_mean.correction, aten.silu.default, aten.silu_backward.default, aten.leaky_relu.default,
               aten.leaky_relu_backward.default, aten._safe_softmax.default,
               aten._scaled_dot_product_flash_attention_for_cpu.default,
               aten._scaled_dot_product_flash_attention_for_cpu_backward.default, aten.mse_loss.default,
               aten.mse_loss_backward.default, aten.huber_loss.default, aten.huber_loss_backward.default,
               aten.smooth_l1_loss.default, aten.smooth_l1_loss_backward.default,
               aten.binary_cross_entropy_with_logits.default, aten.softplus.default, aten.softplus_backward.default,
               aten.elu.default, aten.elu_.default, aten.celu.default, aten.celu_.default, aten.elu_backward.default,
               aten.upsample_nearest2d_backward.default, aten.hardsigmoid.default, aten.hardsigmoid_backward.default,
               aten.hardswish.default, aten.hardswish_backward.default, aten.log_sigmoid_forward.default,
               aten.log_sigmoid_backward.default, aten.mish.default, aten.mish_backward.default, aten.xlogy.Tensor,
               aten.logsumexp.default, aten.baddbmm.default, aten.norm.Scalar, aten.norm.ScalarOpt_dim,
               aten.binary_cross_entropy.default, aten.binary_cross_entropy_backward.default,
               aten._prelu_kernel.default, aten._prelu_kernel_backward.default, aten._adaptive_avg_pool2d.default,
               aten._adaptive_avg_pool2d_backward.default, aten.adaptive_max_pool2d_backward.default,
               aten.upsample_nearest1d_backward.default, aten.upsample_nearest3d_backward.default,
               aten.scatter_add.default, aten.index_add.default, aten.reflection_pad1d_backward.default,
               aten.reflection_pad2d_backward.default, aten.reflection_pad3d_backward.default,
               aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
               aten.replication_pad3d_backward.default, aten.cumsum.default, aten.cumprod.default,
               aten.upsample_bilinear2d.default, aten.upsample_bilinear2d_backward.default,
               aten.upsample_linear1d.default, aten.upsample_linear1d_backward.default, aten.col2im.default,
               aten.glu.default, aten.glu_backward.default, aten.prod.default, aten.prod.dim_int,
               aten.soft_margin_loss.default, aten.soft_margin_loss_backward.default,
               aten.nll_loss2d_forward.default, aten.nll_loss2d_backward.default, aten._embedding_bag.default,
               aten._embedding_bag_backward.default, aten._embedding_bag_forward_only.default,
               aten.upsample_trilinear3d.default, aten.upsample_trilinear3d_backward.default,
               aten.upsample_bicubic2d.default, aten.upsample_bicubic2d_backward.default,
               aten._cdist_forward.default, aten._cdist_backward.default,
               aten._embedding_bag_per_sample_weights_backward.default, aten.multi_margin_loss.default,
               aten.multi_margin_loss_backward.default, aten.multilabel_margin_loss_forward.default,
               aten.multilabel_margin_loss_backward.default):
        assert classify(op, (), {}).cls is OpClass.COMPOSITE
    # copies of their inputs' values: the backward passes of slicing and indexing, recurrent layers' splits and
    # in-place transposes, padding and pixel shuffles, adaptive max pooling, nearest upsampling's forward passes,
    # the in-place clamps and logical ops
    for op in (aten.slice_backward.default, aten.select_backward.default, aten.slice_scatter.default,
               aten.select_scatter.default, aten.unsafe_split.Tensor, aten.unsafe_split_with_sizes.default,
               aten.transpose_.default, aten.repeat.default, aten.pixel_shuffle.default, aten.pixel_unshuffle.default,
               aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.replication_pad1d.default,
               aten.replication_pad2d.default, aten.reflection_pad3d.default, aten.replication_pad3d.default,
               aten.im2col.default, aten.channel_shuffle.default, aten.hardshrink.default,
               aten.hardshrink_backward.default, aten.softshrink_backward.default,
               aten.adaptive_max_pool2d.default, aten.upsample_nearest1d.default,
               aten.upsample_nearest3d.default, aten.clamp_.default, aten.clamp_min_.default, aten.clamp_max_.default,
               aten.logical_and_.default, aten.logical_or_.default, aten.bitwise_and_.Tensor,
               aten.bitwise_or_.Tensor):
        assert classify(op, (), {}).cls is OpClass.EXACT


def _moments(x: torch.Tensor, dims: list[int], divisor: int, keepdim: bool = False) -> torch.Tensor:
    """(sum((x - mean)^2) / divisor, the mean), stacked: a variance's definition, its sum and mean kept as asked."""
    mean = x.mean(dims, keepdim=True)
    xc = x - mean
    return torch.stack([(xc * xc).sum(dims, keepdim=keepdim) / divisor, mean if keepdim else mean.squeeze(dims)])


def _rooted(moments: torch.Tensor) -> torch.Tensor:
    return torch.stack([torch.sqrt(moments[0]), moments[1]])


_ALL = (0, 1, 2)
_TARGET, _WEIGHT, _POS = _grid(4, 6, 5, seed=31), _grid(5, seed=32).abs(), _grid(5, seed=33).abs()
_LABELS = (_grid(4, 6, 5, seed=34) > 1).double()


def _bce(x: torch.Tensor, weight: torch.Tensor | None = None, pos: torch.Tensor | None = None) -> torch.Tensor:
    softplus = torch.log1p(torch.exp(-x.abs())) + (-x).clamp_min(0)
    if pos is not None:
        softplus = ((pos - 1) * _LABELS + 1) * softplus
    loss = (1 - _LABELS) * x + softplus
    return loss if weight is None else loss * weight


def _softplus(x: torch.Tensor, beta: float, threshold: float) -> torch.Tensor:
    xb = x * beta
    linear = xb > threshold
    y = torch.log1p(torch.exp(xb.masked_fill(linear, 0.0)))
    return torch.where(linear, x, y / beta)


def _elu(x: torch.Tensor, alpha: float, scale: float, input_scale: float = 1.0) -> torch.Tensor:
    positive = x > 0
    shifted = x.masked_fill(positive, 0.0)
    negative = torch.expm1(shifted if input_scale == 1 else shifted * input_scale) * (alpha * scale)
    return torch.where(positive, x if scale == 1 else x * scale, negative)


def _xlogy(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return x * torch.log(y.masked_fill(x == 0, 1.0))


_NAN = torch.full((4, 6, 1), math.nan, dtype=torch.float64)  # (baddbmm's input at beta 0: never read)


def _logsumexp(x: torch.Tensor, dims: tuple[int, ...], keepdim: bool = False) -> torch.Tensor:
    top = x.amax(dims, keepdim=True)
    return torch.log(torch.exp(x - top).sum(dims, keepdim=keepdim)) + (top if keepdim else top.squeeze(dims))


_MASK = torch.zeros(4, 6, 5, dtype=torch.bool)
_MASK[:, :, 1:3] = True
_MASK[0, 0, 0] = True


def _masked_logsumexp(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    # a mask's -inf never entering an IEEE op: its exponential 0, its value the line's largest other one (or 0)
    top = x.masked_fill(mask, -math.inf).amax(-1, keepdim=True)
    top = top.masked_fill(top == -math.inf, 0.0)
    e = torch.exp(torch.where(mask, top, x) - top).masked_fill(mask, 0.0)
    return torch.log(e.sum(-1)) + top.squeeze(-1)


def _clamped_log(x: torch.Tensor, zero: torch.Tensor, log: Any) -> torch.Tensor:
    """log(x) clamped at -100, -100 where x is 0 (`zero`; its log is taken of 1 there, never -inf)."""
    return log(x.masked_fill(zero, 1.0)).masked_fill(zero, -100.0).clamp_min(-100)


def _bce_probabilities(p: torch.Tensor, weight: torch.Tensor | float) -> torch.Tensor:
    # torch's formula, (target - 1) max(log(1 - p), -100) - target max(log p, -100)
    miss = _clamped_log(-p, p == 1, torch.log1p)
    loss = (_LABELS - 1) * miss - _LABELS * _clamped_log(p, p == 0, torch.log)
    return loss * weight


def _bce_backward(p: torch.Tensor) -> torch.Tensor:
    # torch's formula, (p - target) / max((1 - p) p, 1e-12), times the output's gradient, over the count (a mean)
    return (p - _LABELS) / ((1 - p) * p).clamp_min(1e-12) * _TARGET / 120


def _huber(x: torch.Tensor, delta: float) -> torch.Tensor:
    z = (x - _TARGET).abs()
    return torch.where(z < delta, (z * 0.5) * z, (z - 0.5 * delta) * delta).mean(_ALL)


def _smooth_l1(x: torch.Tensor, beta: float) -> torch.Tensor:
    z = (x - _TARGET).abs()
    return torch.where(z < beta, (z * 0.5) * z / beta, z - 0.5 * beta).sum(_ALL)


def _linear(x: torch.Tensor, out_size: int, align_corners: bool, scale: float | None) -> torch.Tensor:
    """Linear interpolation along the last dim in registry ops, with torch's taps and weights (`_linear_taps`)."""
    (first, second), (w0, w1) = (zip(*t) for t in zip(*_linear_taps(x.shape[-1], out_size, align_corners, scale)))
    w0, w1 = (torch.tensor(w, dtype=torch.float64) for w in (w0, w1))
    return x.index_select(-1, torch.tensor(first)) * w0 + x.index_select(-1, torch.tensor(second)) * w1


def _separable(x: torch.Tensor, sizes: tuple, align_corners: bool) -> torch.Tensor:
    """Linear interpolation over x's trailing dims as `_linear` along the last dim, then the one before, ...: the
    same operations as torch's nested formula (the outer dim's weights applied last)."""
    for d, size in zip(range(-1, -len(sizes) - 1, -1), reversed(sizes)):
        x = _linear(x.movedim(d, -1), size, align_corners, None).movedim(-1, d)
    return x


def _fold(cols: torch.Tensor, size: tuple, kernel: int, **kw: Any) -> torch.Tensor:
    """F.fold in registry ops: where each column value goes, read off F.unfold of the image's position numbers
    (from 1: the padding's zeros mark the taps to drop), then index_add in the columns' order."""
    numbers = torch.arange(1, 1 + math.prod(size), dtype=torch.float64).reshape(1, 1, *size)
    channels = cols.shape[1] // kernel**2
    read = F.unfold(numbers, kernel, **kw).reshape(kernel**2, -1).repeat(channels, 1)  # (C k k, L), as cols
    offsets = (torch.arange(channels) * math.prod(size)).repeat_interleave(kernel**2).reshape(-1, 1)
    keep = read.reshape(-1) > 0
    taps = (read.long() - 1 + offsets).reshape(-1)[keep]
    out = torch.zeros(cols.shape[0], channels * math.prod(size), dtype=cols.dtype)
    return out.index_add(1, taps, cols.reshape(cols.shape[0], -1)[:, keep]).reshape(cols.shape[0], channels, *size)


_PIXELS = torch.randint(0, 6, (4, 5), generator=torch.Generator().manual_seed(35))
_IGNORED = _PIXELS.masked_fill(_PIXELS == 2, -100)
_CLASS_WEIGHT = _grid(6, seed=36).abs()


_BAG_IDS, _BAG_OFFSETS = torch.tensor([1, 20, 4, 5, 4, 3, 7, 7, 0, 23]), torch.tensor([0, 3, 3, 6])
_BAG_OF, _BAG_WEIGHTS = torch.tensor([0, 0, 0, 2, 2, 2, 3, 3, 3, 3]), _grid(10, seed=37)


def _bags(x: torch.Tensor, mode: str, padding_idx: int | None = None) -> torch.Tensor:
    """nn.EmbeddingBag over x's 24 rows of 5 in registry ops: each kept index's row (times its weight, summing)
    added into its bag's zeros in order (the second bag empty), over the bag's size for a mean."""
    keep = _BAG_IDS != (-1 if padding_idx is None else padding_idx)
    rows = x.reshape(24, 5).index_select(0, _BAG_IDS[keep])
    if mode == "sum":
        rows = rows * _BAG_WEIGHTS[keep].unsqueeze(1)
    sums = torch.zeros(4, 5, dtype=torch.float64).index_add(0, _BAG_OF[keep], rows)
    return sums if mode == "sum" else sums / torch.bincount(_BAG_OF[keep], minlength=4).clamp_min(1).unsqueeze(1)


def _pairs(x: torch.Tensor) -> torch.Tensor:
    """Each of x's rows minus each of _TARGET's first four, a batch apiece: cdist's differences."""
    return x.unsqueeze(-2) - _TARGET[:, :4].unsqueeze(-3)


_CLASSES = torch.tensor([3, 0, 4, 4, 1, 2] * 4)


def _written_margins(x: torch.Tensor, p: int, weight: torch.Tensor | None, reduction: str) -> torch.Tensor:
    """nn.MultiMarginLoss (margin 0.7) over x's 24 rows of 5 in registry ops: each other class's (0.7 - x_target)
    + x_c where positive (squared for p = 2, times the target's weight), summed, over 5, reduced."""
    x2 = x.reshape(24, 5)
    z = (0.7 - x2.gather(1, _CLASSES[:, None])) + x2
    h = torch.where((z > 0) & (torch.arange(5) != _CLASSES[:, None]), z, torch.zeros_like(z))
    h = h * h if p == 2 else h
    h = h if weight is None else h * weight[_CLASSES].unsqueeze(1)
    per = h.sum(1) / 5
    return per if reduction == "none" else per.mean([0]) if reduction == "mean" else per.sum([0])


# (the composite, its definition in registry ops) on x of shape (4, 6, 5)
_BOX2, _BOX3 = (torch.ones(1, 1, k, k, k, dtype=torch.float64) for k in (2, 3))
_COUNTS = F.conv3d(torch.ones(1, 1, 4, 6, 5, dtype=torch.float64), _BOX3, stride=2, padding=1)  # (inside the input)
def _uneven(x: torch.Tensor, reduce: Any) -> torch.Tensor:
    # adaptive pooling from 6 x 5 to 4 x 3: windows of rows [floor(6 i / 4), ceil(6 (i + 1) / 4)) = 0:2, 1:3, 3:5, 4:6
    # and of columns 0:2, 1:4, 3:5, which overlap and vary in size
    x = x.reshape(2, 2, 6, 5)
    rows = [slice(math.floor(6 * i / 4), math.ceil(6 * (i + 1) / 4)) for i in range(4)]
    cols = [slice(math.floor(5 * j / 3), math.ceil(5 * (j + 1) / 3)) for j in range(3)]
    return torch.stack([torch.stack([reduce(x[..., r, c]) for c in cols], -1) for r in rows], -2)


def _uneven3(x: torch.Tensor, reduce: Any) -> torch.Tensor:
    # 3-d adaptive pooling from 4 x 3 x 5 to 3 x 2 x 4: windows 0:2, 1:3, 2:4 (depth), 0:2, 1:3 (rows), 0:2, 1:3, 2:4,
    # 3:5 (columns), overlapping
    x = x.reshape(1, 2, 4, 3, 5)
    windows = [[slice(math.floor(n * i / o), math.ceil(n * (i + 1) / o)) for i in range(o)]
               for n, o in ((4, 3), (3, 2), (5, 4))]
    pooled = [reduce(x[..., a, b, c]) for a, b, c in itertools.product(*windows)]
    return torch.stack(pooled, -1).unflatten(-1, (3, 2, 4))


def _renormed(x: torch.Tensor, p: int, maxnorm: float) -> torch.Tensor:
    # slices along dim 1 (norms over dims 0 and 2) beyond maxnorm times maxnorm / (norm + 1e-7)
    norm = torch.sqrt((x * x).sum((0, 2), keepdim=True)) if p == 2 else x.abs().sum((0, 2), keepdim=True)
    return x * torch.where(norm > maxnorm, torch.full_like(norm, maxnorm) / (norm + 1e-7), 1.0)


_G_FIRST, _G_LAST = _grid(4, 1, 1, seed=35), _grid(1, 1, 5, seed=36)


_ROWS_I, _ROWS_J = torch.triu_indices(24, 24, 1)  # (pdist's pairs i < j of 24 rows, row-major)


_SCATTER_TO = [0, 3, 0, 0, 2]  # (along the last dim: position 0 reached three times, 1 never)
_SCATTER_INDEX = torch.tensor(_SCATTER_TO).expand(4, 6, 5)


def _scatter_reduced(x: torch.Tensor, src: torch.Tensor, reduce: str, include_self: bool) -> torch.Tensor:
    # torch's documented scatter_reduce written out: src's values taken in order, each combined into its position
    # (without include_self starting from the first value), a mean the sum over the count of values
    combine = {"sum": torch.add, "mean": torch.add, "prod": torch.mul, "amax": torch.maximum, "amin": torch.minimum}
    out, counts, seen = x.clone(), [1 if include_self else 0] * x.shape[-1], set()
    for j, c in enumerate(_SCATTER_TO):
        out[..., c] = combine[reduce](out[..., c], src[..., j]) if include_self or c in seen else src[..., j]
        seen.add(c)
        counts[c] += 1
    if reduce != "mean":
        return out
    return out / torch.tensor([max(n, 1) for n in counts], dtype=x.dtype)


def _triangle(x: torch.Tensor, upper: bool = False) -> torch.Tensor:
    # (batches of 5 x 5 triangles from x's grid values, 4 added on the diagonal: well conditioned)
    t = torch.triu(x[:2, :5, :5]) if upper else torch.tril(x[:2, :5, :5])
    return t + torch.eye(5, dtype=x.dtype) * 4


def _substituted(a: torch.Tensor, b: torch.Tensor, upper: bool, unit: bool = False) -> torch.Tensor:
    # A X = B solved row by row from the triangle's corner: B_i less the known rows' products (a bmm), over A_ii
    n, k = a.shape[-1], b.shape[-1]
    a, b = torch.broadcast_tensors(a, b[..., :n]) if b.shape[-1] == n else (a, b.expand(*a.shape[:-2], n, k))
    rows: dict[int, torch.Tensor] = {}
    for i in (range(n - 1, -1, -1) if upper else range(n)):
        known = list(range(i + 1, n)) if upper else list(range(i))
        row = b[..., i:i + 1, :]
        if known:
            x = torch.cat([rows[j] for j in known], -2)
            row = row - torch.bmm(a[..., i:i + 1, known].reshape(-1, 1, len(known)),
                                  x.reshape(-1, len(known), k)).reshape(row.shape)
        rows[i] = row if unit else row / a[..., i:i + 1, i:i + 1]
    return torch.cat([rows[i] for i in range(n)], -2)


def _positive_definite(x: torch.Tensor) -> torch.Tensor:
    # (batches of 5 x 5 Gram matrices of x's rows, 2 added on the diagonal)
    m = x[:2, :5, :5]
    return m @ m.mT + torch.eye(5, dtype=x.dtype) * 2


def _factored(a: torch.Tensor) -> torch.Tensor:
    # Cholesky-Crout written out: column j is A's below the diagonal less its rows' products with row j of the
    # columns known (a bmm), its first value's root the pivot, the rest over it
    n, cols = a.shape[-1], []
    for j in range(n):
        column = a[:, j:, j:j + 1]
        if j:
            known = torch.cat(cols, 2)
            column = column - torch.bmm(known[:, j:], known[:, j:j + 1].mT)
        root = torch.sqrt(column[:, :1])
        cols.append(torch.cat([torch.zeros(a.shape[0], j, 1, dtype=a.dtype), root, column[:, 1:] / root], 1))
    return torch.cat(cols, 2)


def _pair_differences(x: torch.Tensor) -> torch.Tensor:
    x = x.reshape(24, 5)
    return x[_ROWS_I] - x[_ROWS_J]


DEFINITIONS = {
    "silu": (F.silu, lambda x: x * torch.sigmoid(x)),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), lambda x: torch.where(x > 0, x, x * 0.2)),
    "norm": (lambda x: torch.linalg.vector_norm(x), lambda x: torch.sqrt((x * x).sum((0, 1, 2)))),
    "norm-dim": (lambda x: torch.linalg.vector_norm(x, dim=(0, 2), keepdim=True),
                 lambda x: torch.sqrt((x * x).sum((0, 2), keepdim=True))),
    "norm-1": (lambda x: torch.linalg.vector_norm(x, ord=1, dim=1), lambda x: x.abs().sum(1)),
    "norm-inf": (lambda x: torch.linalg.vector_norm(x, ord=math.inf), lambda x: x.abs().amax((0, 1, 2))),
    "norm-minus-inf": (lambda x: torch.linalg.vector_norm(x, ord=-math.inf, dim=-1), lambda x: x.abs().amin(-1)),
    "var": (lambda x: x.var(-1), lambda x: _moments(x, [-1], 4)[0]),
    "std": (lambda x: x.std((0, 1), correction=0), lambda x: torch.sqrt(_moments(x, [0, 1], 24)[0])),
    "var_mean": (lambda x: torch.stack(torch.var_mean(x, 1, keepdim=True)), lambda x: _moments(x, [1], 5, True)),
    "std_mean": (lambda x: torch.stack(torch.std_mean(x)), lambda x: _rooted(_moments(x, [0, 1, 2], 119))),
    "mse": (lambda x: F.mse_loss(x, _TARGET), lambda x: ((x - _TARGET) * (x - _TARGET)).mean(_ALL)),
    "mse-none": (lambda x: F.mse_loss(x, _TARGET, reduction="none"), lambda x: (x - _TARGET) * (x - _TARGET)),
    "huber": (lambda x: F.huber_loss(x, _TARGET, delta=0.75), lambda x: _huber(x, 0.75)),
    "smooth_l1": (lambda x: F.smooth_l1_loss(x, _TARGET, reduction="sum", beta=0.5), lambda x: _smooth_l1(x, 0.5)),
    "bce": (lambda x: F.binary_cross_entropy_with_logits(x, _LABELS), lambda x: _bce(x).mean(_ALL)),
    "bce-weighted": (lambda x: F.binary_cross_entropy_with_logits(x * 8, _LABELS, _WEIGHT, pos_weight=_POS,
                                                                  reduction="sum"),
                     lambda x: _bce(x * 8, _WEIGHT, _POS).sum(_ALL)),
    "softplus": (F.softplus, lambda x: _softplus(x, 1, 20)),
    "softplus-scaled": (lambda x: F.softplus(x * 4, beta=2, threshold=6), lambda x: _softplus(x * 4, 2, 6)),
    "hardtanh": (lambda x: F.hardtanh(x, -0.5, 0.75), lambda x: x.clamp(-0.5, 0.75)),
    "elu": (lambda x: F.elu(x, 0.5), lambda x: _elu(x, 0.5, 1.0)),
    "elu-in-place": (lambda x: F.elu(x * 1.0, 0.5, inplace=True), lambda x: _elu(x * 1.0, 0.5, 1.0)),
    "selu": (F.selu, lambda x: _elu(x, 1.6732632423543772, 1.0507009873554805)),
    "celu": (lambda x: F.celu(x, 0.75), lambda x: _elu(x, 0.75, 1.0, 1 / 0.75)),
    "hardsigmoid": (F.hardsigmoid, lambda x: (x + 3).clamp(0, 6) / 6),
    "hardswish": (F.hardswish, lambda x: (x * (x + 3).clamp(0, 6)) / 6),
    "logsigmoid": (F.logsigmoid, lambda x: x.clamp_max(0) - torch.log1p(torch.exp(-x.abs()))),
    "mish": (F.mish, lambda x: x * torch.tanh(_softplus(x, 1, 20))),
    "xlogy": (lambda x: torch.xlogy(x.clamp_min(0), _TARGET.abs()), lambda x: _xlogy(x.clamp_min(0), _TARGET.abs())),
    "upsample": (lambda x: F.interpolate(x.reshape(4, 1, 6, 5), scale_factor=2),
                 lambda x: x.reshape(4, 1, 6, 1, 5, 1).expand(4, 1, 6, 2, 5, 2).reshape(4, 1, 12, 10)),
    "logsumexp": (lambda x: torch.logsumexp(x, (1, 2)), lambda x: _logsumexp(x, (1, 2))),
    "logsumexp-kept": (lambda x: torch.logsumexp(x * 40, -1, keepdim=True),
                       lambda x: _logsumexp(x * 40, (-1,), keepdim=True)),
    "logsumexp-masked": (lambda x: torch.logsumexp(x.masked_fill(_MASK, -math.inf), -1),
                         lambda x: _masked_logsumexp(x, _MASK)),
    "torch.norm": (lambda x: aten.norm.ScalarOpt_dim(x, 2, [1]), lambda x: torch.sqrt((x * x).sum(1))),
    "torch.norm-1": (lambda x: aten.norm.Scalar(x, 1), lambda x: x.abs().sum((0, 1, 2))),
    "bce-probabilities": (lambda x: F.binary_cross_entropy(torch.sigmoid(x), _LABELS),
                          lambda x: _bce_probabilities(torch.sigmoid(x), 1.0).mean(_ALL)),
    "bce-probabilities-ends": (lambda x: F.binary_cross_entropy(torch.sigmoid(x * 60), _LABELS, _WEIGHT,
                                                                reduction="sum"),
                               lambda x: _bce_probabilities(torch.sigmoid(x * 60), _WEIGHT).sum(_ALL)),
    "bce-backward-ends": (lambda x: aten.binary_cross_entropy_backward(_TARGET, torch.sigmoid(x * 60), _LABELS),
                          lambda x: _bce_backward(torch.sigmoid(x * 60))),
    "prelu": (lambda x: F.prelu(x, _WEIGHT[:1] - 0.75), lambda x: torch.where(x > 0, x, (_WEIGHT[:1] - 0.75) * x)),
    "prelu-channels": (lambda x: F.prelu(x, _TARGET[0, :, 0]),
                       lambda x: torch.where(x > 0, x, _TARGET[0, :, 0].reshape(6, 1) * x)),
    "baddbmm": (lambda x: torch.baddbmm(_TARGET[:, :, :1], x, x.transpose(1, 2), beta=0.5, alpha=2),
                lambda x: _TARGET[:, :, :1] * 0.5 + (x @ x.transpose(1, 2)) * 2),
    "baddbmm-no-input": (lambda x: torch.baddbmm(_NAN, x, x.transpose(1, 2), beta=0),
                         lambda x: x @ x.transpose(1, 2)),
    "max-pool-3d": (lambda x: F.max_pool3d(x.reshape(1, 1, 4, 6, 5), 2, 1),
                    lambda x: x.reshape(1, 1, 4, 6, 5).unfold(2, 2, 1).unfold(3, 2, 1).unfold(4, 2, 1)
                    .amax((-3, -2, -1))),
    "avg-pool-3d": (lambda x: F.avg_pool3d(x.reshape(1, 2, 2, 6, 5), 2),
                    lambda x: F.conv3d(x.reshape(2, 1, 2, 6, 5), _BOX2, stride=2).reshape(1, 2, 1, 3, 2) / 8),
    "avg-pool-3d-counted": (lambda x: F.avg_pool3d(x.reshape(1, 1, 4, 6, 5), 3, 2, 1, count_include_pad=False),
                            lambda x: F.conv3d(x.reshape(1, 1, 4, 6, 5), _BOX3, stride=2, padding=1) / _COUNTS),
    "addmv": (lambda x: torch.addmv(_TARGET[0, :, 0], x[0], x[1, 0], beta=0.5, alpha=2),
              lambda x: _TARGET[0, :, 0] * 0.5 + torch.mv(x[0], x[1, 0]) * 2),
    "addbmm": (lambda x: torch.addbmm(_TARGET[0], x, x.transpose(1, 2)[:, :, :5], alpha=0.5),
               lambda x: _TARGET[0] + (x @ x.transpose(1, 2)[:, :, :5]).sum(0) * 0.5),
    "trace": (lambda x: torch.trace(x[0]), lambda x: x[0].diagonal().sum()),
    "diag": (lambda x: torch.diag(x[1]) * 2, lambda x: x[1].diagonal() * 2),
    "dist": (lambda x: torch.dist(x, _TARGET), lambda x: torch.sqrt(((x - _TARGET) * (x - _TARGET)).sum(_ALL))),
    "dist-1": (lambda x: torch.dist(x, _TARGET, 1), lambda x: (x - _TARGET).abs().sum(_ALL)),
    "threshold": (lambda x: F.threshold(x, 0.5, -2.0), lambda x: torch.where(x > 0.5, x, -2.0)),
    "threshold-off-grid": (lambda x: F.threshold(x, 0.5, 0.1), lambda x: torch.where(x > 0.5, x, 0.1)),
    "adaptive-avg-pool": (lambda x: F.adaptive_avg_pool2d(x.reshape(2, 2, 6, 5), (3, 5)),
                          lambda x: F.avg_pool2d(x.reshape(2, 2, 6, 5), (2, 1))),
    "adaptive-max-pool": (lambda x: F.adaptive_max_pool2d(x.reshape(2, 2, 6, 5), (2, 1)),
                          lambda x: F.max_pool2d(x.reshape(2, 2, 6, 5), (3, 5))),
    "pdist": (lambda x: F.pdist(x.reshape(24, 5)),
              lambda x: torch.sqrt((_pair_differences(x) * _pair_differences(x)).sum(-1))),
    "pdist-1": (lambda x: F.pdist(x.reshape(24, 5), 1), lambda x: _pair_differences(x).abs().sum(-1)),
    "pdist-3": (lambda x: F.pdist(x.reshape(24, 5), 3),
                lambda x: torch.pow(torch.pow(_pair_differences(x).abs(), 3).sum(-1), 1 / 3)),
    "adaptive-avg-pool-3d": (lambda x: F.adaptive_avg_pool3d(x.reshape(1, 2, 4, 3, 5), (2, 3, 5)),
                             lambda x: F.avg_pool3d(x.reshape(1, 2, 4, 3, 5), (2, 1, 1))),
    "adaptive-avg-pool-3d-uneven": (lambda x: F.adaptive_avg_pool3d(x.reshape(1, 2, 4, 3, 5), (3, 2, 4)),
                                    lambda x: _uneven3(x, lambda w: w.mean((-3, -2, -1)))),
    "adaptive-max-pool-3d-uneven": (lambda x: F.adaptive_max_pool3d(x.reshape(1, 2, 4, 3, 5), (3, 2, 4)),
                                    lambda x: _uneven3(x, lambda w: w.amax((-3, -2, -1)))),
    "addr": (lambda x: torch.addr(x[0], x[1, :, 0], x[2, 0], beta=0.5, alpha=3.0),
             lambda x: x[0] * 0.5 + (x[1, :, 0, None] * x[2, 0, None, :]) * 3.0),
    "addr-beta-0": (lambda x: torch.addr(x[0], x[1, :, 0], x[2, 0], beta=0, alpha=0.5),
                    lambda x: (x[1, :, 0, None] * x[2, 0, None, :]) * 0.5),
    "logaddexp": (lambda x: torch.logaddexp(x * 4, _TARGET),
                  lambda x: torch.maximum(x * 4, _TARGET) + torch.log1p(torch.exp(-(x * 4 - _TARGET).abs()))),
    "logaddexp2": (lambda x: torch.logaddexp2(x * 4, _TARGET),
                   lambda x: torch.maximum(x * 4, _TARGET)
                   + torch.log1p(torch.exp2(-(x * 4 - _TARGET).abs())) * (1 / math.log(2))),
    # (x one value a line: both broadcast)
    "xlogy-broadcast": (lambda x: torch.xlogy(x[:, :, :1].clamp_min(0), _TARGET.abs()),
                        lambda x: _xlogy(x[:, :, :1].clamp_min(0).expand(4, 6, 5), _TARGET.abs())),
    "xlog1py": (lambda x: torch.special.xlog1py(x.clamp_min(0), _TARGET.abs()),
                lambda x: x.clamp_min(0) * torch.log1p(_TARGET.abs().masked_fill(x.clamp_min(0) == 0, 0.0))),
    "hypot": (lambda x: torch.hypot(x, _TARGET), lambda x: torch.sqrt(x * x + _TARGET * _TARGET)),
    "diag-embed": (lambda x: torch.diag_embed(x[0]), lambda x: x[0].unsqueeze(-1) * torch.eye(5, dtype=x.dtype)),
    "cholesky": (lambda x: torch.linalg.cholesky(_positive_definite(x)), lambda x: _factored(_positive_definite(x))),
    "cholesky-upper": (lambda x: torch.linalg.cholesky(_positive_definite(x)[1], upper=True),
                       lambda x: _factored(_positive_definite(x)[1:])[0].mT),
    "solve-triangular": (lambda x: torch.linalg.solve_triangular(_triangle(x)[0], x[2, :5, :4], upper=False),
                         lambda x: _substituted(_triangle(x)[0], x[2, :5, :4], False)),
    "solve-triangular-upper-batched": (
        lambda x: torch.linalg.solve_triangular(_triangle(x, True), x[2, :5, :3], upper=True),
        lambda x: _substituted(_triangle(x, True), x[2, :5, :3].expand(2, 5, 3), True)),
    "solve-triangular-right": (
        lambda x: torch.linalg.solve_triangular(_triangle(x)[1], x[3, :4, :5], upper=False, left=False),
        lambda x: _substituted(_triangle(x)[1].mT, x[3, :4, :5].mT, True).mT),
    "solve-triangular-unit": (
        lambda x: torch.linalg.solve_triangular(_triangle(x)[0], x[2, :5, :4], upper=False, unitriangular=True),
        lambda x: _substituted(_triangle(x)[0], x[2, :5, :4], False, unit=True)),
    **{f"scatter-reduce-{reduce}{'' if include_self else '-without-self'}": (
        functools.partial(lambda r, i, x: torch.scatter_reduce(x, 2, _SCATTER_INDEX, _TARGET * 2, r, include_self=i),
                          reduce, include_self),
        functools.partial(lambda r, i, x: _scatter_reduced(x, _TARGET * 2, r, i), reduce, include_self))
       for reduce in ("sum", "mean", "prod", "amax", "amin") for include_self in (True, False)},
    "scatter-reduce-in-place": (lambda x: (x * 1.0).scatter_reduce_(2, _SCATTER_INDEX, _TARGET, "prod"),
                                lambda x: _scatter_reduced(x * 1.0, _TARGET, "prod", True)),
    "bilinear-layer": (lambda x: F.bilinear(x[0, :, :3], x[1, :, :4], _TARGET[:3, :3, :4], _TARGET[3, 0, :3]),
                       lambda x: (x[0, :, :3].reshape(6, 1, 3, 1) * _TARGET[:3, :3, :4].reshape(1, 3, 3, 4)
                                  * x[1, :, :4].reshape(6, 1, 1, 4)).sum((2, 3)) + _TARGET[3, 0, :3]),
    "vdot": (lambda x: torch.vdot(x.reshape(-1), _TARGET.reshape(-1)),
             lambda x: torch.dot(x.reshape(-1), _TARGET.reshape(-1))),
    "renorm": (lambda x: torch.renorm(x, 2, 1, 4.5), lambda x: _renormed(x, 2, 4.5)),
    "renorm-1": (lambda x: torch.renorm(x, 1, 1, 12.0), lambda x: _renormed(x, 1, 12.0)),
    "weight-norm": (lambda x: torch._weight_norm(x, _G_FIRST, 0),
                    lambda x: x * (_G_FIRST / torch.sqrt((x * x).sum((1, 2), keepdim=True)))),
    "weight-norm-last": (lambda x: torch._weight_norm(x, _G_LAST, 2),
                         lambda x: x * (_G_LAST / torch.sqrt((x * x).sum((0, 1), keepdim=True)))),
    "adaptive-avg-pool-uneven": (lambda x: F.adaptive_avg_pool2d(x.reshape(2, 2, 6, 5), (4, 3)),
                                 lambda x: _uneven(x, lambda w: w.mean((-2, -1)))),
    "adaptive-max-pool-uneven": (lambda x: F.adaptive_max_pool2d(x.reshape(2, 2, 6, 5), (4, 3)),
                                 lambda x: _uneven(x, lambda w: w.amax((-2, -1)))),
    "nearest-exact": (lambda x: F.interpolate(x.reshape(4, 1, 6, 5), scale_factor=2, mode="nearest-exact"),
                      lambda x: x.reshape(4, 1, 6, 1, 5, 1).expand(4, 1, 6, 2, 5, 2).reshape(4, 1, 12, 10)),
    "nearest-exact-1d": (lambda x: F.interpolate(x, scale_factor=3, mode="nearest-exact"),
                         lambda x: x.reshape(4, 6, 5, 1).expand(4, 6, 5, 3).reshape(4, 6, 15)),
    "nearest-exact-3d": (lambda x: F.interpolate(x.reshape(1, 4, 6, 5, 1), scale_factor=(1, 2, 2),
                                                 mode="nearest-exact"),
                         lambda x: x.reshape(1, 4, 6, 5, 1, 1, 1).expand(1, 4, 6, 5, 2, 1, 2).reshape(1, 4, 6, 10, 2)),
    # (pixel floor((i + 1/2) in / out): rows 0, 2, 3, 5 of 6; columns 0, 1, 1, 2, 3, 3, 4 of 5)
    "nearest-exact-fraction": (lambda x: F.interpolate(x.reshape(4, 1, 6, 5), size=(4, 7), mode="nearest-exact"),
                               lambda x: x.reshape(4, 1, 6, 5)[:, :, [0, 2, 3, 5]][..., [0, 1, 1, 2, 3, 3, 4]]),
    "upsample-1d": (lambda x: F.interpolate(x, scale_factor=3),
                    lambda x: x.reshape(4, 6, 5, 1).expand(4, 6, 5, 3).reshape(4, 6, 15)),
    "upsample-3d": (lambda x: F.interpolate(x.reshape(1, 4, 6, 5, 1), scale_factor=2),
                    lambda x: x.reshape(1, 4, 6, 1, 5, 1, 1, 1).expand(1, 4, 6, 2, 5, 2, 1, 2)
                    .reshape(1, 4, 12, 10, 2)),
    "pixel-shuffle": (lambda x: F.pixel_shuffle(x[:, :4].reshape(1, 16, 5, 1), 2),
                      lambda x: x[:, :4].reshape(1, 4, 2, 2, 5, 1).permute(0, 1, 4, 2, 5, 3).reshape(1, 4, 10, 2)),
    "slices": (lambda x: x[:, 1:4] * x[:, 3:] + x[:, 2].unsqueeze(1), lambda x: x[:, 1:4] * x[:, 3:] + x[:, 2:3]),
    "embedding-bag-sum": (lambda x: F.embedding_bag(_BAG_IDS, x.reshape(24, 5), _BAG_OFFSETS, mode="sum",
                                                    per_sample_weights=_BAG_WEIGHTS), lambda x: _bags(x, "sum")),
    "embedding-bag-mean": (lambda x: F.embedding_bag(_BAG_IDS, x.reshape(24, 5), _BAG_OFFSETS, mode="mean",
                                                     padding_idx=4), lambda x: _bags(x, "mean", padding_idx=4)),
    "embedding-bag-max": (lambda x: F.embedding_bag(_BAG_IDS[:6], x.reshape(24, 5), _BAG_OFFSETS[:2], mode="max"),
                          lambda x: torch.stack([x.reshape(24, 5)[_BAG_IDS[:3]].amax(0),
                                                 x.reshape(24, 5)[_BAG_IDS[3:6]].amax(0)])),
    "glu": (lambda x: F.glu(x, 1), lambda x: x[:, :3] * torch.sigmoid(x[:, 3:])),
    "prod": (lambda x: x.prod(1), lambda x: functools.reduce(torch.mul, x.unbind(1))),
    "prod-all": (lambda x: x[0, :2].prod(), lambda x: functools.reduce(torch.mul, x[0, :2].reshape(-1).unbind(0))),
    "soft_margin": (lambda x: F.soft_margin_loss(x, _LABELS * 2 - 1),
                    lambda x: torch.log1p(torch.exp(-(x * (_LABELS * 2 - 1)))).mean(_ALL)),
    "linear-upsample": (lambda x: F.interpolate(x, scale_factor=2, mode="linear"),
                        lambda x: _linear(x, 10, False, 2.0)),
    "linear-resample": (lambda x: F.interpolate(x, size=3, mode="linear", align_corners=True),
                        lambda x: _linear(x, 3, True, None)),
    "trilinear": (lambda x: F.interpolate(x.reshape(1, 1, 4, 6, 5), size=(5, 8, 3), mode="trilinear"),
                  lambda x: _separable(x.reshape(1, 1, 4, 6, 5), (5, 8, 3), False)),
    "trilinear-corners": (lambda x: F.interpolate(x.reshape(1, 2, 2, 6, 5), size=(3, 4, 7), mode="trilinear",
                                                  align_corners=True),
                          lambda x: _separable(x.reshape(1, 2, 2, 6, 5), (3, 4, 7), True)),
    "bilinear": (lambda x: F.interpolate(x.reshape(2, 2, 6, 5), size=(9, 4), mode="bilinear"),
                 lambda x: _separable(x.reshape(2, 2, 6, 5), (9, 4), False)),
    "pixel-cross-entropy": (lambda x: F.cross_entropy(x, _PIXELS),
                            lambda x: F.nll_loss(F.log_softmax(x, 1).movedim(1, -1).reshape(-1, 6),
                                                 _PIXELS.reshape(-1))),
    "pixel-cross-entropy-weighted": (
        lambda x: F.cross_entropy(x.unsqueeze(-1), _IGNORED.unsqueeze(-1), _CLASS_WEIGHT, reduction="sum"),
        lambda x: F.nll_loss(F.log_softmax(x.unsqueeze(-1), 1).movedim(1, -1).reshape(-1, 6), _IGNORED.reshape(-1),
                             _CLASS_WEIGHT, reduction="sum")),
    "pixel-cross-entropy-none": (lambda x: F.cross_entropy(x, _PIXELS, reduction="none"),
                                 lambda x: F.nll_loss(F.log_softmax(x, 1).movedim(1, -1).reshape(-1, 6),
                                                      _PIXELS.reshape(-1), reduction="none").reshape(4, 5)),
    "softshrink": (lambda x: F.softshrink(x, 0.75),
                   lambda x: torch.where(x > 0.75, x - 0.75, torch.where(x < -0.75, x + 0.75, torch.zeros_like(x)))),
    "hardshrink": (lambda x: F.hardshrink(x, 0.75), lambda x: torch.where(x.abs() > 0.75, x, torch.zeros_like(x))),
    "fold": (lambda x: F.fold(x.reshape(1, 24, 5), (2, 6), 2), lambda x: _fold(x.reshape(1, 24, 5), (2, 6), 2)),
    "cdist": (lambda x: torch.cdist(x, _TARGET[:, :4]), lambda x: torch.sqrt((_pairs(x) * _pairs(x)).sum(-1))),
    "multi-margin": (lambda x: F.multi_margin_loss(x.reshape(24, 5), _CLASSES, margin=0.7),
                     lambda x: _written_margins(x, 1, None, "mean")),
    "multi-margin-squared-weighted": (
        lambda x: F.multi_margin_loss(x.reshape(24, 5), _CLASSES, p=2, margin=0.7, weight=_WEIGHT, reduction="sum"),
        lambda x: _written_margins(x, 2, _WEIGHT, "sum")),
    "multi-margin-none": (lambda x: F.multi_margin_loss(x.reshape(24, 5), _CLASSES, margin=0.7, reduction="none"),
                          lambda x: _written_margins(x, 1, None, "none")),
    "cdist-p1": (lambda x: torch.cdist(x, _TARGET[:, :4], p=1), lambda x: _pairs(x).abs().sum(-1)),
    "cdist-inf": (lambda x: torch.cdist(x, _TARGET[:, :4], p=math.inf), lambda x: _pairs(x).abs().amax(-1)),
    "cdist-p3": (lambda x: torch.cdist(x, _TARGET[:, :4], p=3),
                 lambda x: torch.pow(torch.pow(_pairs(x).abs(), 3).sum(-1), 1 / 3)),
    "fold-padded": (lambda x: F.fold(x[:, :4, :4], (2, 3), 2, padding=1, stride=2),
                    lambda x: _fold(x[:, :4, :4], (2, 3), 2, padding=1, stride=2)),
    "group_norm": (lambda x: F.group_norm(x, 2, eps=1e-3),
                   lambda x: _written_layer_norm(x.reshape(4, 2, -1), [-1], None, None, 1e-3).reshape(x.shape)),
}


@pytest.mark.parametrize("resolution", ["log", "exact"])
@pytest.mark.parametrize("name", list(DEFINITIONS))
def test_a_composite_computes_its_definitions_bits_and_log(name: str, resolution: str) -> None:
    x = _grid(4, 6, 5, seed=13)
    composite, definition = DEFINITIONS[name]
    with torch.no_grad():
        got, got_log = _rounded(lambda: composite(x), resolution)
        want, want_log = _rounded(lambda: definition(x), resolution)
    assert torch.equal(got, want) and got_log == want_log


def _written_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, masked: torch.Tensor,
                       bias: torch.Tensor | None, scale: float) -> torch.Tensor:
    # vtrain.composites' attention in registry ops: scores, masked, the shifted exponentials, their sum (a row
    # with every key masked: m = 0, z = 1), the log-sum-exp
    s = (q.flatten(0, 1) @ k.flatten(0, 1).transpose(1, 2)) * scale
    if bias is not None:
        s = s + bias
    m = s.masked_fill(masked, -math.inf).amax(-1, keepdim=True)
    m = m.masked_fill(m == -math.inf, 0.0)
    e = torch.exp(torch.where(masked, m, s) - m).masked_fill(masked, 0.0)
    z = e.sum(-1, keepdim=True)
    z = z.masked_fill(z == 0, 1.0)
    out = (e / z @ v.flatten(0, 1)).reshape(*q.shape[:-1], v.shape[-1])
    _ = m + torch.log(z)  # (the log-sum-exp the composite returns for the backward pass: in the log too)
    return out


_EMPTY_ROW = torch.ones(5, 5, dtype=torch.bool).tril()
_EMPTY_ROW[2] = False  # (a query that may attend to no key)


@pytest.mark.parametrize("resolution", ["log", "exact"])
@pytest.mark.parametrize("case", ["causal", "float-mask", "bool-mask"])
def test_attention_computes_its_definitions_bits_and_log(case: str, resolution: str) -> None:
    q, k, v = _grid(2, 3, 5, 4, seed=1), _grid(2, 3, 5, 4, seed=2), _grid(2, 3, 5, 4, seed=3)
    bias = _grid(5, 5, seed=4) if case == "float-mask" else None
    mask = {"causal": None, "float-mask": bias, "bool-mask": _EMPTY_ROW}[case]
    masked = {"causal": torch.ones(5, 5, dtype=torch.bool).triu(1), "float-mask": torch.zeros(5, 5, dtype=torch.bool),
              "bool-mask": ~_EMPTY_ROW}[case]
    with torch.no_grad():
        got, got_log = _rounded(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                       is_causal=case == "causal", scale=0.375),
                                resolution)
        want, want_log = _rounded(lambda: _written_attention(q, k, v, masked, bias, 0.375), resolution)
    assert torch.equal(got, want) and got_log == want_log
    if case == "bool-mask":  # (torch's kernel gives 0 there too)
        assert not got[:, :, 2].any()


def test_attention_with_dropout_inside_is_refused_by_name() -> None:
    q = _grid(1, 1, 4, 4, seed=1)
    with pytest.raises(UnsupportedOpError, match="dropout_p=0.5"):
        _rounded(lambda: aten._scaled_dot_product_flash_attention_for_cpu(q, q, q, 0.5, True))


def test_safe_softmax_gives_zeros_along_a_line_of_minus_infinity_and_softmax_elsewhere() -> None:
    x = _grid(3, 4, seed=5)
    x[1] = -math.inf
    got, _ = _rounded(lambda: aten._safe_softmax(x, -1))
    want, _ = _rounded(lambda: torch.softmax(x[[0, 2]], -1))
    assert torch.equal(got[1], torch.zeros(4, dtype=torch.float64)) and torch.equal(got[[0, 2]], want)


def test_a_masked_softmax_under_the_exact_resolution_is_the_same_on_every_device() -> None:
    # canonical softmax's subtraction x - max(x) had an infinite output at a -inf (a mask): now 0 there, the
    # other values exp(x - max) / sum as before, on every device alike
    x = _grid(4, 6, seed=14)
    masked = x.masked_fill(torch.ones(4, 6, dtype=torch.bool).triu(1), -math.inf)
    got = [_rounded(lambda: torch.softmax(masked, -1), "exact", device)[0] for device in ("cpu", *EMULATED)]
    assert all(torch.equal(got[0], other) for other in got[1:])
    assert not got[0][0, 1:].any() and got[0][0, 0] == 1
    assert (got[0] - torch.softmax(masked, -1)).abs().max() <= 2.0**-24


@pytest.mark.parametrize("by", ["scale_tril", "covariance_matrix"])
def test_a_multivariate_normals_log_density_is_the_same_on_every_device_and_near_torchs(by: str) -> None:
    # by its scale_tril (diag_embed, the triangular solve, the log-determinant's diagonal) or its covariance
    # matrix (its Cholesky factor first, and in the backward pass the factor's gradient)
    x = _grid(4, 6, 5, seed=13)
    scale, points = torch.tril(x[0, :5, :5], -1) * 0.5 + torch.diag(x[1, 0].abs() + 1), x[2, :, :5]
    matrix = (scale @ scale.mT).requires_grad_()

    def density(loc: torch.Tensor) -> tuple[torch.Tensor, ...]:
        made = distributions.MultivariateNormal(loc, **({by: scale} if by == "scale_tril" else {by: matrix}))
        lp = made.log_prob(points).sum()
        return (lp, *torch.autograd.grad(lp, [loc] + ([matrix] if by == "covariance_matrix" else [])))

    loc = x[3, 0].clone().requires_grad_()
    got = [_rounded(lambda: density(loc), "exact", device)[0] for device in ["cpu", *EMULATED]]
    assert len(got) > 2 and all(torch.equal(a, b) for other in got[1:] for a, b in zip(got[0], other))
    for a, b in zip(got[0], density(loc)):
        _close(a, b)


def test_a_cholesky_factorisation_reports_the_leading_minor_that_is_not_positive_definite_as_torch_does() -> None:
    a = _positive_definite(_grid(4, 6, 5, seed=13))
    a[0, 2, 2], a[1] = -40.0, -a[1]  # (the third leading minor of the first, the first of the second)
    (got, info), _ = _rounded(lambda: torch.linalg.cholesky_ex(a))
    assert info.tolist() == torch.linalg.cholesky_ex(a).info.tolist() == [3, 1]
    assert torch.equal(got[0, :2, :2], _rounded(lambda: torch.linalg.cholesky(a[0, :2, :2]))[0])  # (the minors before)
    with pytest.raises(torch.linalg.LinAlgError, match="order 3 is not positive-definite"):
        _rounded(lambda: torch.linalg.cholesky(a))


def test_scatter_reduce_by_an_unknown_reduction_is_refused_by_name() -> None:
    x = _grid(4, 6, 5, seed=1)
    with pytest.raises(UnsupportedOpError, match=r"scatter_reduce.*reduce='median'"):
        _rounded(lambda: torch.scatter_reduce(x, 2, _SCATTER_INDEX, _TARGET, "median"))


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_nearest_upsampling_by_a_fraction_is_refused_by_name_in_the_backward_pass(mode: str) -> None:
    # (its forward pass copies values; its backward pass would sum a varying number of them per pixel)
    x = _grid(1, 2, 4, 5, seed=1).requires_grad_()
    op = "upsample_nearest2d_backward" if mode == "nearest" else "_upsample_nearest_exact2d_backward"
    with pytest.raises(UnsupportedOpError, match=rf"{op}.*output \[6, 7\]"):
        _rounded(lambda: F.interpolate(x, size=(6, 7), mode=mode).sum().backward())


@pytest.mark.parametrize("resolution", ["log", "exact"])
@pytest.mark.parametrize("clip", ["norm", "value"])
def test_gradient_clipping_by_default_computes_the_loops_bits_and_log(clip: str, resolution: str) -> None:
    # clip_grad_norm_ and clip_grad_value_ run torch's foreach ops by default (_foreach_norm, _foreach_mul_,
    # _foreach_clamp_min_ and _max_): each tensor's op in turn, so the loop's bits (foreach=False) and log
    grads = [_grid(7, 5, seed=1) * 2.0**-3, _grid(7, seed=2), _grid(3, 7, seed=3) * 2.0**40]

    def clipped(foreach: bool | None) -> list[torch.Tensor]:
        params = [nn.Parameter(torch.zeros_like(g)) for g in grads]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        if clip == "norm":
            nn.utils.clip_grad_norm_(params, 1.5, foreach=foreach)
        else:
            nn.utils.clip_grad_value_(params, 0.75, foreach=foreach)
        return [p.grad for p in params]

    (got, log), (want, want_log) = (_rounded(functools.partial(clipped, f), resolution) for f in (None, False))
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and log == want_log
    if clip == "norm":  # (one rounded scale for all: the huge gradient's norm sets it)
        total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in got]))
        assert 1.5 * (1 - 2.0**-20) < total <= 1.5 * (1 + 2.0**-20)
    else:
        assert all((g.abs() <= 0.75).all() for g in got) and any((g.abs() == 0.75).any() for g in got)
    assert all(torch.equal(g, round_to_grid(g, 32)) for g in got)


def _lists(*seeds: int) -> list[list[torch.Tensor]]:
    return [[_grid(3, 4, seed=s), _grid(5, seed=s + 1), _grid(2, 2, 2, seed=s + 2)] for s in seeds]


_SCALARS = [0.5, -1.5, 0.1]
_FOREACH = {  # name -> (the foreach call on three lists a, b, c, the loop it stands for)
    "add_.Scalar": (lambda a, b, c: torch._foreach_add_(a, 0.3), lambda a, b, c: [t.add_(0.3) for t in a]),
    "add_.List": (lambda a, b, c: torch._foreach_add_(a, b, alpha=-0.5),
                  lambda a, b, c: [t.add_(u, alpha=-0.5) for t, u in zip(a, b)]),
    "add_.ScalarList": (lambda a, b, c: torch._foreach_add_(a, [0.1, 2.0, -3.0]),
                        lambda a, b, c: [t.add_(s) for t, s in zip(a, [0.1, 2.0, -3.0])]),
    "add_.Tensor": (lambda a, b, c: torch._foreach_add_(a, torch.tensor(0.7, dtype=torch.float64)),
                    lambda a, b, c: [t.add_(torch.tensor(0.7, dtype=torch.float64)) for t in a]),
    "addcmul_.Scalar": (lambda a, b, c: torch._foreach_addcmul_(a, b, c, 0.25),
                        lambda a, b, c: [t.addcmul_(u, v, value=0.25) for t, u, v in zip(a, b, c)]),
    "addcdiv_.ScalarList": (lambda a, b, c: torch._foreach_addcdiv_(a, b, c, _SCALARS),
                            lambda a, b, c: [t.addcdiv_(u, v, value=s) for t, u, v, s in zip(a, b, c, _SCALARS)]),
    "addcmul_.Tensor": (lambda a, b, c: torch._foreach_addcmul_(a, b, c, torch.tensor(_SCALARS, dtype=torch.float64)),
                        lambda a, b, c: [t.addcmul_(u, v, value=s) for t, u, v, s in zip(a, b, c, _SCALARS)]),
    "lerp_.List": (lambda a, b, c: torch._foreach_lerp_(a, b, c),
                   lambda a, b, c: [t.lerp_(u, v) for t, u, v in zip(a, b, c)]),
    "lerp.ScalarList": (lambda a, b, c: torch._foreach_lerp(a, b, [0.1, 0.9, 0.3]),
                        lambda a, b, c: [t.lerp(u, s) for t, u, s in zip(a, b, [0.1, 0.9, 0.3])]),
    "div.ScalarList": (lambda a, b, c: torch._foreach_div(a, [3.0, 7.0, 0.1]),
                       lambda a, b, c: [t / s for t, s in zip(a, [3.0, 7.0, 0.1])]),
    "sqrt": (lambda a, b, c: torch._foreach_sqrt(torch._foreach_abs(b)), lambda a, b, c: [t.abs().sqrt() for t in b]),
    "exp_": (lambda a, b, c: torch._foreach_exp_(a), lambda a, b, c: [t.exp_() for t in a]),
    "maximum_.List": (lambda a, b, c: torch._foreach_maximum_(a, c),
                      lambda a, b, c: [torch.maximum(t, v, out=t) for t, v in zip(a, c)]),
    "copy_": (lambda a, b, c: torch._foreach_copy_(a, c), lambda a, b, c: [t.copy_(v) for t, v in zip(a, c)]),
}


@pytest.mark.parametrize("name", list(_FOREACH))
def test_a_foreach_op_is_its_per_tensor_op_in_turn(name: str) -> None:
    # every form of argument the mapping reads: a scalar, a second list, a list of scalars, one tensor, a tensor of
    # scalars, keyword-only ones (alpha; addcmul's value), and an in-place op aten has no in-place form of
    foreach, loop = _FOREACH[name]
    results = []
    for fn in (foreach, loop):
        a, b, c = _lists(1, 10, 20)
        out, log = _rounded(lambda: fn(a, b, c))
        results.append((out, a, log))
    (out, a, log), (want_out, want_a, want_log) = results
    if out is not None:  # (the in-place ops return nothing; their lists hold the results)
        a, want_a = out, want_out
    assert all(torch.equal(x, y) for x, y in zip(a, want_a)) and log == want_log
    assert all(torch.equal(x, round_to_grid(x, 32)) for x in a)


_OPTIMIZERS = {
    "adam": lambda ps, f: torch.optim.Adam(ps, lr=1e-2, foreach=f),
    "adamw": lambda ps, f: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, foreach=f),
    "adam-amsgrad": lambda ps, f: torch.optim.Adam(ps, lr=1e-2, amsgrad=True, foreach=f),
    "adamax": lambda ps, f: torch.optim.Adamax(ps, lr=1e-2, foreach=f),
    "sgd": lambda ps, f: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-3, foreach=f),
    "rmsprop": lambda ps, f: torch.optim.RMSprop(ps, lr=1e-2, momentum=0.5, foreach=f),
    "adadelta": lambda ps, f: torch.optim.Adadelta(ps, foreach=f),
    "adagrad": lambda ps, f: torch.optim.Adagrad(ps, lr=1e-2, foreach=f),
    "nadam": lambda ps, f: torch.optim.NAdam(ps, lr=1e-2, foreach=f),
}
_REORDERED = {"adagrad", "nadam"}  # (torch's foreach code orders their operations otherwise than the loop)


def _optimized(make: Any, foreach: bool, device: str, resolution: str = "log") -> tuple[list, list]:
    """Three steps of a small tanh MLP with `make(parameters, foreach)`: (the weights and optimizer state, the
    step logs)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(round_to_grid(p, 32))
    opt, logs = make(list(model.parameters()), foreach), []
    for t in range(3):
        x = _grid(4, 5, seed=t)
        with RoundedExecution(bits=32, device=get_device(device), step=t, resolution=resolution) as rx:
            opt.zero_grad()
            (model(x) * model(x)).sum().backward()
            opt.step()
        logs.append(rx.log.to_bytes())
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return [t.detach().clone() for t in (*model.parameters(), *state)], logs


@pytest.mark.parametrize("name", list(_OPTIMIZERS))
def test_torch_optimizers_foreach_ops_train_to_the_same_bits_on_every_device(name: str) -> None:
    # torch.optim's multi-tensor code (foreach=True, the default on CUDA) runs each foreach op as its per-tensor op
    # on each tensor in turn: where that code does the loop's operations, the loop's bits and logs
    make = _OPTIMIZERS[name]
    got, logs = _optimized(make, True, "cpu")
    want, want_logs = _optimized(make, False, "cpu")
    if name not in _REORDERED:
        assert all(torch.equal(a, b) for a, b in zip(got, want)) and logs == want_logs
    exact = _optimized(make, True, "cpu", "exact")[0]
    for device in EMULATED:
        assert all(torch.equal(a, b) for a, b in zip(exact, _optimized(make, True, device, "exact")[0])), device


_FUSED = {  # torch.optim's fused kernels, with every option their loops read (maximize, amsgrad, nesterov, ...)
    "adam": lambda ps, **k: torch.optim.Adam(ps, lr=1e-2, **k),
    "adam-decay-tensor-lr": lambda ps, **k: torch.optim.Adam(ps, lr=torch.tensor(1e-2), weight_decay=0.1, **k),
    "adamw-amsgrad-maximize": lambda ps, **k: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, amsgrad=True,
                                                                  maximize=True, **k),
    "adamw-tensor-lr": lambda ps, **k: torch.optim.AdamW(ps, lr=torch.tensor(1e-2), weight_decay=0.1, **k),
    "sgd": lambda ps, **k: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, dampening=0.1, weight_decay=1e-3, **k),
    "sgd-nesterov-maximize-tensor-lr": lambda ps, **k: torch.optim.SGD(ps, lr=torch.tensor(1e-2), momentum=0.9,
                                                                      nesterov=True, maximize=True, **k),
    "sgd-no-momentum": lambda ps, **k: torch.optim.SGD(ps, lr=1e-2, **k),
    "adagrad": lambda ps, **k: torch.optim.Adagrad(ps, lr=1e-2, lr_decay=0.01, weight_decay=0.1, **k),
    "adagrad-tensor-lr": lambda ps, **k: torch.optim.Adagrad(ps, lr=torch.tensor(1e-2), maximize=True, **k),
}


@pytest.mark.parametrize("name", list(_FUSED))
def test_torch_optimizers_fused_kernels_train_to_the_loops_bits_and_log(name: str) -> None:
    # fused=True dispatches one kernel for all parameters (aten._fused_adam_ and its like): each parameter's update
    # is the single-tensor loop's (foreach=False) op for op, so its bits and log, and the same on every device
    def make(fused: bool) -> Any:
        return lambda ps, _: _FUSED[name](ps, **({"fused": True} if fused else {"foreach": False}))

    got, logs = _optimized(make(True), True, "cpu")
    want, want_logs = _optimized(make(False), False, "cpu")
    assert all(torch.equal(a, b) for a, b in zip(got, want)) and logs == want_logs
    exact = _optimized(make(True), True, "cpu", "exact")[0]
    for device in EMULATED:
        assert all(torch.equal(a, b) for a, b in zip(exact, _optimized(make(True), True, device, "exact")[0])), device


def test_a_fused_optimizer_step_with_a_gradient_scaler_is_refused_by_name() -> None:
    p = nn.Parameter(_grid(3, seed=1))
    p.grad = _grid(3, seed=2)
    opt = torch.optim.Adam([p], lr=1e-2, fused=True)
    opt.grad_scale = torch.tensor(2.0, dtype=torch.float64)  # (as torch.amp.GradScaler hands it to the step)
    with pytest.raises(UnsupportedOpError, match=r"aten._fused_adam_.*GradScaler"):
        _rounded(lambda: opt.step())


def test_embedding_max_norm_scales_each_named_row_beyond_it_in_place() -> None:
    # embedding_renorm_: each row the indices name (once, however often named) whose norm exceeds max_norm times
    # max_norm / (norm + 1e-7) in float64, one rounded product a value; under `exact` the norm is the correctly
    # rounded sqrt of the correctly rounded sum of rounded squares, written out here in fractions
    table, idx = _grid(6, 4, seed=70) * 2, torch.tensor([[4, 0, 4], [2, 5, 0]])
    table[2] *= 2.0**-5  # (a named row within max_norm: kept)
    want = table.clone()
    for r in sorted(set(idx.reshape(-1).tolist())):
        squares = [Fraction(float(np.float32(v * v))) for v in table[r].tolist()]
        norm = float(np.float32(np.sqrt(ref_round_q(sum(squares), 23))))
        if norm > 2.5:
            want[r] = torch.tensor([float(np.float32(v * (2.5 / (norm + 1e-7)))) for v in table[r].tolist()],
                                   dtype=torch.float64)
    # (named rows scaled, but the one within max_norm; unnamed rows kept)
    assert not torch.equal(want[[0, 4, 5]], table[[0, 4, 5]]) and torch.equal(want[[1, 2, 3]], table[[1, 2, 3]])
    with torch.no_grad():
        weight = table.clone()
        out, _ = _rounded(lambda: F.embedding(idx, weight, max_norm=2.5), "exact")
    assert torch.equal(weight, want) and torch.equal(out, want[idx])


def test_max_unpooling_places_each_value_at_its_index_and_refuses_an_index_twice_in_a_plane() -> None:
    x = _grid(2, 3, 6, 6, seed=71)
    pooled, indices = F.max_pool2d(x, 2, return_indices=True)
    leaf = pooled.clone().requires_grad_()
    g = _grid(2, 3, 6, 6, seed=72)
    with RoundedExecution(bits=32, device=get_device("cpu"), mode="record"):
        out = F.max_unpool2d(leaf, indices, 2)
        (out * g).sum().backward()
    assert torch.equal(out, F.max_unpool2d(pooled, indices, 2)) and out.count_nonzero() == pooled.numel()
    assert torch.equal(leaf.grad, g.flatten(-2).gather(-1, indices.flatten(-2)).view_as(pooled))
    _, overlapping = F.max_pool2d(x, 3, stride=1, return_indices=True)  # (windows that share their maximum)
    with pytest.raises(UnsupportedOpError, match="aten.max_unpool2d.*repeats"):
        _rounded(lambda: aten.max_unpool2d(x[..., :4, :4], overlapping, [6, 6]))


def _normed_steps(device: str) -> list[torch.Tensor]:
    """Two SGD steps under `exact` of a tanh MLP whose layers carry torch's weight_norm and spectral_norm
    parametrizations (the latter's power iteration normalises into its vectors with out= and takes a vdot)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(5, 7)), nn.Tanh(),
                          nn.utils.parametrizations.spectral_norm(nn.Linear(7, 3))).double()
    with torch.no_grad():
        for t in (*model.parameters(), *model.buffers()):
            t.copy_(round_to_grid(t, 32))
    opt, xs = torch.optim.SGD(model.parameters(), lr=0.1), [_grid(4, 5, seed=t) for t in range(2)]
    for t, x in enumerate(xs):
        with RoundedExecution(bits=32, device=get_device(device), step=t, resolution="exact"):
            opt.zero_grad()
            (model(x) ** 2).sum().backward()
            opt.step()
    return [t.detach().clone() for t in (*model.parameters(), *model.buffers())]


def test_weight_and_spectral_norm_parametrizations_train_to_the_same_bits_on_every_device() -> None:
    want = _normed_steps("cpu")
    assert all(torch.equal(t, round_to_grid(t, 32)) for t in want)
    for device in EMULATED:
        assert all(torch.equal(a, b) for a, b in zip(want, _normed_steps(device))), device


def test_vector_norms_of_other_orders_are_refused_by_name() -> None:
    x = _grid(4, seed=1)
    with pytest.raises(UnsupportedOpError, match=r"linalg_vector_norm.*ord=3"):
        _rounded(lambda: torch.linalg.vector_norm(x, ord=3))


@pytest.mark.parametrize("resolution", ["log", "exact"])
def test_nn_layer_norm_computes_the_written_out_modules_forward_bits_and_log(resolution: str) -> None:
    x, w, b = _grid(4, 6, 16, seed=1), _grid(16, seed=2), _grid(16, seed=3)
    torch_ln, ours = nn.LayerNorm(16).double(), LayerNorm(16).double()
    with torch.no_grad():
        for m in (torch_ln, ours):
            m.weight.copy_(w)
            m.bias.copy_(b)
    with torch.no_grad():
        got, got_log = _rounded(lambda: torch_ln(x), resolution)
        want, want_log = _rounded(lambda: ours(x), resolution)
    assert torch.equal(got, want) and got_log == want_log
    # two normalised dims, and no affine parts (torch's weight and bias then are None)
    with torch.no_grad():
        got, got_log = _rounded(lambda: F.layer_norm(x, (6, 16), eps=1e-3), resolution)
        want, want_log = _rounded(lambda: _written_layer_norm(x, [-2, -1], None, None, 1e-3), resolution)
    assert torch.equal(got, want) and got_log == want_log


@pytest.mark.parametrize("resolution", ["log", "exact"])
@pytest.mark.parametrize("training", [True, False])
def test_nn_batch_norm_computes_the_written_out_modules_forward_bits_and_running_statistics(
        resolution: str, training: bool) -> None:
    x, w, b = _grid(5, 3, 4, 4, seed=4), _grid(3, seed=5), _grid(3, seed=6)
    torch_bn, ours = nn.BatchNorm2d(3, momentum=0.3).double(), BatchNorm2d(3, momentum=0.3).double()
    with torch.no_grad():
        for m in (torch_bn, ours):
            m.weight.copy_(w)
            m.bias.copy_(b)
            m.running_mean.copy_(_grid(3, seed=7))
            m.running_var.copy_(_grid(3, seed=8).abs())
            m.train(training)
    with torch.no_grad():
        got, got_log = _rounded(lambda: torch_bn(x), resolution)
        want, want_log = _rounded(lambda: ours(x), resolution)
    assert torch.equal(got, want) and got_log == want_log
    assert torch.equal(torch_bn.running_mean, ours.running_mean)
    assert torch.equal(torch_bn.running_var, ours.running_var)
    if training:  # (the update ran: the running statistics moved off their start)
        assert not torch.equal(torch_bn.running_mean, _grid(3, seed=7))


def _close(got: torch.Tensor | None, want: torch.Tensor | None) -> None:
    # Each op of the composite is rounded to float32's grid (2^-24 relative), the native kernel's float64 result
    # is not: the gradients agree to within a few such roundings of their largest value
    assert (got is None) == (want is None)
    if got is not None:
        assert got.shape == want.shape
        assert (got - want).abs().max() <= 2.0**-18 * want.abs().max()


def _gradients(module: nn.Module, x: torch.Tensor, grad_out: torch.Tensor, rounded: bool) -> list:
    x = x.detach().clone().requires_grad_()
    for p in module.parameters():
        p.grad = None
    if rounded:
        with RoundedExecution(bits=32, device=get_device("cpu"), mode="record"):
            (module(x) * grad_out).sum().backward()
    else:
        (module(x) * grad_out).sum().backward()
    return [x.grad, *(p.grad for p in module.parameters())]


class _Applied(nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


# Not compared: saturated probabilities (where the grid's sigmoid is 1, torch's float64 one is not, and the gradient
# there is (p - target) / max((1 - p) p, 1e-12)), and a masked log-sum-exp, whose backward pass (torch's
# grad exp(x - result)) puts the mask's -inf into a subtraction
_NO_GRADIENT = {"bce-probabilities-ends", "bce-backward-ends", "logsumexp-masked", "nearest-exact-fraction"}
_FUNCTIONS = {name: fns[0] for name, fns in DEFINITIONS.items() if name not in _NO_GRADIENT}
# (torch's own compositions of the ops above: their gradients)
_FUNCTIONS["kl_div"] = lambda x: F.kl_div(F.log_softmax(x, -1), torch.softmax(_TARGET, -1), reduction="batchmean")
_FUNCTIONS["cosine_similarity"] = lambda x: F.cosine_similarity(x, _TARGET, dim=-1)
_REPEATS = torch.tensor([[[0, 4, 0, 0, 2, 1, 0]]]).expand(4, 6, 7)  # (position 0 gathered four times a line)
_FUNCTIONS["gather"] = lambda x: torch.gather(x, 2, _REPEATS) * _TARGET[:, :, :1]
_FUNCTIONS["index_select"] = lambda x: x.index_select(1, torch.tensor([5, 0, 5, 2, 5])) * x[:, :5]
_FUNCTIONS["cummax"] = lambda x: torch.cummax(x, 1).values + torch.cummin(x, 2).values
_FUNCTIONS["take"] = lambda x: torch.take(x, torch.tensor([[7, 0, 119], [3, 64, 8]])) * x[0, :2, :3]
_FUNCTIONS["nan_to_num"] = lambda x: torch.nan_to_num(x, nan=0.0) * x
_FUNCTIONS["masked_select"] = lambda x: torch.masked_select(x, _MASK) * x[_MASK]
_FUNCTIONS["median"] = lambda x: torch.median(x, 1).values + torch.kthvalue(x, 2, 2).values[:, :1]
_FUNCTIONS["quantile"] = lambda x: torch.quantile(x, 0.3, 1) * torch.frac(x[:, 0])
_FUNCTIONS["index_copy"] = lambda x: x.index_copy(1, torch.tensor([4, 0]), _TARGET[:, :2] * x[:, 2:4])


@pytest.mark.parametrize("resolution", ["log", "exact"])
def test_scatter_add_adds_each_value_in_order_rounding_after_each_addition(resolution: str) -> None:
    # (gather's and index_select's backward passes) one IEEE addition per value, a position's values in src's flat
    # order, each sum rounded onto the grid: written out in Python floats (float64 additions, float32 roundings)
    x, src = _grid(3, 4, seed=40), _grid(3, 9, seed=41) * 2.0**-12  # (small values: roundings that show)
    index = torch.tensor([[0, 0, 0, 3, 0, 1, 0, 3, 0], [2, 2, 2, 2, 2, 2, 2, 2, 2], [1, 3, 0, 2, 1, 3, 0, 2, 1]])
    # at (0, 0): 0 + 1 + 2^-24 + 2^-24 ... stays 1 (each tie to even), where the reverse order would give 1 + 2^-23
    x[0, 0], src[0, :3] = 0.0, torch.tensor([1.0, 2.0**-24, 2.0**-24], dtype=torch.float64)
    for idx in (index, index[:, :6]):  # (src read over index's shape only)
        want = x.tolist()
        for i, j in np.ndindex(*idx.shape):
            k = int(idx[i, j])
            want[i][k] = float(np.float32(want[i][k] + float(src[i, j])))
        got, log = _rounded(lambda: torch.scatter_add(x, 1, idx, src), resolution)
        assert torch.equal(got, torch.tensor(want, dtype=torch.float64)) and not StepLog.from_bytes(log).sites
    added, _ = _rounded(lambda: torch.index_add(x.T, 0, index[2], src.T, alpha=0.5), resolution)
    expected, _ = _rounded(lambda: torch.scatter_add(x.T, 0, index[2].reshape(9, 1).expand(9, 3), src.T * 0.5),
                           resolution)
    assert torch.equal(added, expected)


@pytest.mark.parametrize("resolution", ["log", "exact"])
def test_embedding_bags_per_sample_weights_gradient_sums_each_rows_rounded_products(resolution: str) -> None:
    # an index's gradient: its bag's gradient times its table row, each product rounded, summed over the row (the
    # device's sum), 0 at padding_idx (4); the empty second bag gives none
    table, g = _grid(24, 5, seed=62), _grid(4, 5, seed=63)
    weights = _BAG_WEIGHTS.clone().requires_grad_()

    def bags() -> torch.Tensor:
        out = F.embedding_bag(_BAG_IDS, table, _BAG_OFFSETS, mode="sum", per_sample_weights=weights, padding_idx=4)
        return torch.autograd.grad(out, weights, g)[0]

    def written() -> torch.Tensor:
        sums = (table.index_select(0, _BAG_IDS) * g.index_select(0, _BAG_OF)).sum(1)
        return torch.where(_BAG_IDS != 4, sums, torch.zeros((), dtype=torch.float64))

    got, want = _rounded(bags, resolution)[0], _rounded(written, resolution)[0]
    assert torch.equal(got, want) and bool((got[_BAG_IDS == 4] == 0).all())
    assert torch.allclose(got, bags(), rtol=2.0**-20, atol=0)  # (torch's own gradient, float64)


def test_multilabel_margin_loss_and_its_gradient_are_torchs_terms_each_rounded_and_summed_exactly() -> None:
    # each sample's listed targets j (up to the first -1; a repeated one counts twice) against its other classes
    # d: z = (1 - x_j) + x_d, each operation rounded, the positive ones summed (under `exact`: the correctly
    # rounded exact sum), over the class count; the gradient g = 1 / (N C) times each class's gains less its
    # losses, one rounded product, times the loss's gradient: written out in Python floats and Fractions
    x = _grid(6, 5, seed=64).requires_grad_()
    target = torch.tensor([[3, 0, -1, 1, 1], [0, 1, 2, 3, 4], [-1, 2, 2, 2, 2], [4, 4, -1, 0, 0], [2, -1, 0, 0, 0],
                           [1, 3, 0, -1, 4]])

    def r(v: float | Fraction) -> float:
        return ref_round_q(v, 23) if isinstance(v, Fraction) else _f32(v)

    per, gains, xs = [], np.zeros((6, 5)), x.detach()
    for n in range(6):
        listed = list(itertools.takewhile(lambda k: k >= 0, target[n].tolist()))
        terms = []
        for j in listed:
            for d in set(range(5)) - set(listed):
                z = r(r(1 - float(xs[n, j])) + float(xs[n, d]))
                if z > 0:
                    terms.append(z)
                    gains[n, d] += 1
                    gains[n, j] -= 1
        per.append(r(Fraction(r(sum(map(Fraction, terms), Fraction(0)))) / 5))
    want_loss = r(sum(map(Fraction, per), Fraction(0)) / 6)
    want_grad = [[r(r(k / 30) * 1.0) for k in row] for row in gains]

    def both() -> tuple:
        loss = F.multilabel_margin_loss(x, target)
        return loss, torch.autograd.grad(loss, x)[0]

    (loss, grad), log = _rounded(both, "exact")
    assert loss.item() == want_loss and grad.tolist() == want_grad and not StepLog.from_bytes(log).sites
    torch_loss = F.multilabel_margin_loss(x, target)
    assert torch.allclose(loss, torch_loss, rtol=2.0**-20, atol=0)
    assert torch.allclose(grad, torch.autograd.grad(torch_loss, x)[0], rtol=2.0**-20, atol=0)


def _padded_source(j: int, size: int, before: int, reflect: bool) -> int:
    """The input index output j of a padded dim reads, written out."""
    k = j - before
    if reflect:
        return -k if k < 0 else 2 * (size - 1) - k if k >= size else k
    return min(max(k, 0), size - 1)


@pytest.mark.parametrize("resolution", ["log", "exact"])
@pytest.mark.parametrize("mode,shape,pad", [("reflect", (2, 3, 7), (2, 3)), ("replicate", (2, 3, 7), (3, 1)),
                                            ("reflect", (2, 2, 5, 6), (1, 2, 3, 1)),
                                            ("replicate", (1, 2, 4, 5), (2, 2, 1, 3)),
                                            ("reflect", (1, 2, 3, 4, 5), (1, 1, 2, 1, 0, 2)),
                                            ("replicate", (1, 1, 3, 2, 4), (1, 2, 2, 1, 3, 2))])
def test_padding_gradients_add_each_outputs_gradient_in_order_rounding_after_each(mode: str, shape: tuple,
                                                                                  pad: tuple, resolution: str) -> None:
    # reflection and replication padding's backward passes: an input value's gradient is 0 plus the gradients of
    # the outputs that read it, in the output's row-major order, each sum rounded onto the grid; written out in
    # Python floats (float64 additions, float32 roundings)
    x = _grid(*shape, seed=50).requires_grad_()
    padded = F.pad(x.detach(), pad, mode=mode).shape
    g = _grid(*padded, seed=51) * 2.0 ** torch.randint(-30, 1, padded, generator=torch.Generator().manual_seed(52))
    dims = len(pad) // 2
    spatial = shape[-dims:]
    before = [pad[2 * (dims - 1 - d)] for d in range(dims)]
    want = np.zeros(shape)
    for lead in np.ndindex(*shape[:-dims]):
        for out in np.ndindex(*g.shape[-dims:]):
            src = lead + tuple(_padded_source(j, n, b, mode == "reflect") for j, n, b in zip(out, spatial, before))
            want[src] = float(np.float32(want[src] + float(g[lead + out])))
    (got,), log = _rounded(lambda: torch.autograd.grad(F.pad(x, pad, mode=mode), x, g), resolution)
    assert torch.equal(got, torch.from_numpy(want)) and not StepLog.from_bytes(log).sites


@pytest.mark.parametrize("resolution", ["log", "exact"])
def test_cumulative_sums_and_products_round_each_partial_result_in_order(resolution: str) -> None:
    # y_0 = x_0, y_i = y_(i-1) op x_i, each rounded onto the grid: written out in Python floats; integers as torch
    x = _grid(3, 40, seed=53) * 2.0 ** torch.randint(-20, 1, (3, 40), generator=torch.Generator().manual_seed(54))
    for op, fn, dim in ((torch.cumsum, float.__add__, 1), (torch.cumprod, float.__mul__, 1),
                        (torch.cumsum, float.__add__, 0), (torch.cumprod, float.__mul__, -2)):
        want = x.clone()
        lines = want if dim == 1 else want.T
        for line in lines:
            for i in range(1, line.numel()):
                line[i] = float(np.float32(fn(float(line[i - 1]), float(line[i]))))
        got, log = _rounded(lambda: op(x, dim), resolution)
        assert torch.equal(got, want) and not StepLog.from_bytes(log).sites
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 1, 1, 1, 1]])
    ids, _ = _rounded(lambda: (mask.cumsum(-1), (mask > 0).cumsum(1), mask.cumprod(0)), resolution)
    assert all(torch.equal(a, b) for a, b in zip(ids, (mask.cumsum(-1), (mask > 0).cumsum(1), mask.cumprod(0))))
    (widened, ), _ = _rounded(lambda: (mask.cumsum(1, dtype=torch.float64),), resolution)
    assert torch.equal(widened, mask.cumsum(1).double())
    empty = torch.zeros(3, 0, dtype=torch.float64)  # (nothing to add or multiply: torch's empty results, and 1s)
    got, _ = _rounded(lambda: (empty.cumsum(1), empty.cumprod(0), empty.prod(1), empty.prod(0), empty.prod()),
                      resolution)
    want = (empty.cumsum(1), empty.cumprod(0), empty.prod(1), empty.prod(0), empty.prod())
    assert all(a.shape == b.shape and torch.equal(a, b) for a, b in zip(got, want))


def _source(size: int, out_size: int, align_corners: bool, scale: float | None, j: int) -> float:
    """Output j's real source position along one dim, as torch places it, written out in Python floats (not yet
    clamped at 0)."""
    if align_corners:
        return (size - 1) / (out_size - 1) * j if out_size > 1 else 0.0
    return (1.0 / scale if scale else size / out_size) * (j + 0.5) - 0.5


def _linear_taps(size: int, out_size: int, align_corners: bool,
                 scale: float | None) -> list[tuple[list[int], list[float]]]:
    """torch's linear interpolation taps and weights along one dim, written out in Python floats."""
    taps = []
    for j in range(out_size):
        real = max(_source(size, out_size, align_corners, scale, j), 0.0)
        first = min(math.floor(real), size - 1)
        w1 = min(max(real - first, 0.0), 1.0)
        taps.append(([first, first + 1 if first < size - 1 else first], [1.0 - w1, w1]))
    return taps


def _cubic_taps(size: int, out_size: int, align_corners: bool,
                scale: float | None) -> list[tuple[list[int], list[float]]]:
    """torch's bicubic taps (floor - 1 to floor + 2, clamped to the edges) and cubic convolution weights (A = -0.75)
    along one dim, written out in Python floats."""
    a, taps = -0.75, []
    for j in range(out_size):
        real = _source(size, out_size, align_corners, scale, j)  # (not clamped at 0)
        first = min(math.floor(real), size - 1)
        t = min(max(real - first, 0.0), 1.0)
        near = [((a + 2) * v - (a + 3)) * v * v + 1 for v in (t, 1 - t)]
        far = [((a * v - 5 * a) * v + 8 * a) * v - 4 * a for v in (t + 1, 2 - t)]
        taps.append(([min(max(first + k, 0), size - 1) for k in (-1, 0, 1, 2)], [far[0], near[0], near[1], far[1]]))
    return taps


def _grid_sampled(x: torch.Tensor, grid: torch.Tensor, mode: str, padding: str, align: bool) -> list:
    """F.grid_sample written out in Python floats, each operation rounded onto the FP32 grid (`_f32`): torch's
    source index, then the nearest value or the four corners' weighted values in the order nw, ne, sw, se."""
    n, c, h, w = x.shape
    out = [[[[0.0] * grid.shape[2] for _ in range(grid.shape[1])] for _ in range(c)] for _ in range(n)]

    def index(v: float, size: int) -> float:
        i = _f32(_f32(_f32(v + 1) / 2) * (size - 1)) if align else _f32(_f32(_f32(_f32(v + 1) * size) - 1) / 2)
        return min(max(i, 0.0), size - 1.0) if padding == "border" else i

    def at(b: int, ch: int, yy: float, xx: float) -> float:
        return float(x[b, ch, int(yy), int(xx)]) if 0 <= yy <= h - 1 and 0 <= xx <= w - 1 else 0.0

    for b, i, j in itertools.product(range(n), range(grid.shape[1]), range(grid.shape[2])):
        ix, iy = index(float(grid[b, i, j, 0]), w), index(float(grid[b, i, j, 1]), h)
        for ch in range(c):
            if mode == "nearest":
                out[b][ch][i][j] = at(b, ch, round(iy), round(ix))  # (half to even)
                continue
            x0, y0 = math.floor(ix), math.floor(iy)
            wx, ny = _f32(ix - x0), _f32(iy - y0)
            ex, sy = _f32(1 - wx), _f32(1 - ny)
            corners = [(y0, x0, _f32(sy * ex)), (y0, x0 + 1, _f32(sy * wx)), (y0 + 1, x0, _f32(ny * ex)),
                       (y0 + 1, x0 + 1, _f32(ny * wx))]
            total = None
            for yy, xx, weight in corners:
                term = _f32(at(b, ch, yy, xx) * weight)
                total = term if total is None else _f32(total + term)
            out[b][ch][i][j] = total
    return out


def _f32(v: float) -> float:
    return float(np.float32(v))


@pytest.mark.parametrize("align", [False, True])
@pytest.mark.parametrize("padding", ["zeros", "border"])
@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
def test_grid_sample_rounds_each_operation_of_torchs_formula(mode: str, padding: str, align: bool) -> None:
    # points inside, on the edges and outside the image (where zeros and border padding differ); the forward pass
    # is IEEE operations only (no site in the log); the gradients agree with torch's kernel, and train to the
    # same bits on every device under `exact` (the grid's gradient sums over channels: a device op)
    x = _grid(2, 3, 5, 6, seed=70)
    grid = round_to_grid(torch.rand(2, 4, 7, 2, generator=torch.Generator().manual_seed(71), dtype=torch.float64)
                         * 2.5 - 1.25, 32)
    grid[0, 0, :3] = torch.tensor([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.25]], dtype=torch.float64)
    got, log = _rounded(lambda: F.grid_sample(x, grid, mode=mode, padding_mode=padding, align_corners=align))
    assert got.tolist() == _grid_sampled(x, grid, mode, padding, align) and not StepLog.from_bytes(log).sites

    def gradients(device: str, resolution: str) -> tuple[torch.Tensor, torch.Tensor]:
        xs, gs = x.clone().requires_grad_(), grid.clone().requires_grad_()

        def run() -> None:
            y = F.grid_sample(xs, gs, mode=mode, padding_mode=padding, align_corners=align)
            (y * y).sum().backward()

        _rounded(run, resolution, device)
        return xs.grad, gs.grad

    xs, gs = x.clone().requires_grad_(), grid.clone().requires_grad_()
    y = F.grid_sample(xs, gs, mode=mode, padding_mode=padding, align_corners=align)
    (y * y).sum().backward()
    for got_grad, want in zip(gradients("cpu", "log"), (xs.grad, gs.grad)):
        assert torch.allclose(got_grad, want, rtol=1e-5, atol=1e-5 * want.abs().max())
    exact = gradients("cpu", "exact")
    for device in EMULATED:
        assert all(torch.equal(a, b) for a, b in zip(exact, gradients(device, "exact"))), device


@pytest.mark.parametrize("start,end,steps", [(-1.0, 1.0, 7), (-1.0, 1.0, 6), (0.0, 10.0, 4), (2.5, -0.3, 5),
                                             (0.1, 2.0, 1)])
def test_linspace_is_torchs_formula_each_operation_rounded(start: float, end: float, steps: int) -> None:
    step = (end - start) / max(steps - 1, 1)
    want = [_f32(start + _f32(i * step)) if i < steps // 2 or steps == 1 else _f32(end - _f32((steps - 1 - i) * step))
            for i in range(steps)]
    got, log = _rounded(lambda: torch.linspace(start, end, steps, dtype=torch.float64))
    assert got.tolist() == want and not StepLog.from_bytes(log).sites


@pytest.mark.parametrize("align", [False, True])
def test_a_spatial_transformer_trains_to_the_same_bits_on_every_device(align: bool) -> None:
    # F.affine_grid (torch's base grid from linspace, a bmm) into F.grid_sample, theta's gradient through both:
    # close to torch's own kernels (theta puts no grid point on a whole pixel coordinate, where sampling's gradient
    # jumps and the roundings may pick either side), and under `exact` the same bits on every device
    x = _grid(2, 3, 5, 6, seed=80)
    theta0 = round_to_grid(torch.tensor([[[0.93, 0.17, 0.11], [-0.13, 1.07, 0.05]],
                                         [[1.13, 0.03, -0.21], [0.29, 0.83, 0.01]]], dtype=torch.float64), 32)

    def gradient(device: str | None, resolution: str = "log") -> tuple[torch.Tensor, torch.Tensor]:
        theta = theta0.clone().requires_grad_()

        def run() -> torch.Tensor:
            grid = F.affine_grid(theta, (2, 3, 4, 7), align_corners=align)
            y = F.grid_sample(x, grid, align_corners=align)
            (y * y).sum().backward()
            return grid.detach()

        grid = run() if device is None else _rounded(run, resolution, device)[0]
        return grid, theta.grad

    want_grid, want = gradient(None)
    grid, got = gradient("cpu")
    assert torch.allclose(grid, want_grid, rtol=0, atol=1e-6) and torch.allclose(got, want, rtol=1e-5)
    exact = gradient("cpu", "exact")
    for device in EMULATED:
        assert all(torch.equal(a, b) for a, b in zip(exact, gradient(device, "exact"))), device


def test_grid_sample_by_bicubic_or_reflection_is_refused_by_name() -> None:
    x, grid = _grid(1, 1, 3, 3, seed=1), torch.zeros(1, 2, 2, 2, dtype=torch.float64)
    for kw in ({"mode": "bicubic"}, {"padding_mode": "reflection"}):
        with pytest.raises(UnsupportedOpError, match="grid_sampler_2d.*bilinear and nearest"):
            _rounded(lambda: F.grid_sample(x, grid, align_corners=False, **kw))


_RESAMPLED = [((8, 12), False, 2.0), ((5, 7), True, None), ((7, 3), False, None), ((3, 4), False, None),
              ((6, 9), False, 1.5)]  # (size, align_corners, scale)


@pytest.mark.parametrize("resolution", ["log", "exact"])
@pytest.mark.parametrize("size,align_corners,scale", _RESAMPLED)
@pytest.mark.parametrize("mode,taps", [("bilinear", _linear_taps), ("bicubic", _cubic_taps)],
                         ids=["bilinear", "bicubic"])
def test_upsampling_and_its_gradient_round_each_operation_of_torchs_formula(
        mode: str, taps: Any, size: tuple, align_corners: bool, scale: float | None, resolution: str) -> None:
    # forward sum_a h_a (sum_b w_b x_ab), each sum in tap order (bilinear: h0 (w0 x00 + w1 x01) + h1 (w0 x10 +
    # w1 x11)); backward each output's gradient times h_a w_b added into its taps in order (a bicubic tap clamped
    # at an edge repeats), from 0: each operation rounded onto the grid, written out in Python floats
    x = _grid(2, 3, 4, 6, seed=55).requires_grad_()
    g = _grid(2, 3, *size, seed=56) * 2.0 ** torch.randint(-20, 1, (2, 3, *size),
                                                             generator=torch.Generator().manual_seed(57))
    hs, ws = taps(4, size[0], align_corners, scale), taps(6, size[1], align_corners, scale)

    def tap_sum(values: list[float], weights: list[float]) -> float:
        out = _f32(weights[0] * values[0])
        for v, w in zip(values[1:], weights[1:]):
            out = _f32(out + _f32(w * v))
        return out

    want_y, want_g = np.zeros((2, 3, *size)), np.zeros((2, 3, 4, 6))
    for n, c, i, j in np.ndindex(2, 3, *size):
        (rows, hw), (cols, ww), xs = hs[i], ws[j], x.detach()[n, c]
        want_y[n, c, i, j] = tap_sum([tap_sum([float(xs[h, w]) for w in cols], ww) for h in rows], hw)
        for h, a in zip(rows, hw):
            for w, b in zip(cols, ww):
                want_g[n, c, h, w] = _f32(want_g[n, c, h, w] + _f32(float(g[n, c, i, j]) * (a * b)))
    kw = {"size": size} if scale is None else {"scale_factor": scale}

    def both() -> tuple:
        y = F.interpolate(x, mode=mode, align_corners=align_corners, **kw)
        return y, torch.autograd.grad(y, x, g)[0]

    (y, grad), log = _rounded(both, resolution)
    assert torch.equal(y, torch.from_numpy(want_y)) and torch.equal(grad, torch.from_numpy(want_g))
    assert not StepLog.from_bytes(log).sites


_BIAS = _grid(5, 7, seed=6)
_MINUS_INF = _grid(5, 5, seed=10).masked_fill(~_EMPTY_ROW, -math.inf)  # (finite values, -inf, a row of -inf)
_ATTENTION = {  # (q, k and v's shapes, the call): 3-d operands, or v's width another, take torch's math path
    "attention-causal": ((2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 5, 4),
                         lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    "attention-float-mask": ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4),
                             lambda q, k, v: F.scaled_dot_product_attention(q, k, v, _BIAS, scale=0.3)),
    "attention-math": ((3, 5, 4), (3, 7, 4), (3, 7, 6), lambda q, k, v: F.scaled_dot_product_attention(q, k, v)),
    "attention-causal-wide": ((2, 3, 5, 4), (2, 3, 7, 4), (2, 3, 7, 4),
                              lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    "attention-bool-mask": ((2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 5, 4),
                            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, _EMPTY_ROW)),
    "attention-minus-inf": ((2, 3, 5, 4), (2, 3, 5, 4), (2, 3, 5, 4),
                            lambda q, k, v: F.scaled_dot_product_attention(q, k, v, _MINUS_INF)),
    "attention-grouped": ((2, 4, 5, 4), (2, 2, 5, 4), (2, 2, 5, 4),
                          lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)),
}


class _Attending(nn.Module):
    def __init__(self, shapes: tuple, fn: Any) -> None:
        super().__init__()
        self.k, self.v = nn.Parameter(_grid(*shapes[1], seed=7)), nn.Parameter(_grid(*shapes[2], seed=8))
        self.fn = fn

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return self.fn(q, self.k, self.v)


@pytest.mark.parametrize("case", ["layer", "layer-plain", "layer-2d", "layer-unbatched", "batch2d", "batch2d-eval",
                                  "batch1d-plain", "batch-untracked", "group", "group-plain", "prelu-module",
                                  *_FUNCTIONS, *_ATTENTION])
def test_composite_gradients_agree_with_torchs_kernels(case: str) -> None:
    if case in _ATTENTION:
        *shapes, fn = _ATTENTION[case]
        module, x = _Attending(shapes, fn).double(), _grid(*shapes[0], seed=9)
    elif case in _FUNCTIONS:
        module, x = _Applied(_FUNCTIONS[case]), _grid(4, 6, 5, seed=9)
    elif case == "prelu-module":  # (its weight's gradient: autograd sums the kernel's over the other dims)
        module, x = nn.PReLU(6).double(), _grid(4, 6, 5, seed=9)
    elif case.startswith("group"):
        module, x = nn.GroupNorm(2, 4, affine=case == "group").double(), _grid(3, 4, 2, 5, seed=9)
    elif case.startswith("layer"):
        shape = (6, 16) if case == "layer-2d" else (16,)
        module = nn.LayerNorm(shape, elementwise_affine=case != "layer-plain").double()
        x = _grid(16, seed=9) if case == "layer-unbatched" else _grid(3, 6, 16, seed=9)
    else:
        module = (nn.BatchNorm1d(5, affine=False) if case == "batch1d-plain" else
                  nn.BatchNorm2d(5, track_running_stats=case != "batch-untracked")).double()
        x = _grid(8, 5, seed=9) if case == "batch1d-plain" else _grid(4, 5, 3, 3, seed=9)
        module.train(case != "batch2d-eval")
        if case == "batch2d-eval":
            with torch.no_grad():
                module.running_mean.copy_(_grid(5, seed=10))
                module.running_var.copy_(_grid(5, seed=11).abs())
    with torch.no_grad():
        for i, p in enumerate(module.parameters()):
            p.copy_(_grid(*p.shape, seed=20 + i) * (0.3 if case in _ATTENTION else 1))
    grad_out = _grid(*module(x).shape, seed=12)
    native = _gradients(module, x, grad_out, rounded=False)
    for got, want in zip(_gradients(module, x, grad_out, rounded=True), native):
        _close(got, want)


class _Normed(nn.Module):
    """Convolutions with torch's batch and group norms, linear layers with its layer norm, SiLU, leaky ReLU and
    causal attention over four tokens, a head: on digits."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.conv2, self.gn = nn.Conv2d(4, 4, 3, padding=1), nn.GroupNorm(2, 4)
        self.fc, self.ln, self.head = nn.Linear(256, 32), nn.LayerNorm(32), nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.bn(self.conv(x.reshape(-1, 1, 8, 8))))
        h = self.fc(F.leaky_relu(self.gn(self.conv2(h))).flatten(1)).reshape(-1, 1, 4, 8)
        h = F.scaled_dot_product_attention(h, h, h, is_causal=True).flatten(1)
        return self.head(F.relu(self.ln(h)))


def _steps(make: Any, optimizer: Any, loss: Any, device: str, mode: str, logs: list | None,
           resolution: str, seed: int | None = None) -> tuple[list, list, int]:
    """Four steps of the model `make()` with `optimizer(parameters)` on `loss(model, step)`, gradients clipped to
    norm 1, in float32 work at bits = 19 (the scale models' regime, whose bands are wide): (the weights, buffers
    and optimizer state, the step logs, the corrections a replay made)."""
    torch.manual_seed(0)
    model = make().float()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(round_to_grid(p, 19))
    opt = optimizer(model.parameters())
    out, corrections = [], 0
    for t in range(4):
        with RoundedExecution(bits=19, device=get_device(device), mode=mode, step=t, resolution=resolution,
                              replay_log=None if logs is None else logs[t], seed=seed) as rx:
            opt.zero_grad()
            loss(model, t).backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # (torch's foreach ops, as it runs by default)
            opt.step()
        out.append(rx.log)
        corrections += rx.stats["corrections"]
    state = [*model.parameters(), *model.buffers(), *(v for s in opt.state.values() for v in s.values())]
    return [t.detach().clone() for t in state], out, corrections


_DIGITS = [batch(t, torch.float32) for t in range(4)]


def _digits_loss(model: nn.Module, t: int) -> torch.Tensor:
    x, y = _DIGITS[t]
    return F.cross_entropy(model(x), y)


def _train(device: str, mode: str, logs: list | None = None, resolution: str = "log") -> tuple[list, list, int]:
    """`_steps` of `_Normed` with Adam on digits."""
    return _steps(_Normed, lambda ps: torch.optim.Adam(ps, lr=3e-3, foreach=False), _digits_loss, device, mode, logs,
                  resolution)


def test_a_model_with_torchs_norms_replays_bit_identically_on_every_device() -> None:
    trainer, logs, _ = _train("cpu", "record")
    assert {"aten.mean.dim", "aten.sum.dim_IntList"} <= {s.op for log in logs for s in log.sites}
    corrections = 0
    for auditor in EMULATED:
        replayed, _, fixed = _train(auditor, "replay", logs)
        assert all(torch.equal(a, b) for a, b in zip(trainer, replayed)), auditor
        corrections += fixed
    assert corrections > 0  # (the log did work: some device rounded some value the other way by itself)


def test_a_model_with_torchs_norms_trains_to_the_same_bits_everywhere_under_the_exact_resolution() -> None:
    want, logs, _ = _train("cpu", "record", resolution="exact")
    assert all(not log.sites for log in logs)
    for device in EMULATED:
        got, _, _ = _train(device, "record", resolution="exact")
        assert all(torch.equal(a, b) for a, b in zip(want, got)), device


class _TorchGPT(nn.Module):
    """A GPT in nanoGPT's layout written with torch's own modules: embeddings, pre-LayerNorm blocks (no biases in
    the norms) of causal scaled dot-product attention and a GELU MLP, a head tied to the token embedding."""

    def __init__(self, vocab: int = 17, width: int = 16, heads: int = 2, layers: int = 2, context: int = 8) -> None:
        super().__init__()
        self.heads = heads
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "ln_1": nn.LayerNorm(width, bias=False), "attn": nn.Linear(width, 3 * width),
            "proj": nn.Linear(width, width), "ln_2": nn.LayerNorm(width, bias=False),
            "fc": nn.Linear(width, 4 * width), "out": nn.Linear(4 * width, width),
        }) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        b, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for blk in self.blocks:
            q, k, v = blk["attn"](blk["ln_1"](x)).split(x.shape[-1], dim=2)
            q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
            x = x + blk["proj"](y)
            x = x + blk["out"](F.gelu(blk["fc"](blk["ln_2"](x))))
        return self.ln_f(x) @ self.wte.weight.T


_TOKENS = torch.randint(0, 17, (4, 4, 9), generator=torch.Generator().manual_seed(1))


def _next_token_loss(model: nn.Module, t: int) -> torch.Tensor:
    logits = model(_TOKENS[t, :, :-1])
    return F.cross_entropy(logits.reshape(-1, 17), _TOKENS[t, :, 1:].reshape(-1))


def _train_gpt(device: str, mode: str, logs: list | None = None, resolution: str = "log") -> tuple[list, list, int]:
    """`_steps` of `_TorchGPT` with AdamW on random tokens."""
    return _steps(_TorchGPT, lambda ps: torch.optim.AdamW(ps, lr=1e-2, foreach=False), _next_token_loss, device, mode,
                  logs, resolution)


def _replicates(train: Any) -> None:
    """`train(device, mode, logs, resolution)`'s model replays the CPU trainer's log bit for bit on every emulated
    device, with corrections, and trains to the same bits everywhere under `exact`, with no log."""
    trainer, logs, _ = train("cpu", "record")
    corrections = 0
    for auditor in EMULATED:
        replayed, _, fixed = train(auditor, "replay", logs)
        assert all(torch.equal(a, b) for a, b in zip(trainer, replayed)), auditor
        corrections += fixed
    assert corrections > 0  # (the log did work)
    want, exact_logs, _ = train("cpu", "record", resolution="exact")
    assert all(not log.sites for log in exact_logs)
    for device in EMULATED:
        assert all(torch.equal(a, b) for a, b in zip(want, train(device, "record", resolution="exact")[0])), device


def test_a_gpt_written_with_torchs_modules_replays_bit_identically_on_every_device() -> None:
    _replicates(_train_gpt)


class _Recurrent(nn.Module):
    """A 1-d convolution along the digits' eight rows, an LSTM and a GRU over them, multi-head self-attention with
    a residual, PReLU, and a head on the last position (the backward passes of selecting and slicing, and the
    recurrent layers' splits)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(8, 8, 3, padding=1)
        self.lstm, self.gru = nn.LSTM(8, 12, batch_first=True), nn.GRU(12, 12, batch_first=True)
        self.attn = nn.MultiheadAttention(12, 2, batch_first=True)
        self.act, self.head = nn.PReLU(12), nn.Linear(12, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gru(self.lstm(self.conv(x.reshape(-1, 8, 8)).transpose(1, 2))[0])[0]
        h = h + self.attn(h, h, h, need_weights=False)[0]
        return self.head(self.act(h[:, -1]))


def _train_recurrent(device: str, mode: str, logs: list | None = None,
                     resolution: str = "log") -> tuple[list, list, int]:
    """`_steps` of `_Recurrent` with SGD (momentum) on digits, oneDNN's fused float32 LSTM kernel off."""
    with torch.backends.mkldnn.flags(enabled=False):
        return _steps(_Recurrent, lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, foreach=False),
                      _digits_loss, device, mode, logs, resolution)


@pytest.mark.filterwarnings("ignore:TF32 acceleration")  # (torch's, as its mkldnn flags are set)
def test_recurrent_layers_and_multi_head_attention_train_to_the_same_bits_on_every_device() -> None:
    _replicates(_train_recurrent)


class _Padded(nn.Module):
    """Convolutions over the digits' 8 x 8 images with reflected and replicated edges (2-d and, along the rows,
    1-d) after a first one with zeros, so that every padding's backward pass runs, bilinear resampling to 6 x 6,
    and a cumulative sum and product along the columns (cumsum's backward pass is a flipped cumsum, cumprod's
    torch's formula)."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv2d(1, 4, 3, padding=1)
        self.conv = nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect")
        self.conv2 = nn.Conv2d(4, 4, 3, padding=2, padding_mode="replicate")
        self.rows = nn.Conv1d(8, 8, 3, padding=1, padding_mode="reflect")
        self.head = nn.Linear(4 * 6 * 6 + 64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.first(x.reshape(-1, 1, 8, 8)))
        r = torch.tanh(self.rows(h.mean(1)))
        r = r.cumsum(-1) * 0.25 + r.cumprod(-1)
        h = F.interpolate(self.conv2(torch.tanh(self.conv(h))), size=(6, 6), mode="bilinear")
        return self.head(torch.cat([h.flatten(1), r.flatten(1)], 1))


def _train_padded(device: str, mode: str, logs: list | None = None, resolution: str = "log") -> tuple[list, list, int]:
    """`_steps` of `_Padded` with Adam on digits."""
    return _steps(_Padded, lambda ps: torch.optim.Adam(ps, lr=3e-3, foreach=False), _digits_loss, device, mode, logs,
                  resolution)


def test_padded_convolutions_resampling_and_cumulative_ops_train_to_the_same_bits_on_every_device() -> None:
    _replicates(_train_padded)


class _Coder(nn.Module):
    """An encoder and decoder over the digits' 8 x 8 images: a depthwise (groups = channels) convolution, a 3-d one
    over its channels as depth and a transposed 3-d one back, a grouped strided convolution down to 4 x 4, grouped
    transposed convolutions back up to 8 x 8 (output padding) and, along the rows, a 1-d one, and bicubic
    resampling to 10 x 10; the emulated devices run them all, and the exact resolution reads a transposed
    convolution's sums through the one it transposes."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv2d(1, 4, 3, padding=1)
        self.depthwise = nn.Conv2d(4, 4, 3, padding=1, groups=4)
        self.volume, self.unvolume = nn.Conv3d(1, 2, (2, 3, 3), padding=(0, 1, 1)), nn.ConvTranspose3d(2, 1, (2, 1, 1))
        self.down = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
        self.up = nn.ConvTranspose2d(6, 4, 3, stride=2, padding=1, output_padding=1, groups=2)
        self.rows = nn.ConvTranspose1d(8, 4, 3, stride=2, dilation=2, bias=False)
        self.head = nn.Linear(4 * 10 * 10 + 4 * 19, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.depthwise(torch.tanh(self.first(x.reshape(-1, 1, 8, 8)))))
        h = h + self.unvolume(torch.tanh(self.volume(h.unsqueeze(1)))).squeeze(1)
        up = torch.tanh(self.up(torch.tanh(self.down(h))))
        r = torch.tanh(self.rows(up.mean(1)))
        up = F.interpolate(up, size=(10, 10), mode="bicubic", align_corners=True)
        return self.head(torch.cat([up.flatten(1), r.flatten(1)], 1))


def _train_coder(device: str, mode: str, logs: list | None = None, resolution: str = "log") -> tuple[list, list, int]:
    """`_steps` of `_Coder` with Adam on digits."""
    return _steps(_Coder, lambda ps: torch.optim.Adam(ps, lr=3e-3, foreach=False), _digits_loss, device, mode, logs,
                  resolution)


def test_grouped_transposed_and_3d_convolutions_train_to_the_same_bits_on_every_device(
        monkeypatch: pytest.MonkeyPatch) -> None:
    read, terms = set(), resolve._transposed_terms

    def reading(op, args, kwargs, i):  # noqa: ANN001, ANN202
        out = terms(op, args, kwargs, i)
        if out is not None:
            read.add(op)
        return out

    monkeypatch.setattr(resolve, "_transposed_terms", reading)
    _replicates(_train_coder)
    # (the exact resolution recomputed values of the transposed convolutions and of their backward)
    assert read == {aten.convolution.default, aten.convolution_backward.default}


class _Dropped(nn.Module):
    """torch's dropout modules in training: `nn.Dropout` after a hidden layer, `nn.Dropout2d` on a convolution's
    channels, `nn.AlphaDropout` before the head, and Gaussian noise (`randn_like`) on the hidden layer."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.channels = nn.Conv2d(1, 4, 3, padding=1), nn.Dropout2d(0.25)
        self.hidden, self.drop = nn.Linear(4 * 64, 32), nn.Dropout(0.3)
        self.alpha, self.head = nn.AlphaDropout(0.2), nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.channels(torch.tanh(self.conv(x.reshape(-1, 1, 8, 8))))
        hidden = self.hidden(h.flatten(1))
        hidden = hidden + 0.1 * torch.randn_like(hidden)
        return self.head(self.alpha(torch.tanh(self.drop(torch.tanh(hidden)))))


def _train_dropped(device: str, mode: str, logs: list | None = None, resolution: str = "log",
                   seed: int = 11) -> tuple[list, list, int]:
    """`_steps` of `_Dropped` with Adam on digits, its masks drawn from `seed`."""
    return _steps(_Dropped, lambda ps: torch.optim.Adam(ps, lr=3e-3, foreach=False), _digits_loss, device, mode, logs,
                  resolution, seed)


def test_dropout_modules_train_to_the_same_bits_on_every_device_with_their_masks_from_the_seed() -> None:
    _replicates(_train_dropped)
    other = _train_dropped("cpu", "record", seed=12)[0]  # (the masks decide something)
    assert not all(torch.equal(a, b) for a, b in zip(_train_dropped("cpu", "record")[0], other))


def test_logcumsumexp_is_refused_with_what_to_write_instead() -> None:
    x = _grid(2, 3, seed=61)
    with pytest.raises(UnsupportedOpError, match=r"logcumsumexp.*beyond the grid.*m \+ log\(cumsum\(exp\(x - m\)\)\)"):
        with RoundedExecution(bits=32, device=get_device("cpu"), mode="record"):
            torch.logcumsumexp(x, 1)


def test_onednns_fused_lstm_is_refused_with_the_way_around_it() -> None:
    lstm, x = nn.LSTM(4, 4, batch_first=True), round_to_grid(torch.randn(2, 3, 4), 19)
    with pytest.raises(UnsupportedOpError, match=r"mkldnn_rnn_layer.*mkldnn.flags\(enabled=False\)"):
        with RoundedExecution(bits=19, device=get_device("cpu"), mode="record"):
            lstm(x)
