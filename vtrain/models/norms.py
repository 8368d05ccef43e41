"""LayerNorm and BatchNorm written out in the primitives the rounded execution supports.

torch's fused kernels (native_layer_norm, native_batch_norm and their backward) compute mean,
variance and normalisation in one opaque op; written out, every step is a reduction (mean, a
device-dependent op with an error bound) or a single IEEE op (sub, mul, add, sqrt, div), so the
rounding log covers exactly the reductions and nothing else needs one. The mathematics is that of
nn.LayerNorm and nn.BatchNorm2d (biased variance in the normalisation, unbiased in the running
variance, eps inside the square root).

Under rounded execution torch's fused ops now run as these forward ops, one for one (vtrain.composites),
so torch's modules compute the same forward bits; their backward passes are the composites' closed forms,
not autograd's ops through the code below. The model families keep these modules: they define their runs. (Under
rounded execution both modules' elementwise ops in training run fused, vtrain.fused_norms, to the same values.)
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode


class LayerNorm(nn.Module):
    """Normalise the last dimension; learned gain (init 1) and bias (init 0)."""

    def __init__(self, width: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.bias = nn.Parameter(torch.zeros(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _get_current_dispatch_mode() is not None:  # (a rounded execution, maybe: its elementwise ops fused)
            from vtrain import fused_norms  # noqa: PLC0415 (numba's import: only processes that round pay it)
            fast = fused_norms.layer_norm(x, self.weight, self.bias, self.eps)
            if fast is not None:
                return fast
        xc = x - x.mean(-1, keepdim=True)
        var = (xc * xc).mean(-1, keepdim=True)
        return xc / torch.sqrt(var + self.eps) * self.weight + self.bias


class BatchNorm2d(nn.Module):
    """Normalise each channel over (batch, height, width); running statistics for evaluation."""

    def __init__(self, channels: int, eps: float = 1e-5, momentum: float = 0.1) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))
        self.eps, self.momentum = eps, momentum
        self.update_running = True   # data parallel: only the first shard updates the statistics

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (1, -1, 1, 1)
        if not self.training:
            return (x - self.running_mean.reshape(shape)) / torch.sqrt(self.running_var.reshape(shape) + self.eps) \
                * self.weight.reshape(shape) + self.bias.reshape(shape)
        running = self._update_running if self.update_running else None
        if _get_current_dispatch_mode() is not None:  # (as the LayerNorm's)
            from vtrain import fused_norms  # noqa: PLC0415
            fast = fused_norms.batch_norm(x, self.weight, self.bias, self.eps, running)
            if fast is not None:
                return fast
        mean = x.mean((0, 2, 3), keepdim=True)              # (1, C, 1, 1)
        xc = x - mean
        var = (xc * xc).mean((0, 2, 3), keepdim=True)       # biased, as in the normalisation
        if running is not None:
            running(mean, var, x.numel() // x.shape[1])
        return xc / torch.sqrt(var + self.eps) * self.weight.reshape(shape) + self.bias.reshape(shape)

    def _update_running(self, mean: torch.Tensor, var: torch.Tensor, n: int) -> None:
        """The running statistics from this batch's mean and biased variance over n values a channel."""
        with torch.no_grad():
            m = self.momentum
            self.running_mean.mul_(1.0 - m).add_(mean.reshape(-1) * m)
            self.running_var.mul_(1.0 - m).add_(var.reshape(-1) * (m * n / (n - 1)))
