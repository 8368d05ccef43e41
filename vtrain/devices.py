"""Device profiles: who computes the device-dependent (class 3) ops, and in which order (DESIGN.md §1.4).

`cpu` is torch's native kernels, except float64 sums and means over contiguous tensors: those are
vtrain.fused's, in one fixed order (on any CPU and thread count), computed in the same pass as the sums of
|x| their error bound needs. `cuda` is torch's native kernels on a GPU when one is present. The emulated
profiles `emu:NAME` stand in for other hardware: they compute every matmul and reduction with another fixed
summation order, built from batched torch ops so they stay fast (see research/numerics.md §2):

- emu:splitk8-tree      K split into chunks of 8, one bmm for the partial products, partials combined by
                        a pairwise tree (cuBLAS split-K with a tree reduction); sums by a halving tree.
- emu:splitk16-revseq   chunks of 16, partials accumulated sequentially from the last chunk to the first
                        (serialised split-K fix-up); sums sequentially from the end.
- emu:lanes8-butterfly  K split into 8 interleaved lanes (k mod 8), each lane a native matmul on a
                        strided slice, lanes combined by an xor butterfly (warp shuffle); sums likewise.

On an emulated device, 1-d, 2-d and 3-d convolutions (any groups, transposed too) are im2col + the device's
batched matmul (their backward too), and softmax, log-softmax and the NLL loss normalise with the device's sum.
(Fused elementwise ops such as addcmul are not device ops at all: vtrain.ops decomposes them into IEEE
primitives in a fixed order.) Transcendental functions (exp, log, ...) stay native on every device: we have no
second libm, and reductions and matmuls are where devices really differ. Pooling kernels stay native.
The rounding log's error bounds (vtrain.bounds) hold for any of these orders, and for any IEEE device.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from vtrain.errors import VtrainError

aten = torch.ops.aten

Matmul = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (B, M, K) @ (B, K, N) -> (B, M, N)
RowSum = Callable[[torch.Tensor], torch.Tensor]  # (R, n) -> (R,)


class UnknownDeviceError(VtrainError):
    """A device name that is not one of the profiles `vtrain devices` lists."""


class DeviceOpError(VtrainError):
    """An emulated device was asked for an op configuration it does not emulate."""


# ---------------------------------------------------------------------------------------------------
# Reduction orders. Each takes a batch of problems and returns their results in one fixed order.


def _pad_last(x: torch.Tensor, multiple: int) -> torch.Tensor:
    pad = (-x.shape[-1]) % multiple
    return F.pad(x, (0, pad)) if pad else x  # adding exact zeros changes no partial sum


def _tree(parts: torch.Tensor) -> torch.Tensor:
    """Pairwise tree over dim 0 (an odd leftover is carried to the next level)."""
    while parts.shape[0] > 1:
        n = parts.shape[0]
        half = parts[0 : n - n % 2 : 2] + parts[1 : n - n % 2 : 2]
        parts = torch.cat([half, parts[n - 1 :]]) if n % 2 else half
    return parts[0]


def _butterfly(lanes: torch.Tensor) -> torch.Tensor:
    """xor butterfly over 8 lanes in dim 0: lane l with l^4, then l^2, then l^1."""
    for width in (4, 2, 1):
        lanes = lanes[:width] + lanes[width : 2 * width]
    return lanes[0]


def _revseq(parts: torch.Tensor) -> torch.Tensor:
    """Sequential accumulation over dim 0 from the last element to the first."""
    return parts.flip(0).cumsum(0)[-1]


def _splitk_partials(a: torch.Tensor, b: torch.Tensor, chunk: int) -> torch.Tensor:
    """(nc, B, M, N) partial products of K-chunks of size `chunk`, by one batched matmul."""
    bsz, m, k = a.shape
    n = b.shape[-1]
    a = _pad_last(a, chunk)
    b = _pad_last(b.transpose(1, 2), chunk).transpose(1, 2)
    nc = a.shape[-1] // chunk
    a_c = a.reshape(bsz, m, nc, chunk).permute(2, 0, 1, 3).reshape(nc * bsz, m, chunk)
    b_c = b.reshape(bsz, nc, chunk, n).permute(1, 0, 2, 3).reshape(nc * bsz, chunk, n)
    return torch.bmm(a_c, b_c).reshape(nc, bsz, m, n)


def _mm_splitk8_tree(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _tree(_splitk_partials(a, b, 8))


def _mm_splitk16_revseq(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return _revseq(_splitk_partials(a, b, 16))


def _mm_lanes8_butterfly(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    bsz, m, _ = a.shape
    n = b.shape[-1]
    a = _pad_last(a, 8)
    b = _pad_last(b.transpose(1, 2), 8).transpose(1, 2)
    kl = a.shape[-1] // 8
    # lane l holds k = l, l+8, l+16, ...: (8*B, M, K/8) @ (8*B, K/8, N)
    a_l = a.reshape(bsz, m, kl, 8).permute(3, 0, 1, 2).reshape(8 * bsz, m, kl)
    b_l = b.reshape(bsz, kl, 8, n).permute(2, 0, 1, 3).reshape(8 * bsz, kl, n)
    return _butterfly(torch.bmm(a_l, b_l).reshape(8, bsz, m, n))


def _sum_tree(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    return _tree(_pad_last(x, width).T.contiguous()) if n else x.sum(-1)


def _sum_revseq(x: torch.Tensor) -> torch.Tensor:
    return x.flip(-1).cumsum(-1)[..., -1] if x.shape[-1] else x.sum(-1)


def _sum_lanes8_butterfly(x: torch.Tensor) -> torch.Tensor:
    x = _pad_last(x, 8)
    lanes = x.reshape(x.shape[0], -1, 8).sum(1)  # (R, 8): lane l sums k = l mod 8
    return _butterfly(lanes.T.contiguous())


# ---------------------------------------------------------------------------------------------------
# Devices.


@dataclass(frozen=True)
class Device:
    """A device profile: native kernels (`emulated=False`) or a fixed emulated reduction order."""

    name: str
    description: str
    torch_device: str = "cpu"
    emulated: bool = False
    matmul_order: Matmul | None = field(default=None, repr=False, compare=False)
    rowsum_order: RowSum | None = field(default=None, repr=False, compare=False)

    # -- building blocks ----------------------------------------------------------------------------

    def bmm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """Batched matmul (B, M, K) @ (B, K, N) in this device's order."""
        if self.matmul_order is None:
            return torch.bmm(a, b)
        return self.matmul_order(a, b)

    def mm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.bmm(a.unsqueeze(0), b.unsqueeze(0))[0]

    def sum(self, x: torch.Tensor, dims: list[int] | None = None, keepdim: bool = False) -> torch.Tensor:
        """Sum over `dims` (all when None or empty) in this device's order."""
        nd = x.dim()
        red = _reduced(nd, dims)
        if self.rowsum_order is None or x.numel() == 0 or nd == 0:
            return torch.sum(x, red, keepdim=keepdim) if nd else x.clone()
        keep = [d for d in range(nd) if d not in red]
        rows = x.permute(*keep, *red).reshape(-1, _prod(x.shape[d] for d in red))
        out = self.rowsum_order(rows.contiguous()).reshape([x.shape[d] for d in keep])
        if keepdim:
            for d in red:
                out = out.unsqueeze(d)
        return out

    # -- class 3 ops --------------------------------------------------------------------------------

    def execute(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Compute a device-dependent op (out-of-place overload) the way this device does."""
        if not self.emulated:
            out = _sum_with_abs(func, args, kwargs) if func in _SUMS and self.torch_device == "cpu" else None
            return func(*args, **kwargs) if out is None else out
        impl = _EMULATED.get(func)
        if impl is None:  # transcendental functions and pooling: native on every device (see above)
            return func(*args, **kwargs)
        return impl(self, *args, **kwargs)


_SUMS = frozenset((aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim))


def _sum_with_abs(func: Any, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The CPU's float64 sum or mean (vtrain.fused.sums_with_abs: its own fixed order, and the sums of |x| its
    error bound needs from the same pass, kept for vtrain.bounds), or None where torch's kernel computes it
    (other dtypes and layouts, and lines below fused.BLOCK_SUM_ELEMENTS values in all: there the bound's second
    pass still finds x in cache, where torch's sum is the faster). At 2 MB the one pass wins in a step: GPT-2-tiny
    d_model 256's layer norm means and sums, (8, 128, 256) over the last dim, were torch's sums and the bound's
    pass, 19.8 ms a step in all with the other sums and means, now 18.1 (docs/benchmarks.md, session 34). Alone,
    torch's sum and the bound's pass took 41 and 46 us on x in cache, this one pass 146; on x from memory 104 and
    107, this one 103."""
    from vtrain import fused  # noqa: PLC0415 (numba's import: only processes that round pay it)
    x = args[0]
    if not (isinstance(x, torch.Tensor) and fused.usable(x)):
        return None
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    plan = _sum_plan(func, x.shape, x.stride(), x.dtype, tuple(dim) if dim else (), bool(keepdim), kwargs.get("dtype"))
    if plan is None:
        return None
    columns, view, out_shape, divisor = plan
    if not columns and x.numel() < fused.BLOCK_SUM_ELEMENTS:
        return None
    total, absolute = fused.sums_with_abs(fused.flat(x).reshape(view), columns, divisor)
    out = torch.from_numpy(total.reshape(out_shape))
    fused.remember_abs_sums(out, absolute)
    return out


# A reduction's operands keep their layouts step after step, so each is worked out once: worked out on every call,
# the Python around the kernel took ~136 us a call in a training step (resnet-tiny width 32, 38 calls: 5.2 ms a
# step, torch's whole sums 14.1), since the kernel's pass pushes the interpreter's own memory out of the core's
# caches; now ~65 us (docs/benchmarks.md, session 33).
@functools.lru_cache(maxsize=1024)
def _sum_plan(func: Any, shape: tuple, stride: tuple, dtype: Any, dim: tuple, keepdim: bool,
              out_dtype: Any) -> tuple[bool, tuple, tuple, float] | None:
    """(fused.reduction_view's form and view, the output's shape, the divisor: a mean's count, else 1.0) for a
    contiguous tensor of this layout, or None where `_sum_with_abs` leaves the op to torch."""
    from vtrain import fused  # noqa: PLC0415 (as in _sum_with_abs)
    nd = len(shape)
    if dtype is not torch.float64 or not nd or out_dtype not in (None, dtype) or not _prod(shape):
        return None
    if dim and not (all(-nd <= d < nd for d in dim) and len({d % nd for d in dim}) == len(dim)):
        return None  # (torch's kernel raises the error that names them: a dim out of range, or one twice, as 0 and -nd)
    red = _reduced(nd, dim)
    layout = fused.reduction_view(shape, red)
    if layout is None:
        return None
    columns, view = layout
    divisor = float(_prod(shape[d] for d in red)) if func in (aten.mean.default, aten.mean.dim) else 1.0
    out_shape = tuple(1 if d in red else n for d, n in enumerate(shape)) if keepdim else \
        tuple(n for d, n in enumerate(shape) if d not in red)
    return columns, view, out_shape, divisor


def _reduced(nd: int, dims: Sequence[int] | None) -> list[int]:
    """The dims a reduction over `dims` of an nd-dim tensor sums, ascending and non-negative (all of them for None
    or none)."""
    return sorted({d % nd for d in dims}) if dims else list(range(nd))


def _prod(xs: Any) -> int:
    out = 1
    for v in xs:
        out *= int(v)
    return out


# ---------------------------------------------------------------------------------------------------
# Emulated implementations of class 3 ops, in terms of Device.bmm / Device.sum.


def _mm(dev: Device, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return dev.mm(a, b)


def _bmm(dev: Device, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return dev.bmm(a, b)


def _addmm(dev: Device, bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta: Any = 1,
           alpha: Any = 1) -> torch.Tensor:
    prod = dev.mm(a, b)
    if alpha != 1:
        prod = prod * alpha
    return prod + (bias if beta == 1 else bias * beta)


def _sum(dev: Device, x: torch.Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> torch.Tensor:
    if dtype is not None and dtype != x.dtype:
        x = x.to(dtype)
    if not x.is_floating_point():
        return torch.sum(x, dim, keepdim=keepdim)
    return dev.sum(x, list(dim) if dim else None, keepdim)


def _mean(dev: Device, x: torch.Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> torch.Tensor:
    if dtype is not None and dtype != x.dtype:
        x = x.to(dtype)
    dims = list(dim) if dim else list(range(x.dim()))
    n = _prod(x.shape[d] for d in dims)
    return dev.sum(x, dims, keepdim) / n


def _log_softmax(dev: Device, x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    shifted = x - x.amax(dim, keepdim=True)
    return shifted - torch.log(dev.sum(torch.exp(shifted), [dim], keepdim=True))


def _softmax(dev: Device, x: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
    e = torch.exp(x - x.amax(dim, keepdim=True))
    return e / dev.sum(e, [dim], keepdim=True)


def _log_softmax_backward(dev: Device, grad: torch.Tensor, out: torch.Tensor, dim: int,
                          input_dtype: Any) -> torch.Tensor:
    return grad - torch.exp(out) * dev.sum(grad, [dim], keepdim=True)


def _softmax_backward(dev: Device, grad: torch.Tensor, out: torch.Tensor, dim: int, input_dtype: Any) -> torch.Tensor:
    return out * (grad - dev.sum(grad * out, [dim], keepdim=True))


def _nll_loss_forward(dev: Device, x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None,
                      reduction: int, ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    if x.dim() != 2:
        raise DeviceOpError(f"{dev.name}: nll_loss is emulated for (N, C) inputs only, got shape {tuple(x.shape)}")
    valid = target != ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target))
    w = (weight[safe] if weight is not None else torch.ones_like(x[:, 0])) * valid.to(x.dtype)
    terms = -x.gather(1, safe.unsqueeze(1)).squeeze(1) * w
    if reduction == 0:  # none
        return terms, torch.zeros((), dtype=x.dtype)
    total = dev.sum(w.unsqueeze(0), [1])[0]
    loss = dev.sum(terms.unsqueeze(0), [1])[0]
    return (loss / total if reduction == 1 else loss), total


def _check_conv(dev: Device, x: torch.Tensor) -> None:
    if x.dim() not in (3, 4, 5):
        raise DeviceOpError(f"{dev.name}: convolution is emulated for 1-d, 2-d and 3-d inputs only (got input "
                            f"{tuple(x.shape)}); use device cpu")


def _as_2d(x: torch.Tensor, weight: torch.Tensor, stride: Any, padding: Any, dilation: Any,
           output_padding: Any) -> tuple[torch.Tensor, torch.Tensor, list, list, list, list]:
    """A 1-d convolution's operands and geometry as a 2-d one's of height 1 (the same sums)."""
    return (x.unsqueeze(2), weight.unsqueeze(2), [1, *stride], [0, *padding], [1, *dilation],
            [0, *output_padding])


# A convolution's sums are each a dot product of a weight row and an im2col column: the device's batched matmul,
# one problem per image and group. Its backward and the transposed convolution are the same products read the
# other way: a transposed convolution is the input gradient of the convolution it transposes (same weight, same
# geometry), and its input gradient that convolution's forward. 2-d windows are torch's unfold and fold; 3-d
# ones the same columns from strided views (torch has no 3-d unfold).

def _blocks(size: Sequence[int], kernel: Sequence[int], stride: Any, padding: Any, dilation: Any) -> list[int]:
    """How many windows a convolution slides along each spatial dim of an input of spatial size `size`."""
    return [(size[d] + 2 * padding[d] - dilation[d] * (kernel[d] - 1) - 1) // stride[d] + 1
            for d in range(len(size))]


def _unfold(x: torch.Tensor, kernel: Sequence[int], stride: Any, padding: Any, dilation: Any) -> torch.Tensor:
    """im2col: (N, C, *spatial) -> (N, C * prod(kernel), windows), rows channel by channel, then tap by tap."""
    if x.dim() == 4:
        return F.unfold(x, tuple(kernel), dilation=dilation, padding=padding, stride=stride)
    n, c = x.shape[:2]
    nd = len(kernel)
    v = F.pad(x, [p for d in reversed(range(nd)) for p in (padding[d], padding[d])])
    for d in range(nd):  # (each dim's windows as a new last dim, the taps dilated)
        v = v.unfold(2 + d, dilation[d] * (kernel[d] - 1) + 1, stride[d])[..., ::dilation[d]]
    # (N, C, *windows, *taps) -> (N, C, *taps, *windows)
    v = v.permute(0, 1, *range(2 + nd, 2 + 2 * nd), *range(2, 2 + nd))
    return v.reshape(n, c * math.prod(kernel), -1)


def _fold(cols: torch.Tensor, size: Sequence[int], kernel: Sequence[int], stride: Any, padding: Any,
          dilation: Any) -> torch.Tensor:
    """col2im, `_unfold`'s adjoint: each column value added into the input position its tap covers (taps in
    order, each a strided slice-add), the padding cut off: (N, C * prod(kernel), windows) -> (N, C, *size)."""
    if len(size) == 2:
        return F.fold(cols, tuple(size), tuple(kernel), dilation=dilation, padding=padding, stride=stride)
    nd, n = len(size), cols.shape[0]
    blocks = _blocks(size, kernel, stride, padding, dilation)
    c = cols.shape[1] // math.prod(kernel)
    taps = cols.reshape(n, c, *kernel, *blocks)
    out = cols.new_zeros(n, c, *(size[d] + 2 * padding[d] for d in range(nd)))
    for tap in itertools.product(*(range(k) for k in kernel)):
        at = tuple(slice(tap[d] * dilation[d], tap[d] * dilation[d] + stride[d] * (blocks[d] - 1) + 1, stride[d])
                   for d in range(nd))
        out[(slice(None), slice(None), *at)] += taps[(slice(None), slice(None), *tap)]
    return out[(slice(None), slice(None), *(slice(padding[d], padding[d] + size[d]) for d in range(nd)))]


def _windows(x: torch.Tensor, weight: torch.Tensor, stride: Any, padding: Any, dilation: Any,
             blocks: Sequence[int]) -> torch.Tensor:
    """x's im2col columns (N, C*taps, L) for the first `blocks` windows along each dim (fewer than slide: a
    transposed convolution's output padding can add windows that the input it transposes has no value for)."""
    cols = _unfold(x, weight.shape[2:], stride, padding, dilation)
    every = _blocks(x.shape[2:], weight.shape[2:], stride, padding, dilation)
    if list(blocks) != every:
        cut = tuple(slice(0, b) for b in blocks)
        cols = cols.reshape(*cols.shape[:2], *every)[(..., *cut)].reshape(*cols.shape[:2], -1)
    return cols


def _forward(dev: Device, x: torch.Tensor, weight: torch.Tensor, stride: Any, padding: Any, dilation: Any,
             groups: int, blocks: Sequence[int] | None = None) -> torch.Tensor:
    """A convolution of x without bias over its first `blocks` windows (all by default): (N, C, *spatial) ->
    (N, O, *blocks)."""
    n, o, k = x.shape[0], weight.shape[0], weight[0].numel()
    blocks = blocks or _blocks(x.shape[2:], weight.shape[2:], stride, padding, dilation)
    cols = _windows(x, weight, stride, padding, dilation, blocks)  # (im2col's rows: each group's are one block)
    wmat = weight.reshape(1, groups, o // groups, k).expand(n, -1, -1, -1).reshape(n * groups, o // groups, k)
    return dev.bmm(wmat, cols.reshape(n * groups, k, -1)).reshape(n, o, *blocks)


def _input_grad(dev: Device, g: torch.Tensor, weight: torch.Tensor, size: Sequence[int], stride: Any,
                padding: Any, dilation: Any, groups: int) -> torch.Tensor:
    """The gradient of `_forward`'s x of spatial size `size` for its output's gradient g: (N, O, *windows) ->
    (N, C, *size)."""
    n, o = g.shape[:2]
    og, k = o // groups, weight[0].numel()
    wt = weight.reshape(1, groups, og, k).transpose(2, 3).expand(n, -1, -1, -1).reshape(n * groups, k, og)
    dcols = dev.bmm(wt.contiguous(), g.reshape(n * groups, og, -1)).reshape(n, groups * k, -1)
    every = _blocks(size, weight.shape[2:], stride, padding, dilation)
    if list(g.shape[2:]) != every:  # (windows g has no value for add nothing)
        pad = [p for d in reversed(range(len(every))) for p in (0, every[d] - g.shape[2 + d])]
        dcols = F.pad(dcols.reshape(n, groups * k, *g.shape[2:]), pad).reshape(n, groups * k, -1)
    return _fold(dcols, size, weight.shape[2:], stride, padding, dilation)


def _weight_grad(dev: Device, g: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, stride: Any, padding: Any,
                 dilation: Any, groups: int) -> torch.Tensor:
    """The gradient of `_forward`'s weight for its output's gradient g, one sum over images and windows per
    weight."""
    n, o = g.shape[:2]
    og, k = o // groups, weight[0].numel()
    cols = _windows(x, weight, stride, padding, dilation, g.shape[2:])  # (N, C*taps, L)
    g2 = g.reshape(n, groups, og, -1).permute(1, 2, 0, 3).reshape(groups, og, -1)  # (G, Og, N*L)
    c2 = cols.reshape(n, groups, k, -1).permute(1, 0, 3, 2).reshape(groups, -1, k)  # (G, N*L, Cg*taps)
    return dev.bmm(g2, c2).reshape(weight.shape)


def transposed_size(x: torch.Tensor, weight: torch.Tensor, stride: Any, padding: Any, dilation: Any,
                     output_padding: Any) -> list[int]:
    """The spatial size of a transposed convolution's output (torch's formula; the emulated devices' and the
    exact resolution's)."""
    return [(x.shape[2 + d] - 1) * stride[d] - 2 * padding[d] + dilation[d] * (weight.shape[2 + d] - 1)
            + output_padding[d] + 1 for d in range(x.dim() - 2)]


def _convolution(dev: Device, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, stride: Any,
                 padding: Any, dilation: Any, transposed: bool, output_padding: Any, groups: int) -> torch.Tensor:
    _check_conv(dev, x)
    if x.dim() == 3:
        x4, w4, stride, padding, dilation, output_padding = _as_2d(x, weight, stride, padding, dilation,
                                                                   output_padding)
        return _convolution(dev, x4, w4, bias, stride, padding, dilation, transposed, output_padding,
                            groups).squeeze(2)
    if transposed:
        size = transposed_size(x, weight, stride, padding, dilation, output_padding)
        out = _input_grad(dev, x, weight, size, stride, padding, dilation, groups)
    else:
        out = _forward(dev, x, weight, stride, padding, dilation, groups)
    return out + bias.reshape(1, -1, *[1] * (x.dim() - 2)) if bias is not None else out


def _convolution_backward(dev: Device, grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias_sizes: Any,
                          stride: Any, padding: Any, dilation: Any, transposed: bool, output_padding: Any,
                          groups: int, output_mask: Any) -> tuple:
    _check_conv(dev, x)
    if x.dim() == 3:
        x4, w4, stride, padding, dilation, output_padding = _as_2d(x, weight, stride, padding, dilation,
                                                                   output_padding)
        gi, gw, gb = _convolution_backward(dev, grad.unsqueeze(2), x4, w4, bias_sizes, stride, padding, dilation,
                                           transposed, output_padding, groups, output_mask)
        return gi if gi is None else gi.squeeze(2), gw if gw is None else gw.squeeze(2), gb
    gi = gw = gb = None
    if output_mask[0]:
        gi = _forward(dev, grad, weight, stride, padding, dilation, groups, x.shape[2:]) if transposed else \
            _input_grad(dev, grad, weight, x.shape[2:], stride, padding, dilation, groups)
    if output_mask[1]:  # (a transposed convolution's weight meets x where the one it transposes meets its gradient)
        gw = _weight_grad(dev, x, grad, weight, stride, padding, dilation, groups) if transposed else \
            _weight_grad(dev, grad, x, weight, stride, padding, dilation, groups)
    if output_mask[2]:
        gb = dev.sum(grad, [0, *range(2, grad.dim())])
    return gi, gw, gb


_EMULATED: dict[Any, Callable[..., Any]] = {
    aten.mm.default: _mm,
    aten.bmm.default: _bmm,
    aten.addmm.default: _addmm,
    aten.sum.default: _sum,
    aten.sum.dim_IntList: _sum,
    aten.mean.default: _mean,
    aten.mean.dim: _mean,
    aten._log_softmax.default: _log_softmax,
    aten._softmax.default: _softmax,
    aten._log_softmax_backward_data.default: _log_softmax_backward,
    aten._softmax_backward_data.default: _softmax_backward,
    aten.nll_loss_forward.default: _nll_loss_forward,
    aten.convolution.default: _convolution,
    aten.convolution_backward.default: _convolution_backward,
}


def _profiles() -> list[Device]:
    devices = [Device("cpu", "torch native CPU kernels (MKL/oneDNN), this process's thread count")]
    if torch.cuda.is_available():
        devices.append(Device("cuda", f"torch native CUDA kernels on {torch.cuda.get_device_name(0)}",
                              torch_device="cuda"))
    devices += [
        Device("emu:splitk8-tree", "split-K matmul (chunks of 8, one bmm) + pairwise tree; sums by halving tree",
               emulated=True, matmul_order=_mm_splitk8_tree, rowsum_order=_sum_tree),
        Device("emu:splitk16-revseq", "split-K matmul (chunks of 16) accumulated last to first; sums reversed "
               "sequential", emulated=True, matmul_order=_mm_splitk16_revseq, rowsum_order=_sum_revseq),
        Device("emu:lanes8-butterfly", "8 interleaved K-lanes (k mod 8) + xor butterfly, for matmuls and sums",
               emulated=True, matmul_order=_mm_lanes8_butterfly, rowsum_order=_sum_lanes8_butterfly),
    ]
    return devices


def list_devices() -> list[Device]:
    """Every device profile available in this process (cuda only when torch sees a GPU)."""
    return _profiles()


def get_device(name: str) -> Device:
    """The profile called `name`; an unknown name raises UnknownDeviceError listing the valid ones."""
    for dev in _profiles():
        if dev.name == name:
            return dev
    valid = ", ".join(d.name for d in _profiles())
    raise UnknownDeviceError(f"unknown device {name!r}; valid devices: {valid} (see `vtrain devices`)")
