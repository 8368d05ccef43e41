"""Random draws under rounded execution: from a seed, the same on every device, instead of the device's generator.

`nn.Dropout`, `nn.Dropout2d` and `nn.AlphaDropout` draw their masks with `bernoulli_` on the CPU (torch's
native_dropout on a GPU), each from the generator of the device it runs on: another device or another process
draws other masks, and no replay could match the trainer's. Given a seed (`RoundedExecution(seed=...)`), the
rounded execution draws them here instead. The k-th draw of step t reads uniform float64 values from a CPU
generator keyed by (seed, t, k) (vtrain.data.keyed_generator: torch's CPU Mersenne Twister, the same stream on
every machine), one per element in row-major order, and an element is 1 where its value is below the
probability p. The masks then meet the activations in registered ops (dropout's division by 1 - p and its
product, alpha dropout's affine steps), rounded as any. Without a seed these ops stay refused, and so does a
call that brings a generator of its own (the seed decides every draw).

The k in the key is the draw's place in the step's sequence of draws: the trainer and the auditor run the same
program, so they draw in the same order. (A program that splits a step's batch across processes gives each part
a seed of its own. `vtrain train`'s model families draw their masks from the spec's seed themselves, a row per
example: vtrain.models.dropout_masks.)
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from vtrain.errors import UnsupportedOpError

aten = torch.ops.aten

Uniform = Callable[[Sequence[int]], torch.Tensor]  # shape -> uniform float64 values in [0, 1) on the CPU
Call = Callable[..., Any]  # RoundedExecution.call: one registry op, rounded


def _ones_below(p: Any, like: torch.Tensor, uniform: Uniform) -> torch.Tensor:
    """1 where a fresh uniform value is below p (a number, or a tensor of like's shape), else 0, in like's dtype
    and on its device."""
    u = uniform(like.shape)
    if isinstance(p, torch.Tensor):
        p = p.detach().to(device="cpu", dtype=torch.float64).expand(like.shape)
    return (u < p).to(dtype=like.dtype, device=like.device)


def _bernoulli_(call: Call, uniform: Uniform, x: torch.Tensor, p: Any = 0.5) -> torch.Tensor:
    return x.copy_(_ones_below(p, x, uniform))


def _bernoulli(call: Call, uniform: Uniform, probs: torch.Tensor) -> torch.Tensor:
    return _ones_below(probs, probs, uniform)


def _bernoulli_p(call: Call, uniform: Uniform, x: torch.Tensor, p: float = 0.5) -> torch.Tensor:
    return _ones_below(p, x, uniform)


def _native_dropout(call: Call, uniform: Uniform, x: torch.Tensor, p: float,
                    train: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x times 1 / (1 - p) where kept, 0 where dropped; the kept mask): each element kept with probability
    1 - p, and scaled as native_dropout_backward scales its gradient (one rounded product)."""
    if train is False or p == 0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    keep = _ones_below(1 - p, x, uniform)
    if p >= 1:
        return torch.zeros_like(x), keep.bool()
    return call(aten.mul.Scalar, call(aten.mul.Tensor, x, keep), 1 / (1 - p)), keep.bool()


DRAWS: dict[Any, Callable[..., Any]] = {
    aten.bernoulli_.float: _bernoulli_, aten.bernoulli_.Tensor: _bernoulli_, aten.bernoulli.default: _bernoulli,
    aten.bernoulli.p: _bernoulli_p, aten.native_dropout.default: _native_dropout,
}


def draw(func: Any, call: Call, uniform: Uniform | None, args: tuple, kwargs: dict) -> Any:
    """The op `func` of DRAWS on (args, kwargs), its random values from `uniform` (None: no seed, refused)."""
    kwargs = dict(kwargs)
    if kwargs.pop("generator", None) is not None:
        raise UnsupportedOpError(str(func), "a generator of its own: under rounded execution every draw comes from "
                                 "the seed given to RoundedExecution")
    if uniform is None:
        raise UnsupportedOpError(str(func), "it draws random numbers from the device's generator, which differ from "
                                 "device to device; give RoundedExecution a seed (seed=...) and it draws them from "
                                 "the seed, the same everywhere")
    return DRAWS[func](call, uniform, *args, **kwargs)
