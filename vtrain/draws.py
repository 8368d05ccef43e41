"""Random draws under rounded execution: from a seed, the same on every device, instead of the device's generator.

`nn.Dropout`, `nn.Dropout2d` and `nn.AlphaDropout` draw their masks with `bernoulli_` on the CPU (torch's
native_dropout on a GPU), each from the generator of the device it runs on: another device or another process draws
other masks, and no replay could match the trainer's. Given a seed (`RoundedExecution(seed=...)`), the rounded
execution draws them here instead. The k-th draw of step t reads uniform float64 values from a CPU generator keyed
by (seed, t, k) (vtrain.data.keyed_generator: torch's CPU Mersenne Twister, the same stream on every machine), one
per element in row-major order, and an element is 1 where its value is below the probability p. The masks then meet
the activations in registered ops (dropout's division by 1 - p and its product, alpha dropout's affine steps),
rounded as any. Noise (`randn_like`, a VAE's reparameterisation; `rand_like`, `randn`, `rand`, `normal_`,
`uniform_`) reads standard normal or uniform float64 values the same way, rounded onto the grid (a uniform value
that would round up to 1 held at the grid's largest value below it), then scaled and shifted in rounded operations;
exponential noise (`exponential_`, F.gumbel_softmax's) is -log1p(-u) / lambda of such a uniform u, each operation
rounded. Without a seed these ops stay refused, and so does a call that brings a generator of its own (the seed
decides every draw).

The k in the key is the draw's place in the step's sequence of draws: the trainer and the auditor run the same
program, so they draw in the same order. (A program that splits a step's batch across processes gives each part
a seed of its own. `vtrain train`'s model families draw their masks from the spec's seed themselves, a row per
example: vtrain.models.dropout_masks.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from vtrain.data import keyed_generator
from vtrain.errors import UnsupportedOpError
from vtrain.grid import round_to_grid

aten = torch.ops.aten

Call = Callable[..., Any]  # RoundedExecution.call: one registry op, rounded


@dataclass
class Stream:
    """A step's draws from the seed: the k-th a fresh generator keyed by (seed, step, k), float64 on the CPU."""

    seed: int
    step: int
    bits: int
    drawn: int = 0

    def _next(self) -> torch.Generator:
        generator = keyed_generator(self.seed, self.step, f"draw:{self.drawn}")
        self.drawn += 1
        return generator

    def uniform(self, shape: Sequence[int]) -> torch.Tensor:
        """Uniform values in [0, 1), one an element in row-major order."""
        return torch.rand(tuple(shape), generator=self._next(), dtype=torch.float64)

    def normal(self, shape: Sequence[int]) -> torch.Tensor:
        """Standard normal values, one an element in row-major order."""
        return torch.randn(tuple(shape), generator=self._next(), dtype=torch.float64)

    def on_grid(self, values: torch.Tensor, below_one: bool = False) -> torch.Tensor:
        """values rounded onto the grid (`below_one`: uniform values, the ones that round up to 1 kept at the grid's
        largest value below it, so that they stay in [0, 1))."""
        r = round_to_grid(values, self.bits)
        if below_one:
            r = torch.where(r >= 1, torch.tensor(1 - 2.0 ** -(self.bits - 8), dtype=r.dtype), r)
        return r

    def grid_uniform(self, shape: Sequence[int]) -> torch.Tensor:
        """`uniform` values on the grid, in [0, 1)."""
        return self.on_grid(self.uniform(shape), below_one=True)

    def grid_normal(self, shape: Sequence[int]) -> torch.Tensor:
        """`normal` values on the grid."""
        return self.on_grid(self.normal(shape))


def _like(values: torch.Tensor, like: torch.Tensor | None, kwargs: dict) -> torch.Tensor:
    """values in the dtype and on the device a factory op asks for (`like`'s where it names none)."""
    dtype = kwargs.get("dtype") or (like.dtype if like is not None else torch.get_default_dtype())
    device = kwargs.get("device") or (like.device if like is not None else "cpu")
    return values.to(dtype=dtype, device=device)


def _ones_below(p: Any, like: torch.Tensor, stream: Stream) -> torch.Tensor:
    """1 where a fresh uniform value is below p (a number, or a tensor of like's shape), else 0, in like's dtype
    and on its device."""
    u = stream.uniform(like.shape)
    if isinstance(p, torch.Tensor):
        p = p.detach().to(device="cpu", dtype=torch.float64).expand(like.shape)
    return (u < p).to(dtype=like.dtype, device=like.device)


def _bernoulli_(call: Call, stream: Stream, x: torch.Tensor, p: Any = 0.5) -> torch.Tensor:
    return x.copy_(_ones_below(p, x, stream))


def _bernoulli(call: Call, stream: Stream, probs: torch.Tensor) -> torch.Tensor:
    return _ones_below(probs, probs, stream)


def _bernoulli_p(call: Call, stream: Stream, x: torch.Tensor, p: float = 0.5) -> torch.Tensor:
    return _ones_below(p, x, stream)


def _native_dropout(call: Call, stream: Stream, x: torch.Tensor, p: float,
                    train: bool | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x times 1 / (1 - p) where kept, 0 where dropped; the kept mask): each element kept with probability
    1 - p, and scaled as native_dropout_backward scales its gradient (one rounded product)."""
    if train is False or p == 0:
        return x.clone(), torch.ones_like(x, dtype=torch.bool)
    keep = _ones_below(1 - p, x, stream)
    if p >= 1:
        return torch.zeros_like(x), keep.bool()
    return call(aten.mul.Scalar, call(aten.mul.Tensor, x, keep), 1 / (1 - p)), keep.bool()


def _rand(call: Call, stream: Stream, size: Sequence[int], **kwargs: Any) -> torch.Tensor:
    return _like(stream.grid_uniform(size), None, kwargs)


def _randn(call: Call, stream: Stream, size: Sequence[int], **kwargs: Any) -> torch.Tensor:
    return _like(stream.grid_normal(size), None, kwargs)


def _rand_like(call: Call, stream: Stream, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    return _like(stream.grid_uniform(x.shape), x, kwargs)


def _randn_like(call: Call, stream: Stream, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    return _like(stream.grid_normal(x.shape), x, kwargs)


def _normal_(call: Call, stream: Stream, x: torch.Tensor, mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
    """mean + std z, z a standard normal draw on the grid, each operation rounded, written into x."""
    z = _like(stream.grid_normal(x.shape), x, {})
    return x.copy_(call(aten.add.Scalar, call(aten.mul.Scalar, z, std), mean))


def _uniform_(call: Call, stream: Stream, x: torch.Tensor, *bounds: float, **named: float) -> torch.Tensor:
    """low + (high - low) u, u a uniform draw on the grid in [0, 1), each operation rounded, written into x (the
    schema's bounds are `from` and `to`, which Python cannot name as arguments)."""
    low = bounds[0] if bounds else named.get("from", 0.0)
    high = bounds[1] if len(bounds) > 1 else named.get("to", 1.0)
    u = _like(stream.grid_uniform(x.shape), x, {})
    return x.copy_(call(aten.add.Scalar, call(aten.mul.Scalar, u, high - low), low))


def _exponential_(call: Call, stream: Stream, x: torch.Tensor, lambd: float = 1.0) -> torch.Tensor:
    """-log1p(-u) / lambd, u a uniform draw on the grid in [0, 1), each operation rounded, written into x
    (F.gumbel_softmax's noise)."""
    u = _like(stream.grid_uniform(x.shape), x, {})
    logged = call(aten.log1p.default, call(aten.neg.default, u))
    return x.copy_(call(aten.div.Tensor, call(aten.neg.default, logged), lambd))


def _rrelu_with_noise(call: Call, stream: Stream | None, x: torch.Tensor, noise: torch.Tensor, lower: float = 0.125,
                      upper: float = 1 / 3, training: bool = False) -> torch.Tensor:
    """nn.RReLU: in training, where x <= 0 a slope lower + (upper - lower) u, u a uniform draw on the grid in [0, 1)
    (each operation rounded), times x (one rounded product), and the slopes (1 elsewhere) written into `noise` for the
    backward pass; in evaluation the slope (lower + upper) / 2 as a leaky ReLU's, no draw (torch's kernel)."""
    if not training:
        return call(aten.leaky_relu.default, x, (lower + upper) / 2)
    u = _like(stream.grid_uniform(x.shape), x, {})
    slopes = call(aten.add.Tensor, call(aten.mul.Tensor, u, upper - lower), lower)
    negative = x <= 0
    noise.copy_(torch.where(negative, slopes, 1.0))
    return torch.where(negative, call(aten.mul.Tensor, x, slopes), x)


DRAWS: dict[Any, Callable[..., Any]] = {
    aten.bernoulli_.float: _bernoulli_, aten.bernoulli_.Tensor: _bernoulli_, aten.bernoulli.default: _bernoulli,
    aten.bernoulli.p: _bernoulli_p, aten.native_dropout.default: _native_dropout,
    aten.rand.default: _rand, aten.randn.default: _randn, aten.rand_like.default: _rand_like,
    aten.randn_like.default: _randn_like, aten.normal_.default: _normal_, aten.uniform_.default: _uniform_,
    aten.exponential_.default: _exponential_, aten.rrelu_with_noise.default: _rrelu_with_noise,
}


def _seedless(func: Any, args: tuple, kwargs: dict) -> bool:
    """Whether this call draws nothing: nn.RReLU in evaluation."""
    return func is aten.rrelu_with_noise.default and not (args[4] if len(args) > 4 else kwargs.get("training", False))


def draw(func: Any, call: Call, stream: Stream | None, args: tuple, kwargs: dict) -> Any:
    """The op `func` of DRAWS on (args, kwargs), its random values from `stream` (None: no seed, refused)."""
    kwargs = dict(kwargs)
    if kwargs.pop("generator", None) is not None:
        raise UnsupportedOpError(str(func), "a generator of its own: under rounded execution every draw comes from "
                                 "the seed given to RoundedExecution")
    if stream is None and not _seedless(func, args, kwargs):
        raise UnsupportedOpError(str(func), "it draws random numbers from the device's generator, which differ from "
                                 "device to device; give RoundedExecution a seed (seed=...) and it draws them from "
                                 "the seed, the same everywhere")
    for key in ("layout", "pin_memory", "memory_format"):  # (dense CPU or device tensors: nothing else to honour)
        kwargs.pop(key, None)
    return DRAWS[func](call, stream, *args, **kwargs)
