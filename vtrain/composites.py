"""Ops run as fixed sequences of registry ops, under every policy (DESIGN.md §1.2, §1.3b): torch's fused norms, vector
norms (gradient clipping, the legacy torch.norm), variances, the activations (SiLU, leaky ReLU, softplus, ELU, CELU,
hard sigmoid and swish, log-sigmoid, Mish, PReLU), scaled dot-product attention, log-sum-exp, baddbmm, the
regression and binary losses (MSE, Huber, smooth L1, BCE with logits and on probabilities), xlogy (KL divergence),
adaptive pooling, nearest upsampling's backward passes, the scatter additions of gather's and index_select's
backward passes and of padding's (reflected, replicated), linear, bilinear, trilinear and bicubic upsampling, fold
(col2im), embedding bags, GLU, the soft margin loss, cross-entropy over pixels, cumulative sums and products, addmv,
addbmm, trace, dist, pdist, 3-d pooling, grid sampling and affine grids, linspace, torch's foreach ops (gradient
clipping's by default, torch.optim's with foreach=True): each tensor's op in turn, torch.optim's fused kernels
(fused=True): each parameter's update as its single-tensor loop's; and (session 41) addr, vdot, F.bilinear
(_trilinear), logaddexp, hypot, renorm, weight normalisation, embedding max_norm, 3-d adaptive pooling, max
unpooling and RReLU's backward; (session 42) logaddexp2, xlog1py, nearest-exact upsampling's backward passes,
scatter_reduce, triangular solves and Cholesky factorisations.

`nn.LayerNorm` and `nn.BatchNorm*d` dispatch one opaque kernel each way (aten.native_layer_norm,
aten.native_batch_norm and their backward passes), whose internal order and precision no other device shares.
The rounded execution runs each as the sequence below instead, every op of it dispatched on its own: means and
sums as device ops (a band, a log entry or an exact resolution each), the rest as single IEEE operations. That
sequence is the op's definition for every device and both policies.

The forward passes are those of the written-out modules (vtrain.models.norms), op for op, so a model built with
torch's modules computes the written-out model's forward bits: centre by the mean, divide by sqrt(var + eps),
scale, shift. The statistics the backward pass reads are the mean and 1 / sqrt(var + eps) (reciprocal, one
IEEE division). The backward passes are the closed forms, with xhat = (x - mean) * rstd and g the output's
gradient times the weight:

    grad_input  = (g - mean(g) - xhat * mean(g * xhat)) * rstd       (means over the normalised elements)
    grad_weight = sum(grad_out * xhat),  grad_bias = sum(grad_out)   (sums over the other dims)

Group norm is layer norm over each group's channels and positions, with a weight and bias per channel. The
other composites' definitions are at their functions. Adding a composite changes no earlier run (its op was
refused before), so no canonical version is bumped; changing one would (vtrain.canonical).
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import Any, Callable, Sequence

import torch

from vtrain.errors import UnsupportedOpError

aten = torch.ops.aten

Call = Callable[..., Any]
Grads = tuple["torch.Tensor | None", "torch.Tensor | None", "torch.Tensor | None"]


def _sum(call: Call, x: torch.Tensor, dims: list[int]) -> torch.Tensor:
    # (an empty dim list would reduce every dim: there, nothing is summed)
    return call(aten.sum.dim_IntList, x, dims, False) if dims else x


def _centre(call: Call, x: torch.Tensor, dims: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(xc = x - mean, the mean, the biased variance mean(xc * xc)) over `dims`, kept: the written-out modules'
    first ops."""
    mean = call(aten.mean.dim, x, dims, True)
    xc = call(aten.sub.Tensor, x, mean)
    return xc, mean, call(aten.mean.dim, call(aten.mul.Tensor, xc, xc), dims, True)


def _std(call: Call, var: torch.Tensor, eps: float) -> torch.Tensor:
    return call(aten.sqrt.default, call(aten.add.Tensor, var, eps))


def _normalised(call: Call, xc: torch.Tensor, var: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(xc / sqrt(var + eps), that square root)."""
    std = _std(call, var, eps)
    return call(aten.div.Tensor, xc, std), std


def _affine(call: Call, y: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    if weight is not None:
        y = call(aten.mul.Tensor, y, weight)
    return y if bias is None else call(aten.add.Tensor, y, bias)


def _input_grad(call: Call, g: torch.Tensor, xhat: torch.Tensor, dims: list[int], rstd: torch.Tensor) -> torch.Tensor:
    """(g - mean(g) - xhat * mean(g * xhat)) * rstd, the means over `dims`."""
    g_mean = call(aten.mean.dim, g, dims, True)
    gx_mean = call(aten.mean.dim, call(aten.mul.Tensor, g, xhat), dims, True)
    centred = call(aten.sub.Tensor, call(aten.sub.Tensor, g, g_mean), call(aten.mul.Tensor, xhat, gx_mean))
    return call(aten.mul.Tensor, centred, rstd)


def layer_norm(call: Call, x: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None,
               bias: torch.Tensor | None, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """aten.native_layer_norm: (out, mean, rstd), the statistics in x's shape with the normalised dims kept as 1."""
    dims = list(range(-len(normalized_shape), 0))
    xc, mean, var = _centre(call, x, dims)
    y, std = _normalised(call, xc, var, eps)
    return _affine(call, y, weight, bias), mean, call(aten.reciprocal.default, std)


def layer_norm_backward(call: Call, grad_out: torch.Tensor, x: torch.Tensor, normalized_shape: Sequence[int],
                        mean: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor | None,
                        bias: torch.Tensor | None, output_mask: Sequence[bool]) -> Grads:
    """aten.native_layer_norm_backward: (grad_input, grad_weight, grad_bias), None where output_mask says so
    or the module has no such parameter."""
    dims = list(range(-len(normalized_shape), 0))
    outer = list(range(x.dim() - len(normalized_shape)))
    xhat = call(aten.mul.Tensor, call(aten.sub.Tensor, x, mean), rstd)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        g = grad_out if weight is None else call(aten.mul.Tensor, grad_out, weight)
        grad_input = _input_grad(call, g, xhat, dims, rstd)
    if output_mask[1] and weight is not None:
        grad_weight = _sum(call, call(aten.mul.Tensor, grad_out, xhat), outer)
    if output_mask[2] and bias is not None:
        grad_bias = _sum(call, grad_out, outer)
    return grad_input, grad_weight, grad_bias


def _channels(x: torch.Tensor) -> tuple[list[int], list[int]]:
    """(the dims a batch norm reduces: all but the channels, dim 1; the shape a (C,) tensor takes to broadcast
    over x)."""
    return [0, *range(2, x.dim())], [1, -1] + [1] * (x.dim() - 2)


def _per_channel(t: torch.Tensor | None, shape: list[int]) -> torch.Tensor | None:
    return None if t is None else t.reshape(shape)


def batch_norm(call: Call, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
               running_mean: torch.Tensor | None, running_var: torch.Tensor | None, training: bool,
               momentum: float, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """aten.native_batch_norm: (out, the batch mean, its 1 / sqrt(var + eps)), both (C,), empty in evaluation.
    Training updates the running statistics in place as torch does, with the unbiased variance:
    r = r (1 - momentum) + momentum s."""
    dims, shape = _channels(x)
    w, b = _per_channel(weight, shape), _per_channel(bias, shape)
    if not training:
        y, _ = _normalised(call, call(aten.sub.Tensor, x, running_mean.reshape(shape)), running_var.reshape(shape), eps)
        empty = x.new_empty(0)
        return _affine(call, y, w, b), empty, empty
    xc, mean, var = _centre(call, x, dims)
    if running_mean is not None:
        n = x.numel() // x.shape[1]
        for running, batch, scale in ((running_mean, mean, momentum), (running_var, var, momentum * n / (n - 1))):
            call(aten.mul_.Tensor, running, 1.0 - momentum)
            call(aten.add_.Tensor, running, call(aten.mul.Tensor, batch.reshape(-1), scale))
    y, std = _normalised(call, xc, var, eps)
    return _affine(call, y, w, b), mean.reshape(-1), call(aten.reciprocal.default, std).reshape(-1)


def batch_norm_backward(call: Call, grad_out: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None,
                        running_mean: torch.Tensor | None, running_var: torch.Tensor | None,
                        save_mean: torch.Tensor | None, save_invstd: torch.Tensor | None, train: bool, eps: float,
                        output_mask: Sequence[bool]) -> Grads:
    """aten.native_batch_norm_backward: (grad_input, grad_weight, grad_bias). In training the batch's statistics,
    as the forward pass saved them; in evaluation the running ones, 1 / sqrt(running_var + eps) computed afresh,
    and grad_input is the output's gradient times weight * rstd alone (the statistics are constants there)."""
    dims, shape = _channels(x)
    if train:
        mean, rstd = save_mean.reshape(shape), save_invstd.reshape(shape)
    else:
        mean = running_mean.reshape(shape)
        rstd = call(aten.reciprocal.default, _std(call, running_var.reshape(shape), eps))
    xhat = call(aten.mul.Tensor, call(aten.sub.Tensor, x, mean), rstd)
    w = _per_channel(weight, shape)
    scale = rstd if w is None else call(aten.mul.Tensor, w, rstd)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        grad_input = _input_grad(call, grad_out, xhat, dims, scale) if train else \
            call(aten.mul.Tensor, grad_out, scale)
    if output_mask[1] and weight is not None:
        grad_weight = _sum(call, call(aten.mul.Tensor, grad_out, xhat), dims)
    if output_mask[2]:
        grad_bias = _sum(call, grad_out, dims)
    return grad_input, grad_weight, grad_bias


def group_norm(call: Call, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, n: int, c: int,
               hw: int, group: int, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """aten.native_group_norm: (out, mean, rstd), the statistics (N, group)."""
    xc, mean, var = _centre(call, x.reshape(n, group, -1), [-1])
    y, std = _normalised(call, xc, var, eps)
    _, shape = _channels(x)
    out = _affine(call, y.reshape(x.shape), _per_channel(weight, shape), _per_channel(bias, shape))
    return out, mean.reshape(n, group), call(aten.reciprocal.default, std).reshape(n, group)


def group_norm_backward(call: Call, grad_out: torch.Tensor, x: torch.Tensor, mean: torch.Tensor, rstd: torch.Tensor,
                        weight: torch.Tensor | None, n: int, c: int, hw: int, group: int,
                        output_mask: Sequence[bool]) -> Grads:
    """aten.native_group_norm_backward: (grad_input, grad_weight, grad_bias), layer norm's over each group."""
    dims, shape = _channels(x)
    mean, rstd = mean.reshape(n, group, 1), rstd.reshape(n, group, 1)
    xhat = call(aten.mul.Tensor, call(aten.sub.Tensor, x.reshape(n, group, -1), mean), rstd)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        g = grad_out if weight is None else call(aten.mul.Tensor, grad_out, weight.reshape(shape))
        grad_input = _input_grad(call, g.reshape(n, group, -1), xhat, [-1], rstd).reshape(x.shape)
    if output_mask[1] and weight is not None:
        grad_weight = _sum(call, call(aten.mul.Tensor, grad_out, xhat.reshape(x.shape)), dims)
    if output_mask[2]:
        grad_bias = _sum(call, grad_out, dims)
    return grad_input, grad_weight, grad_bias


def _reduced(x: torch.Tensor, dim: Sequence[int] | int | None) -> list[int]:
    """The dims a reduction's `dim` argument names (None or empty: all of them)."""
    if dim is None or (not isinstance(dim, int) and not len(dim)):
        return list(range(x.dim()))
    return [dim] if isinstance(dim, int) else list(dim)


def vector_norm(call: Call, x: torch.Tensor, ord: float = 2, dim: Sequence[int] | int | None = None,  # noqa: A002
                keepdim: bool = False, *, dtype: torch.dtype | None = None) -> torch.Tensor:
    """aten.linalg_vector_norm for ord 2 (sqrt(sum(x * x)), each square rounded), 1 (sum |x|) and +-inf (the
    largest or smallest |x|, exact); other orders and a dtype other than x's are refused."""
    if dtype not in (None, x.dtype) or ord not in (2, 1, math.inf, -math.inf):
        raise UnsupportedOpError(str(aten.linalg_vector_norm.default),
                                 f"ord={ord}, dtype={dtype}: the registry has the orders 2, 1, inf and -inf, in "
                                 "the input's dtype (vtrain.composites)")
    dims = _reduced(x, dim)
    if ord == 2:
        return call(aten.sqrt.default, call(aten.sum.dim_IntList, call(aten.mul.Tensor, x, x), dims, keepdim))
    size = call(aten.abs.default, x)
    if ord == 1:
        return call(aten.sum.dim_IntList, size, dims, keepdim)
    return call(aten.amax.default if ord > 0 else aten.amin.default, size, dims, keepdim)


def foreach_norm(call: Call, tensors: Sequence[torch.Tensor], ord: float = 2,  # noqa: A002
                 dtype: torch.dtype | None = None) -> list[torch.Tensor]:
    """aten._foreach_norm (nn.utils.clip_grad_norm_'s norms, by default on the CPU and CUDA): `vector_norm` of
    each tensor, so that the list's norms are the loop's, bit for bit."""
    return [vector_norm(call, t, ord, dtype=dtype) for t in tensors]


def _foreach(op: Any, per: Any, into: bool = False) -> Call:
    """A torch._foreach_* op (gradient clipping's, and torch.optim's with foreach=True, the default on CUDA) as its
    per-tensor op `per` on each tensor of the list in turn: the i-th of each list argument (tensors, or numbers
    of a ScalarList), a scalars tensor's i-th value, any other argument as given, bound to `per`'s parameters
    in order (keyword-only ones by name: addcmul's value); nothing returned where the foreach op returns
    nothing (the in-place ones). `into`: `per` is the functional op of an in-place foreach op that aten has no
    in-place form of (maximum_), its result copied into the tensor, as torch.maximum(a, b, out=a) writes it. So
    a list's results are the loop's, bit for bit."""
    params = [a for a in op._schema.arguments if not a.kwarg_only]
    kinds = ["list" if str(a.type).startswith("List[") else "item" if a.name == "scalars" else "same" for a in params]
    names = [a.name if a.kwarg_only else None for a in per._schema.arguments]
    returns = bool(op._schema.returns)

    def run(call: Call, *args: Any, **kwargs: Any) -> list[torch.Tensor] | None:
        outs = []
        for i in range(len(args[0])):
            values = [a[i] if kind == "list" else a[i].item() if kind == "item" else a for a, kind in zip(args, kinds)]
            named = {name: v for name, v in zip(names, values) if name is not None}
            out = call(per, *(v for name, v in zip(names, values) if name is None), **named, **kwargs)
            outs.append(call(aten.copy_.default, values[0], out) if into else out)
        return outs if returns else None

    return run


# Which overload of the per-tensor op a foreach overload maps to: a scalar's, else the op's one form (addcmul_), for
# .Scalar and .ScalarList; the tensor form for .List and .Tensor (a second list's element, or the one tensor).
_PER_FORMS = {"default": ("default",), "Scalar": ("Scalar", "default"), "ScalarList": ("Scalar", "default"),
              "List": ("Tensor", "default"), "Tensor": ("Tensor", "default")}


def _foreach_ops() -> dict[Any, Call]:
    """Every torch._foreach_* op whose first argument is the tensor list and whose per-tensor op aten has (by name:
    `_foreach_add_.List` is `add_.Tensor` on each pair), but _foreach_norm (`foreach_norm`). A per-tensor op
    outside the registry fails when it runs, naming that op."""
    table: dict[Any, Call] = {}
    for qualified in sorted(torch._C._dispatch_get_all_op_names()):
        if not qualified.startswith("aten::_foreach_"):
            continue
        name, _, overload = qualified[len("aten::_foreach_"):].partition(".")
        packet = getattr(aten, name, None) if name != "norm" else None
        into = packet is None and name.endswith("_")
        packet = getattr(aten, name[:-1], None) if into else packet
        forms = _PER_FORMS.get(overload or "default")
        if packet is None or forms is None:
            continue
        op = getattr(getattr(aten, f"_foreach_{name}"), overload or "default")
        if str(op._schema.arguments[0].type) != "List[Tensor]":
            continue
        per = next((getattr(packet, f) for f in forms if f in packet.overloads()), None)
        if per is not None:
            table[op] = _foreach(op, per, into)
    return table


# torch.optim's fused kernels (fused=True): each parameter's update as the optimizer's single-tensor code
# (foreach=False) computes it, op for op, so the loop's bits and log. The kernels take the step counters already
# advanced (torch.optim adds 1 with a foreach op first). A kernel's own arithmetic (an update in one expression, in
# float64 registers) is no device's to share.

def _no_scaler(op: Any, grad_scale: torch.Tensor | None, found_inf: torch.Tensor | None) -> None:
    if grad_scale is not None or found_inf is not None:
        raise UnsupportedOpError(str(op), "grad_scale and found_inf (a GradScaler's, for float16 work) are not in the "
                                 "registry: float64 work needs no loss scaling, step the optimizer without a scaler")


def _rate(call: Call, lr: float | torch.Tensor, divisor: float | None = None) -> float:
    """-lr / divisor (or -lr), the loops' scale of an update, computed as they compute it: in Python floats, or for
    a learning rate given as a tensor (a 0-d float32 one, as a rule) in that tensor's ops, read at the end."""
    if isinstance(lr, torch.Tensor):
        return call(aten.neg.default, lr if divisor is None else call(aten.div.Tensor, lr, divisor)).item()
    return -lr if divisor is None else -(lr / divisor)


def _gradient(call: Call, grad: torch.Tensor, param: torch.Tensor, weight_decay: float,
              maximize: bool) -> torch.Tensor:
    """The gradient the loops step by: negated to maximise, plus weight_decay times the parameter."""
    grad = call(aten.neg.default, grad) if maximize else grad
    return call(aten.add.Tensor, grad, param, alpha=weight_decay) if weight_decay != 0 else grad


def _fused_adam(op: Any, call: Call, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
                exp_avgs: Sequence[torch.Tensor], exp_avg_sqs: Sequence[torch.Tensor],
                max_exp_avg_sqs: Sequence[torch.Tensor], state_steps: Sequence[torch.Tensor], *,
                lr: float | torch.Tensor, beta1: float, beta2: float, weight_decay: float, eps: float, amsgrad: bool,
                maximize: bool, grad_scale: torch.Tensor | None = None, found_inf: torch.Tensor | None = None) -> None:
    """aten._fused_adam_ and _fused_adamw_ (`op`; AdamW's weight decay scales the parameter first) as
    torch.optim.adam's single-tensor loop."""
    _no_scaler(op, grad_scale, found_inf)
    decoupled = op in (aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr)
    for i, param in enumerate(params):
        if decoupled and weight_decay != 0:
            call(aten.mul_.Tensor, param, call(aten.rsub.Scalar, call(aten.mul.Tensor, lr, weight_decay), 1)
                 if isinstance(lr, torch.Tensor) else 1 - lr * weight_decay)
        grad = _gradient(call, grads[i], param, 0 if decoupled else weight_decay, maximize)
        call(aten.lerp_.Scalar, exp_avgs[i], grad, 1 - beta1)
        call(aten.mul_.Tensor, exp_avg_sqs[i], beta2)
        call(aten.addcmul_.default, exp_avg_sqs[i], grad, grad, value=1 - beta2)
        step = state_steps[i].item()
        bias_correction1, bias_correction2 = 1 - beta1**step, 1 - beta2**step
        value = _rate(call, lr, bias_correction1)
        second = exp_avg_sqs[i]
        if amsgrad:
            second = call(aten.maximum.out, max_exp_avg_sqs[i], second, out=max_exp_avg_sqs[i])
        denom = call(aten.div.Tensor, call(aten.sqrt.default, second), bias_correction2**0.5)
        call(aten.add_.Tensor, denom, eps)
        call(aten.addcdiv_.default, param, exp_avgs[i], denom, value=value)


def fused_sgd(call: Call, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
              momentum_buffer_list: Sequence[torch.Tensor], *, weight_decay: float, momentum: float,
              lr: float | torch.Tensor, dampening: float, nesterov: bool, maximize: bool, is_first_step: bool,
              grad_scale: torch.Tensor | None = None, found_inf: torch.Tensor | None = None) -> None:
    """aten._fused_sgd_ as torch.optim.sgd's single-tensor loop (its first step's momentum buffer a copy of the
    gradient: torch.optim hands the kernel empty buffers then)."""
    _no_scaler(aten._fused_sgd_.default, grad_scale, found_inf)
    for i, param in enumerate(params):
        grad = _gradient(call, grads[i], param, weight_decay, maximize)
        if momentum != 0:
            buf = momentum_buffer_list[i]
            if is_first_step:
                call(aten.copy_.default, buf, grad)
            else:
                call(aten.mul_.Tensor, buf, momentum)
                call(aten.add_.Tensor, buf, grad, alpha=1 - dampening)
            grad = call(aten.add.Tensor, grad, buf, alpha=momentum) if nesterov else buf
        call(aten.add_.Tensor, param, grad, alpha=_rate(call, lr))


def fused_adagrad(call: Call, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
                  state_sums: Sequence[torch.Tensor], state_steps: Sequence[torch.Tensor], *,
                  lr: float | torch.Tensor, lr_decay: float, weight_decay: float, eps: float, maximize: bool,
                  grad_scale: torch.Tensor | None = None, found_inf: torch.Tensor | None = None) -> None:
    """aten._fused_adagrad_ as torch.optim.adagrad's single-tensor loop."""
    _no_scaler(aten._fused_adagrad_.default, grad_scale, found_inf)
    for i, param in enumerate(params):
        grad = _gradient(call, grads[i], param, weight_decay, maximize)
        value = _rate(call, lr, 1 + (state_steps[i].item() - 1) * lr_decay)
        call(aten.addcmul_.default, state_sums[i], grad, grad)
        std = call(aten.add_.Tensor, call(aten.sqrt.default, state_sums[i]), eps)
        call(aten.addcdiv_.default, param, grad, std, value=value)


def _variance(call: Call, x: torch.Tensor, dim: Sequence[int] | int | None, correction: float | None,
              keepdim: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the variance sum((x - mean)^2) / (n - correction), correction 1 unless given, and the mean, keepdim's)."""
    dims = _reduced(x, dim)
    mean = call(aten.mean.dim, x, dims, True)
    xc = call(aten.sub.Tensor, x, mean)
    squares = call(aten.sum.dim_IntList, call(aten.mul.Tensor, xc, xc), dims, keepdim)
    count = math.prod(x.shape[d] for d in dims) - (1 if correction is None else correction)
    return call(aten.div.Tensor, squares, count), mean if keepdim else mean.squeeze(dims)


def var(call: Call, x: torch.Tensor, dim: Sequence[int] | int | None = None, *, correction: float | None = None,
        keepdim: bool = False) -> torch.Tensor:
    """aten.var.correction: `_variance`."""
    return _variance(call, x, dim, correction, keepdim)[0]


def std(call: Call, x: torch.Tensor, dim: Sequence[int] | int | None = None, *, correction: float | None = None,
        keepdim: bool = False) -> torch.Tensor:
    """aten.std.correction: the square root of `_variance`."""
    return call(aten.sqrt.default, var(call, x, dim, correction=correction, keepdim=keepdim))


def var_mean(call: Call, x: torch.Tensor, dim: Sequence[int] | int | None = None, *,
             correction: float | None = None, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """aten.var_mean.correction: (`_variance`, the mean)."""
    return _variance(call, x, dim, correction, keepdim)


def std_mean(call: Call, x: torch.Tensor, dim: Sequence[int] | int | None = None, *,
             correction: float | None = None, keepdim: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """aten.std_mean.correction: (the square root of `_variance`, the mean)."""
    variance, mean = _variance(call, x, dim, correction, keepdim)
    return call(aten.sqrt.default, variance), mean


def silu(call: Call, x: torch.Tensor) -> torch.Tensor:
    """aten.silu: x * sigmoid(x), the sigmoid rounded first."""
    return call(aten.mul.Tensor, x, call(aten.sigmoid.default, x))


def silu_backward(call: Call, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """aten.silu_backward: grad * (s * (1 + x * (1 - s))), s = sigmoid(x)."""
    s = call(aten.sigmoid.default, x)
    inner = call(aten.add.Tensor, call(aten.mul.Tensor, x, call(aten.rsub.Scalar, s, 1)), 1)
    return call(aten.mul.Tensor, grad, call(aten.mul.Tensor, s, inner))


def leaky_relu(call: Call, x: torch.Tensor, negative_slope: float = 0.01) -> torch.Tensor:
    """aten.leaky_relu: x where x > 0, else x * negative_slope (one IEEE product)."""
    return call(aten.where.self, call(aten.gt.Scalar, x, 0), x, call(aten.mul.Tensor, x, negative_slope))


def leaky_relu_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, negative_slope: float,
                        self_is_result: bool) -> torch.Tensor:
    """aten.leaky_relu_backward: grad where x > 0, else grad * negative_slope (x: the input or, as torch passes
    it after an in-place leaky ReLU, the output, positive at the same places)."""
    return call(aten.where.self, call(aten.gt.Scalar, x, 0), grad, call(aten.mul.Tensor, grad, negative_slope))


def rrelu_with_noise_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, noise: torch.Tensor, lower: float,
                              upper: float, training: bool, self_is_result: bool) -> torch.Tensor:
    """aten.rrelu_with_noise_backward (torch's formula): in training with a range wider than 1e-6, grad times the
    drawn slopes (one rounded product); else a leaky ReLU's backward with slope (lower + upper) / 2."""
    if training and upper - lower > 1e-6:
        return call(aten.mul.Tensor, grad, noise)
    return leaky_relu_backward(call, grad, x, (lower + upper) / 2, self_is_result)


def max_unpool2d(call: Call, x: torch.Tensor, indices: torch.Tensor, output_size: Sequence[int]) -> torch.Tensor:
    """aten.max_unpool2d: each value placed at its index in a plane of zeros (exact; its backward pass is a gather).
    An index that repeats in a plane is refused: which value lands there is the device's kernel's choice."""
    flat = indices.flatten(-2)
    ordered = flat.sort(-1).values
    if (ordered[..., 1:] == ordered[..., :-1]).any():
        raise UnsupportedOpError(str(aten.max_unpool2d.default), "an index repeats within a plane (overlapping "
                                 "pooling windows chose one value twice): the device decides which value lands there")
    out = torch.zeros(*x.shape[:-2], output_size[0] * output_size[1], dtype=x.dtype, device=x.device)
    return out.scatter_(-1, flat, x.flatten(-2)).unflatten(-1, tuple(output_size))


def _no_dtype(op: Any, x: torch.Tensor, dtype: torch.dtype | None) -> None:
    if dtype not in (None, x.dtype):
        raise UnsupportedOpError(str(op), f"dtype={dtype} on a {x.dtype} input: the registry computes in the "
                                 "input's dtype (vtrain.composites)")


def safe_softmax(call: Call, x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
    """aten._safe_softmax (attention's math path): softmax, and 0 along a line of -inf only, where softmax is NaN."""
    _no_dtype(aten._safe_softmax.default, x, dtype)
    empty = call(aten.eq.Scalar, call(aten.amax.default, x, [dim], True), -math.inf)
    p = call(aten._softmax.default, call(aten.masked_fill.Scalar, x, empty, 0.0), dim, False)
    return call(aten.masked_fill.Scalar, p, empty, 0.0)


def _attention(call: Call, q: torch.Tensor, k: torch.Tensor, is_causal: bool, attn_mask: torch.Tensor | None,
               scale: float | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
    """(the probabilities p = e / z over (N, L, S), the row maxima m, the sums z, the scale) of attention on
    (..., L, E) queries and (..., S, E) keys (as many heads), their leading dims flattened: scores
    s = (q k^T) * scale, plus a float mask's finite values; masked where causal, where a boolean mask is False or
    a float mask -inf; e = exp(s - m) with m the largest unmasked score, 0 where masked; z = sum e. A row with every
    key masked has m = 0 and z = 1, so p = 0 there, as torch's kernel gives (`masked_exp`)."""
    (length, width), keys = q.shape[-2:], k.shape[-2]
    scale = 1.0 / math.sqrt(width) if scale is None else scale
    q3, k3 = q.reshape(-1, length, width), k.reshape(-1, keys, width)
    s = call(aten.mul.Tensor, call(aten.bmm.default, q3, k3.transpose(1, 2)), scale)
    masked = torch.ones(length, keys, dtype=torch.bool, device=q.device).triu(1) if is_causal else None
    if attn_mask is not None:
        mask = attn_mask.expand(*q.shape[:-2], length, keys).reshape(-1, length, keys)
        if mask.dtype != torch.bool:  # (torch hands a boolean mask over as a float one of 0 and -inf)
            s = call(aten.add.Tensor, s, call(aten.masked_fill.Scalar, mask, mask == -math.inf, 0.0))
            mask = mask != -math.inf
        masked = ~mask if masked is None else masked | ~mask
    if masked is None:
        m = call(aten.amax.default, s, [-1], True)
        e = call(aten.exp.default, call(aten.sub.Tensor, s, m))
        z = call(aten.sum.dim_IntList, e, [-1], True)
    else:
        e, m = masked_exp(call, s, masked, -1)
        z = call(aten.sum.dim_IntList, e, [-1], True)
        z = call(aten.masked_fill.Scalar, z, z == 0, 1.0)  # (an unmasked row's z is at least its maximum's 1)
    return call(aten.div.Tensor, e, z), m, z, scale


def masked_exp(call: Call, s: torch.Tensor, masked: torch.Tensor,
               dim: int | list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(e = exp(s - m), 0 where `masked`; m, the largest unmasked s along dim (or dims), 0 along a line masked
    whole): the masked values never enter an IEEE op (-inf there would give an infinite output, an error here),
    they are m, then e's 0. Attention's, log-sum-exp's and, under `exact`, a softmax over a mask's -inf
    (vtrain.canonical)."""
    m = call(aten.amax.default, call(aten.masked_fill.Scalar, s, masked, -math.inf),
             dim if isinstance(dim, list) else [dim], True)
    m = call(aten.masked_fill.Scalar, m, m == -math.inf, 0.0)
    shifted = call(aten.sub.Tensor, call(aten.where.self, masked, m, s), m)
    return call(aten.masked_fill.Scalar, call(aten.exp.default, shifted), masked, 0.0), m


def _shared(q: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Keys or values t with q's heads (dim -3): grouped-query attention's shared heads, each repeated for its group
    (exact copies)."""
    groups = q.shape[-3] // t.shape[-3]
    return t if groups == 1 else t.repeat_interleave(groups, dim=-3)


def _group_sums(call: Call, grad: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The gradient of `_shared(q, like)` (grad, in q's heads) for `like` itself: summed over each group."""
    groups = grad.shape[-3] // like.shape[-3]
    if groups == 1:
        return grad
    per_group = grad.reshape(*like.shape[:-2], groups, *like.shape[-2:])
    return call(aten.sum.dim_IntList, per_group, [like.dim() - 2], False)


def _no_dropout(op: Any, dropout_p: float) -> None:
    if dropout_p:
        raise UnsupportedOpError(str(op), f"dropout_p={dropout_p}: the kernel would draw its dropout mask on the "
                                 "device; pass dropout_p=0 and apply masks drawn from the seed (vtrain.composites)")


def flash_attention(call: Call, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                    is_causal: bool = False, *, attn_mask: torch.Tensor | None = None,
                    scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """aten._scaled_dot_product_flash_attention_for_cpu (F.scaled_dot_product_attention on CPU): (p v, the
    log-sum-exp m + log z of each row), with `_attention`'s p."""
    _no_dropout(aten._scaled_dot_product_flash_attention_for_cpu.default, dropout_p)
    k, v = _shared(q, k), _shared(q, v)
    p, m, z, _ = _attention(call, q, k, is_causal, attn_mask, scale)
    out = call(aten.bmm.default, p, v.reshape(-1, *v.shape[-2:]))
    lse = call(aten.add.Tensor, m, call(aten.log.default, z))
    return out.reshape(*q.shape[:-1], v.shape[-1]), lse.reshape(q.shape[:-1])


def flash_attention_backward(call: Call, grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             out: torch.Tensor, logsumexp: torch.Tensor, dropout_p: float, is_causal: bool, *,
                             attn_mask: torch.Tensor | None = None,
                             scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Its backward pass, p recomputed as the forward computed it: dv = p^T g, ds = p (g v^T - rowsum(g out))
    * scale (softmax's backward, rowsum(g v^T p) being rowsum(g out)), dq = ds k, dk = ds^T q."""
    _no_dropout(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, dropout_p)
    keys, values = k, v
    k, v = _shared(q, k), _shared(q, v)
    p, _, _, scale = _attention(call, q, k, is_causal, attn_mask, scale)
    flat = [t.reshape(-1, *t.shape[-2:]) for t in (grad_out, q, k, v, out)]
    g, q3, k3, v3, o3 = flat
    dv = call(aten.bmm.default, p.transpose(1, 2), g)
    rows = call(aten.sum.dim_IntList, call(aten.mul.Tensor, g, o3), [-1], True)
    ds = call(aten.mul.Tensor, call(aten.sub.Tensor, call(aten.bmm.default, g, v3.transpose(1, 2)), rows), p)
    ds = call(aten.mul.Tensor, ds, scale)
    dq, dk = call(aten.bmm.default, ds, k3), call(aten.bmm.default, ds.transpose(1, 2), q3)
    return (dq.reshape(q.shape), _group_sums(call, dk.reshape(k.shape), keys),
            _group_sums(call, dv.reshape(v.shape), values))


def _reduce(call: Call, loss: torch.Tensor, reduction: int) -> torch.Tensor:
    """A loss's reduction: 0 none, 1 the mean, 2 the sum (torch's enum)."""
    if reduction == 0:
        return loss
    return call(aten.mean.dim if reduction == 1 else aten.sum.dim_IntList, loss, list(range(loss.dim())), False)


def _scaled_grad(call: Call, g: torch.Tensor, grad: torch.Tensor, reduction: int) -> torch.Tensor:
    """g * grad, divided by the element count under a mean."""
    g = call(aten.mul.Tensor, g, grad)
    return call(aten.div.Tensor, g, g.numel()) if reduction == 1 else g


def mse_loss(call: Call, x: torch.Tensor, target: torch.Tensor, reduction: int = 1) -> torch.Tensor:
    """aten.mse_loss: (x - target)^2, reduced."""
    d = call(aten.sub.Tensor, x, target)
    return _reduce(call, call(aten.mul.Tensor, d, d), reduction)


def mse_loss_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor,
                      reduction: int) -> torch.Tensor:
    """aten.mse_loss_backward: 2 (x - target) grad (/ n under a mean)."""
    return _scaled_grad(call, call(aten.mul.Tensor, call(aten.sub.Tensor, x, target), 2.0), grad, reduction)


def huber_loss(call: Call, x: torch.Tensor, target: torch.Tensor, reduction: int = 1,
               delta: float = 1.0) -> torch.Tensor:
    """aten.huber_loss: with z = |x - target|, (0.5 z) z where z < delta, else (z - 0.5 delta) delta; reduced."""
    z = call(aten.abs.default, call(aten.sub.Tensor, x, target))
    quadratic = call(aten.mul.Tensor, call(aten.mul.Tensor, z, 0.5), z)
    linear = call(aten.mul.Tensor, call(aten.sub.Tensor, z, 0.5 * delta), delta)
    return _reduce(call, call(aten.where.self, call(aten.lt.Scalar, z, delta), quadratic, linear), reduction)


def huber_loss_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor, reduction: int,
                        delta: float) -> torch.Tensor:
    """aten.huber_loss_backward: (x - target) where |x - target| < delta, else sign(x - target) delta; times grad."""
    d = call(aten.sub.Tensor, x, target)
    inside = call(aten.lt.Scalar, call(aten.abs.default, d), delta)
    g = call(aten.where.self, inside, d, call(aten.mul.Tensor, call(aten.sign.default, d), delta))
    return _scaled_grad(call, g, grad, reduction)


def smooth_l1_loss(call: Call, x: torch.Tensor, target: torch.Tensor, reduction: int = 1,
                   beta: float = 1.0) -> torch.Tensor:
    """aten.smooth_l1_loss: with z = |x - target|, (0.5 z) z / beta where z < beta, else z - 0.5 beta; reduced."""
    z = call(aten.abs.default, call(aten.sub.Tensor, x, target))
    if beta == 0:
        return _reduce(call, z, reduction)
    quadratic = call(aten.div.Tensor, call(aten.mul.Tensor, call(aten.mul.Tensor, z, 0.5), z), beta)
    linear = call(aten.sub.Tensor, z, 0.5 * beta)
    return _reduce(call, call(aten.where.self, call(aten.lt.Scalar, z, beta), quadratic, linear), reduction)


def smooth_l1_loss_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor, reduction: int,
                            beta: float) -> torch.Tensor:
    """aten.smooth_l1_loss_backward: (x - target) / beta where |x - target| < beta, else its sign; times grad."""
    d = call(aten.sub.Tensor, x, target)
    g = call(aten.sign.default, d)
    if beta != 0:
        g = call(aten.where.self, call(aten.lt.Scalar, call(aten.abs.default, d), beta), call(aten.div.Tensor, d, beta),
                 g)
    return _scaled_grad(call, g, grad, reduction)


def bce_with_logits(call: Call, x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                    pos_weight: torch.Tensor | None = None, reduction: int = 1) -> torch.Tensor:
    """aten.binary_cross_entropy_with_logits: (1 - t) x + w_t softplus(-x), with softplus(-x) = log1p(exp(-|x|)) +
    max(-x, 0) (no exponential of a large value) and w_t = (pos_weight - 1) t + 1 (1 without pos_weight); times
    weight; reduced. (Its backward pass is torch's formula in registry ops.)"""
    softplus = call(aten.add.Tensor, call(aten.log1p.default, call(aten.exp.default, call(aten.neg.default,
                    call(aten.abs.default, x)))), call(aten.clamp_min.default, call(aten.neg.default, x), 0))
    if pos_weight is not None:
        scale = call(aten.add.Tensor, call(aten.mul.Tensor, call(aten.sub.Tensor, pos_weight, 1), target), 1)
        softplus = call(aten.mul.Tensor, scale, softplus)
    loss = call(aten.add.Tensor, call(aten.mul.Tensor, call(aten.rsub.Scalar, target, 1), x), softplus)
    return _reduce(call, loss if weight is None else call(aten.mul.Tensor, loss, weight), reduction)


def _softplus_parts(call: Call, x: torch.Tensor, beta: float, threshold: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(where beta x > threshold, beta x with 0 there: no exponential of a large value)."""
    xb = x if beta == 1 else call(aten.mul.Tensor, x, beta)
    linear = call(aten.gt.Scalar, xb, threshold)
    return linear, call(aten.masked_fill.Scalar, xb, linear, 0.0)


def softplus(call: Call, x: torch.Tensor, beta: float = 1, threshold: float = 20) -> torch.Tensor:
    """aten.softplus: x where beta x > threshold, else log1p(exp(beta x)) / beta."""
    linear, xb = _softplus_parts(call, x, beta, threshold)
    y = call(aten.log1p.default, call(aten.exp.default, xb))
    return call(aten.where.self, linear, x, y if beta == 1 else call(aten.div.Tensor, y, beta))


def softplus_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, beta: float, threshold: float) -> torch.Tensor:
    """aten.softplus_backward: grad where beta x > threshold, else grad sigmoid(beta x)."""
    linear, xb = _softplus_parts(call, x, beta, threshold)
    return call(aten.where.self, linear, grad, call(aten.mul.Tensor, grad, call(aten.sigmoid.default, xb)))


def elu(call: Call, x: torch.Tensor, alpha: float = 1, scale: float = 1, input_scale: float = 1) -> torch.Tensor:
    """aten.elu: x scale where x > 0, else expm1(x input_scale) alpha scale (the exponential taken of 0 where
    x > 0)."""
    positive = call(aten.gt.Scalar, x, 0)
    xn = call(aten.masked_fill.Scalar, x, positive, 0.0)
    negative = call(aten.mul.Tensor, call(aten.expm1.default, _times(call, xn, input_scale)), alpha * scale)
    return call(aten.where.self, positive, _times(call, x, scale), negative)


def elu_(call: Call, x: torch.Tensor, alpha: float = 1, scale: float = 1, input_scale: float = 1) -> torch.Tensor:
    """aten.elu_: `elu`, written into x."""
    return call(aten.copy_.default, x, elu(call, x, alpha, scale, input_scale))


def celu(call: Call, x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """aten.celu: `elu` with input scale 1 / alpha."""
    return elu(call, x, alpha, 1, 1 / alpha)


def celu_(call: Call, x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """aten.celu_: `celu`, written into x."""
    return elu_(call, x, alpha, 1, 1 / alpha)


def elu_backward(call: Call, grad: torch.Tensor, alpha: float, scale: float, input_scale: float, is_result: bool,
                 x_or_y: torch.Tensor) -> torch.Tensor:
    """aten.elu_backward: grad scale where the input is > 0; else grad exp(x input_scale) alpha scale input_scale,
    or, from the output y (after an in-place ELU), grad (y + alpha scale) input_scale."""
    positive = call(aten.gt.Scalar, x_or_y, 0)
    at = call(aten.masked_fill.Scalar, x_or_y, positive, 0.0)
    if is_result:
        slope = _times(call, call(aten.add.Tensor, at, alpha * scale), input_scale)
    else:
        slope = call(aten.mul.Tensor, call(aten.exp.default, _times(call, at, input_scale)),
                     alpha * scale * input_scale)
    return call(aten.where.self, positive, _times(call, grad, scale), call(aten.mul.Tensor, grad, slope))


def hardsigmoid(call: Call, x: torch.Tensor) -> torch.Tensor:
    """aten.hardsigmoid: clamp(x + 3, 0, 6) / 6."""
    return call(aten.div.Tensor, call(aten.clamp.default, call(aten.add.Tensor, x, 3), 0, 6), 6)


def hardsigmoid_backward(call: Call, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """aten.hardsigmoid_backward: grad / 6 where -3 < x < 3, else 0."""
    outside = call(aten.logical_not.default, call(aten.logical_and.default, call(aten.gt.Scalar, x, -3),
                                                   call(aten.lt.Scalar, x, 3)))
    return call(aten.masked_fill.Scalar, call(aten.div.Tensor, grad, 6), outside, 0.0)


def hardswish(call: Call, x: torch.Tensor) -> torch.Tensor:
    """aten.hardswish: (x clamp(x + 3, 0, 6)) / 6."""
    return call(aten.div.Tensor, call(aten.mul.Tensor, x, call(aten.clamp.default, call(aten.add.Tensor, x, 3), 0, 6)),
                6)


def hardswish_backward(call: Call, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """aten.hardswish_backward: 0 where x < -3, grad (x / 3 + 0.5) up to 3, grad above."""
    middle = call(aten.mul.Tensor, grad, call(aten.add.Tensor, call(aten.div.Tensor, x, 3), 0.5))
    inner = call(aten.where.self, call(aten.le.Scalar, x, 3), middle, grad)
    return call(aten.masked_fill.Scalar, inner, call(aten.lt.Scalar, x, -3), 0.0)


def log_sigmoid(call: Call, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """aten.log_sigmoid_forward: (min(x, 0) - log1p(exp(-|x|)), an empty buffer: the backward pass below reads x)."""
    tail = call(aten.log1p.default, call(aten.exp.default, call(aten.neg.default, call(aten.abs.default, x))))
    return call(aten.sub.Tensor, call(aten.clamp_max.default, x, 0), tail), x.new_empty(0)


def log_sigmoid_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, buffer: torch.Tensor) -> torch.Tensor:
    """aten.log_sigmoid_backward: grad sigmoid(-x)."""
    return call(aten.mul.Tensor, grad, call(aten.sigmoid.default, call(aten.neg.default, x)))


def mish(call: Call, x: torch.Tensor) -> torch.Tensor:
    """aten.mish: x tanh(softplus(x)), `softplus` at beta 1 and threshold 20."""
    return call(aten.mul.Tensor, x, call(aten.tanh.default, softplus(call, x)))


def mish_backward(call: Call, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """aten.mish_backward: grad (t + x sigmoid(x) (1 - t t)), t = tanh(softplus(x))."""
    t = call(aten.tanh.default, softplus(call, x))
    slope = call(aten.mul.Tensor, call(aten.mul.Tensor, x, call(aten.sigmoid.default, x)),
                 call(aten.rsub.Scalar, call(aten.mul.Tensor, t, t), 1))
    return call(aten.mul.Tensor, grad, call(aten.add.Tensor, t, slope))


def _x_times_log(log: Any, neutral: float, call: Call, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """aten.xlogy.Tensor, x log(y), and aten.special_xlog1py, x log1p(y): 0 where x is 0 (the log taken there of
    `neutral`, whose log is 0, whatever y holds: torch's NaN for a NaN y there would stop the step). x and y
    broadcast against each other."""
    x, y = torch.broadcast_tensors(x, y)
    at_zero = call(aten.eq.Scalar, x, 0)
    return call(aten.mul.Tensor, x, call(log, call(aten.masked_fill.Scalar, y, at_zero, neutral)))


def _times(call: Call, x: torch.Tensor, factor: float) -> torch.Tensor:
    return x if factor == 1 else call(aten.mul.Tensor, x, factor)


def _multiples(larger: Sequence[int], smaller: Sequence[int]) -> list[int]:
    """larger // smaller dim by dim, 0 where a size is not a whole multiple of the other: an upsampling's factors,
    an adaptive pooling's windows."""
    return [big // small if small and big % small == 0 else 0 for big, small in zip(larger, smaller)]


def _whole_scales(op: Any, output_size: Sequence[int], input_size: Sequence[int],
                  scales: Sequence[float | None]) -> list[int]:
    """A nearest upsampling's factors where each input pixel fills a whole block of the output (output sizes
    whole multiples, the scales given, if any, those multiples); otherwise refused: a pixel's share of the output
    would vary, and its gradient's sum with it."""
    factors = _multiples(output_size, input_size)
    if 0 in factors or any(s is not None and s != f for s, f in zip(scales, factors)):
        raise UnsupportedOpError(str(op), f"output {list(output_size)} from input {list(input_size)}, scales "
                                 f"{list(scales)}: the registry has whole-number factors only (vtrain.composites)")
    return factors


def _upsample_nearest_backward(op: Any, call: Call, grad: torch.Tensor, output_size: Sequence[int],
                               input_size: Sequence[int], *scales: float | None) -> torch.Tensor:
    """aten.upsample_nearest{1,2,3}d_backward (and nearest-exact's) at whole-number factors: each input pixel's
    gradient is the sum of its block of the output's (factor_1 x ... values)."""
    factors = _whole_scales(op, output_size, input_size[2:], scales)
    blocks = [d for size, f in zip(input_size[2:], factors) for d in (size, f)]  # (size, factor) per spatial dim
    return call(aten.sum.dim_IntList, grad.reshape(*input_size[:2], *blocks),
                [3 + 2 * k for k in range(len(factors))], False)


def logsumexp(call: Call, x: torch.Tensor, dim: Sequence[int] | int, keepdim: bool = False) -> torch.Tensor:
    """aten.logsumexp: log(sum(exp(x - m))) + m, m the largest x over the dims, as torch computes it, a -inf in x
    (a mask) adding 0 (`masked_exp`). (A line of -inf only has the log-sum-exp -inf, off the grid: the log names
    it.)"""
    dims = _reduced(x, dim)
    e, top = masked_exp(call, x, call(aten.eq.Scalar, x, -math.inf), dims)
    total = call(aten.sum.dim_IntList, e, dims, keepdim)
    return call(aten.add.Tensor, call(aten.log.default, total), top if keepdim else top.squeeze(dims))


def _plus_scaled(call: Call, x: torch.Tensor, product: torch.Tensor, beta: float) -> torch.Tensor:
    """beta x + product (x not read at beta 0, as torch's fused products do): the tail of baddbmm, addmv, addbmm."""
    return product if beta == 0 else call(aten.add.Tensor, _times(call, x, beta), product)


def baddbmm(call: Call, x: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta: float = 1,
            alpha: float = 1) -> torch.Tensor:
    """aten.baddbmm: beta x + alpha (batch1 @ batch2), the product a bmm (x not read at beta 0, as torch)."""
    product = _times(call, call(aten.bmm.default, batch1, batch2), alpha)
    return _plus_scaled(call, x, product, beta)


def addmv(call: Call, x: torch.Tensor, mat: torch.Tensor, vec: torch.Tensor, *, beta: float = 1,
          alpha: float = 1) -> torch.Tensor:
    """aten.addmv (nn.Linear on one sample): beta x + alpha (mat @ vec), the product an mv, as `baddbmm`."""
    product = _times(call, call(aten.mv.default, mat, vec), alpha)
    return _plus_scaled(call, x, product, beta)


def addbmm(call: Call, x: torch.Tensor, batch1: torch.Tensor, batch2: torch.Tensor, *, beta: float = 1,
           alpha: float = 1) -> torch.Tensor:
    """aten.addbmm: beta x + alpha sum_b (batch1[b] @ batch2[b]): the products a bmm, their sum over the batch
    the device's, then as `baddbmm`."""
    total = call(aten.sum.dim_IntList, call(aten.bmm.default, batch1, batch2), [0])
    product = _times(call, total, alpha)
    return _plus_scaled(call, x, product, beta)


def addr(call: Call, x: torch.Tensor, vec1: torch.Tensor, vec2: torch.Tensor, *, beta: float = 1,
         alpha: float = 1) -> torch.Tensor:
    """aten.addr: beta x + alpha (vec1 vec2^T), each product vec1_i vec2_j one rounded multiplication, then as
    `baddbmm`."""
    product = _times(call, call(aten.mul.Tensor, vec1.unsqueeze(1), vec2.unsqueeze(0)), alpha)
    return _plus_scaled(call, x, product, beta)


def trilinear(call: Call, i1: torch.Tensor, i2: torch.Tensor, i3: torch.Tensor, expand1: Sequence[int],
              expand2: Sequence[int], expand3: Sequence[int], sumdim: Sequence[int], unroll_dim: int = 1) -> torch.Tensor:
    """aten._trilinear (F.bilinear, nn.Bilinear, and their backward passes): each operand with size-1 dims inserted
    at its `expand` positions, the broadcast product (i1 i2) i3, each product rounded, summed over `sumdim` by the
    device (`unroll_dim` only chooses torch's loop)."""
    def grown(t: torch.Tensor, expand: Sequence[int]) -> torch.Tensor:
        for d in sorted(expand):
            t = t.unsqueeze(d)
        return t

    product = call(aten.mul.Tensor, call(aten.mul.Tensor, grown(i1, expand1), grown(i2, expand2)), grown(i3, expand3))
    return call(aten.sum.dim_IntList, product, sorted(sumdim)) if len(sumdim) else product


def _logaddexp(power: Any, scale: float, call: Call, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """aten.logaddexp: max(x, other) + log1p(exp(-|x - other|)), and aten.logaddexp2: max(x, other) +
    log1p(exp2(-|x - other|)) times 1 / log(2) (torch's formulas, its constant), each operation rounded. An
    infinite operand leaves the grid in the subtraction and stops the step, naming it."""
    spread = call(aten.abs.default, call(aten.sub.Tensor, x, other))
    tail = _times(call, call(aten.log1p.default, call(power, call(aten.neg.default, spread))), scale)
    return call(aten.add.Tensor, call(aten.maximum.default, x, other), tail)


def hypot(call: Call, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """aten.hypot: sqrt(x x + other other), each operation rounded (torch's kernel is the C library's hypot, which
    each library computes to within an ulp in its own way)."""
    squares = call(aten.add.Tensor, call(aten.mul.Tensor, x, x), call(aten.mul.Tensor, other, other))
    return call(aten.sqrt.default, squares)


def _all_but(x: torch.Tensor, dim: int) -> list[int]:
    return [d for d in range(x.dim()) if d != dim % x.dim()]


def renorm(call: Call, x: torch.Tensor, p: float, dim: int, maxnorm: float) -> torch.Tensor:
    """aten.renorm: each slice along `dim` whose p-norm (`vector_norm`, over the other dims) exceeds maxnorm, times
    maxnorm / (norm + 1e-7) (torch's factor: its sum and quotient rounded), one product a value."""
    norm = vector_norm(call, x, p, _all_but(x, dim), True)
    factor = call(aten.div.Tensor, call(aten.full_like.default, norm, maxnorm), call(aten.add.Tensor, norm, 1e-7))
    return call(aten.mul.Tensor, x, torch.where(norm > maxnorm, factor, 1.0))


def weight_norm(call: Call, v: torch.Tensor, g: torch.Tensor, dim: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """aten._weight_norm_interface (nn.utils.weight_norm and its parametrization, on the first or last dim): (v times
    g / ||v||, ||v||), the norm over every dim but `dim` (`vector_norm`, in g's shape), g / ||v|| one rounded
    division, then one product a value."""
    norms = vector_norm(call, v, 2, _all_but(v, dim), True)
    return call(aten.mul.Tensor, v, call(aten.div.Tensor, g, norms)), norms


def weight_norm_backward(call: Call, grad_w: torch.Tensor, v: torch.Tensor, g: torch.Tensor, norms: torch.Tensor,
                         dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """aten._weight_norm_interface_backward: with s = sum(grad_w v) over the other dims (rounded products, the
    device's sum), grad_g = s / ||v|| and grad_v = (g / ||v||) (grad_w - v (grad_g / ||v||)), each operation
    rounded (the closed form of w = g v / ||v||'s gradients)."""
    s = call(aten.sum.dim_IntList, call(aten.mul.Tensor, grad_w, v), _all_but(v, dim), True)
    grad_g = call(aten.div.Tensor, s, norms)
    along = call(aten.sub.Tensor, grad_w, call(aten.mul.Tensor, v, call(aten.div.Tensor, grad_g, norms)))
    return call(aten.mul.Tensor, call(aten.div.Tensor, g, norms), along), grad_g


def embedding_renorm_(call: Call, weight: torch.Tensor, indices: torch.Tensor, max_norm: float,
                      norm_type: float) -> torch.Tensor:
    """aten.embedding_renorm_ (F.embedding's max_norm): each row the indices name (once, however often named) whose
    norm (`vector_norm` of order norm_type, row by row) exceeds max_norm, times max_norm / (norm + 1e-7), that factor
    in float64 (torch's kernel computes it in doubles), one rounded product a value; in place."""
    rows = torch.unique(indices.reshape(-1))  # (sorted, as torch's kernel takes them; a copy: exact)
    if not rows.numel():
        return weight
    selected = weight[rows]
    norms = vector_norm(call, selected, norm_type, [1])
    over = norms > max_norm
    scaled = call(aten.mul.Tensor, selected, (max_norm / (norms + 1e-7)).unsqueeze(1))
    weight[rows[over]] = scaled[over]
    return weight


def dist(call: Call, x: torch.Tensor, other: torch.Tensor, p: float = 2) -> torch.Tensor:
    """aten.dist: `vector_norm` of order p of x - other (one rounded subtraction a pair)."""
    return vector_norm(call, call(aten.sub.Tensor, x, other), p)


def vdot(call: Call, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """aten.vdot (spectral_norm's power iteration) of real vectors: their dot product, the device's."""
    if x.is_complex():
        raise UnsupportedOpError(str(aten.vdot.default), "complex vectors: the registry is real (vtrain.ops)")
    return call(aten.dot.default, x, other)


def solve_triangular(call: Call, a: torch.Tensor, b: torch.Tensor, *, upper: bool, left: bool = True,
                     unitriangular: bool = False) -> torch.Tensor:
    """aten.linalg_solve_triangular (a MultivariateNormal's Mahalanobis distance, by its scale_tril): A X = B by
    substitution from the triangle's corner, row i of X being (B_i - A_i,known X_known) / A_ii, the products of the
    rows already known summed by the device's bmm, then one rounded subtraction and division (no product for the
    first row, no division where `unitriangular`). X A = B (not `left`) is A^T X^T = B^T. (LAPACK's blocked solve
    keeps an order of its own.)"""
    if not left:
        return solve_triangular(call, a.mT, b.mT, upper=not upper, unitriangular=unitriangular).mT
    n, k = a.shape[-1], b.shape[-1]
    batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a, b = a.expand(*batch, n, n), b.expand(*batch, n, k)
    known = b[..., :0, :]  # (the rows of X solved so far, in index order)
    for i in (range(n - 1, -1, -1) if upper else range(n)):
        row = b[..., i:i + 1, :]
        if known.shape[-2]:
            coefficients = a[..., i:i + 1, i + 1:] if upper else a[..., i:i + 1, :i]
            product = call(aten.bmm.default, coefficients.reshape(-1, 1, known.shape[-2]),
                           known.reshape(-1, known.shape[-2], k))
            row = call(aten.sub.Tensor, row, product.reshape(*batch, 1, k))
        if not unitriangular:
            row = call(aten.div.Tensor, row, a[..., i:i + 1, i:i + 1])
        known = torch.cat([row, known] if upper else [known, row], -2)
    return known


def cholesky(call: Call, a: torch.Tensor, *, upper: bool = False,
             check_errors: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """aten.linalg_cholesky_ex (a MultivariateNormal's covariance matrix, a Gaussian process's kernel): (L, info), L
    column by column, L_jj = sqrt(A_jj - sum_k<j L_jk^2) and L_ij = (A_ij - sum_k<j L_ik L_jk) / L_jj below it, each
    column's products summed by the device's bmm, then one rounded subtraction, root and division. A leading minor
    that is not positive definite sets info to its order (LAPACK's) and goes on with 1 as its pivot: torch leaves L
    unspecified there. upper gives U = L^T."""
    n = a.shape[-1]
    flat = a.reshape(-1, n, n)
    info = torch.zeros(flat.shape[0], dtype=torch.int32)
    lower = flat[:, :, :0]  # (L's columns so far)
    for j in range(n):
        column = flat[:, j:, j:j + 1]
        if j:
            column = call(aten.sub.Tensor, column, call(aten.bmm.default, lower[:, j:], lower[:, j:j + 1].mT))
        pivot = column[:, :1]
        failed = ~(pivot > 0).reshape(-1)  # (NaN fails too)
        info = torch.where(failed & (info == 0), j + 1, info)
        root = call(aten.sqrt.default, torch.where(failed.reshape(-1, 1, 1), 1.0, pivot))
        below = call(aten.div.Tensor, column[:, 1:], root)
        lower = torch.cat([lower, torch.cat([flat.new_zeros(len(flat), j, 1), root, below], 1)], 2)
    if check_errors and info.any():
        raise torch.linalg.LinAlgError(f"linalg.cholesky: the leading minor of order {int(info[info > 0][0])} is "
                                       "not positive-definite")
    lower = lower.reshape(a.shape)
    return lower.mT if upper else lower, info.reshape(a.shape[:-2])


def trace(call: Call, x: torch.Tensor) -> torch.Tensor:
    """aten.trace: the device's sum of the diagonal (a view: exact)."""
    return call(aten.sum.default, x.diagonal())


def norm(call: Call, x: torch.Tensor, p: float | None = 2, dim: Sequence[int] | int | None = None,
         keepdim: bool = False) -> torch.Tensor:
    """aten.norm.Scalar and norm.ScalarOpt_dim (the legacy torch.norm): `vector_norm` of order p (None: 2)."""
    return vector_norm(call, x, 2 if p is None else p, dim, keepdim)


def _clamped_log(call: Call, log: Any, x: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """max(log(x), -100), -100 where x is 0 (`zero`): the log is taken of 1 there, whose -inf would be off the
    grid."""
    y = call(log, call(aten.masked_fill.Scalar, x, zero, 1.0))
    return call(aten.clamp_min.default, call(aten.masked_fill.Scalar, y, zero, -100.0), -100)


def binary_cross_entropy(call: Call, x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None = None,
                         reduction: int = 1) -> torch.Tensor:
    """aten.binary_cross_entropy on probabilities x: (target - 1) max(log1p(-x), -100) - target max(log x, -100),
    times the weight, reduced (torch's formula: the logs clamped at -100, so that 0 and 1 give finite losses)."""
    miss = _clamped_log(call, aten.log1p.default, call(aten.neg.default, x), call(aten.eq.Scalar, x, 1))
    hit = _clamped_log(call, aten.log.default, x, call(aten.eq.Scalar, x, 0))
    loss = call(aten.sub.Tensor, call(aten.mul.Tensor, call(aten.sub.Tensor, target, 1), miss),
                call(aten.mul.Tensor, target, hit))
    return _reduce(call, loss if weight is None else call(aten.mul.Tensor, loss, weight), reduction)


def binary_cross_entropy_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor,
                                  weight: torch.Tensor | None = None, reduction: int = 1) -> torch.Tensor:
    """aten.binary_cross_entropy_backward: grad (x - target) / max((1 - x) x, 1e-12), times the weight (torch's
    formula, 1e-12 rounded onto the grid by the clamp)."""
    spread = call(aten.clamp_min.default, call(aten.mul.Tensor, call(aten.rsub.Scalar, x, 1), x), 1e-12)
    g = call(aten.div.Tensor, call(aten.sub.Tensor, x, target), spread)
    return _scaled_grad(call, g if weight is None else call(aten.mul.Tensor, g, weight), grad, reduction)


def prelu(call: Call, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """aten._prelu_kernel: x where x > 0, weight x elsewhere (weight broadcast to x)."""
    return call(aten.where.self, call(aten.gt.Scalar, x, 0), x, call(aten.mul.Tensor, weight, x))


def prelu_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> Grads:
    """aten._prelu_kernel_backward: (grad where x > 0, weight grad elsewhere; 0 where x > 0, x grad elsewhere), both
    in x's shape (autograd sums the second to the weight's)."""
    positive = call(aten.gt.Scalar, x, 0)
    return (call(aten.where.self, positive, grad, call(aten.mul.Tensor, weight, grad)),
            call(aten.masked_fill.Scalar, call(aten.mul.Tensor, x, grad), positive, 0.0))


def _adaptive_windows(size: Sequence[int], output_size: Sequence[int]) -> list[tuple[tuple[slice, ...], int]]:
    """An adaptive pooling's windows where they do not tile the input, in row-major order of the outputs: along
    each dim, floor(i H / OH) to ceil((i + 1) H / OH) (torch's), with each window's count of values."""
    axes = [[slice(i * n // o, -(-(i + 1) * n // o)) for i in range(o)] for n, o in zip(size, output_size)]
    return [(window, math.prod(a.stop - a.start for a in window)) for window in itertools.product(*axes)]


# the average poolings an adaptive one over 2 or 3 dims takes where its windows tile the input
_AVG_POOLS = {2: (aten.avg_pool2d.default, aten.avg_pool2d_backward.default),
              3: (aten.avg_pool3d.default, aten.avg_pool3d_backward.default)}


def _adaptive_avg_pool(dims: int) -> Call:
    def pool(call: Call, x: torch.Tensor, output_size: Sequence[int]) -> torch.Tensor:
        """aten._adaptive_avg_pool2d and 3d: where its windows tile the input, avg_pool2d (3d) with them as kernel
        and stride; elsewhere (windows of varying size, overlapping) each window's mean, the device's, one op a
        window."""
        window = _multiples(x.shape[-dims:], output_size)
        if 0 not in window:
            return call(_AVG_POOLS[dims][0], x, window, window, [0] * dims, False, True, None)
        axes = list(range(-dims, 0))
        means = [call(aten.mean.dim, x[(..., *w)], axes) for w, _ in _adaptive_windows(x.shape[-dims:], output_size)]
        return torch.stack(means, -1).unflatten(-1, tuple(output_size))

    return pool


def _adaptive_avg_pool_backward(dims: int) -> Call:
    def backward(call: Call, grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """aten._adaptive_avg_pool2d_backward and 3d: where the windows tile the input, avg_pool2d's (3d's) backward
        pass over them; elsewhere each output's gradient divided by its window's count (one IEEE division) and
        added to the window's inputs (one IEEE addition each), window after window in the outputs' order."""
        window = _multiples(x.shape[-dims:], grad.shape[-dims:])
        if 0 not in window:
            return call(_AVG_POOLS[dims][1], grad, x, window, window, [0] * dims, False, True, None)
        out = torch.zeros(x.shape, dtype=grad.dtype, device=grad.device)
        shares = grad.flatten(-dims)
        for k, (w, count) in enumerate(_adaptive_windows(x.shape[-dims:], grad.shape[-dims:])):
            share = call(aten.div.Tensor, shares[..., k].reshape(*shares.shape[:-1], *[1] * dims), count)
            out[(..., *w)] = call(aten.add.Tensor, out[(..., *w)], share)  # (a copy of grid values: exact)
        return out

    return backward


def _add_at_indices(call: Call, grad: torch.Tensor, x: torch.Tensor, indices: torch.Tensor, dims: int) -> torch.Tensor:
    """A max pooling's input gradient over its last `dims` dims: each output's gradient added at the input position
    its window's maximum came from (`indices`, flat over those dims), as `scatter_add` (a position several windows
    chose gets their gradients in the outputs' order)."""
    zeros = torch.zeros(x.flatten(-dims).shape, dtype=grad.dtype, device=grad.device)
    return scatter_add(call, zeros, -1, indices.flatten(-dims), grad.flatten(-dims)).reshape(x.shape)


def adaptive_max_pool2d_backward(call: Call, grad: torch.Tensor, x: torch.Tensor,
                                 indices: torch.Tensor) -> torch.Tensor:
    """aten.adaptive_max_pool2d_backward: where the windows tile the input, max_pool2d's backward pass with them
    (each input value takes at most one gradient); elsewhere each gradient added at its window's maximum as
    `scatter_add` (overlapping windows may choose one value). The forward pass is exact (class 1)."""
    window = _multiples(x.shape[-2:], grad.shape[-2:])
    if 0 not in window:
        return call(aten.max_pool2d_with_indices_backward.default, grad, x, window, window, [0, 0], [1, 1], False,
                    indices)
    return _add_at_indices(call, grad, x, indices, 2)


def max_pool3d_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, kernel_size: Sequence[int],
                        stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool,
                        indices: torch.Tensor) -> torch.Tensor:
    """aten.max_pool3d_with_indices_backward: each output's gradient added at the input position its window's
    maximum came from (`indices`, flat over the volume), as `scatter_add` (a position that overlapping windows
    chose gets their gradients in the outputs' order). The forward pass is exact (class 1)."""
    return _add_at_indices(call, grad, x, indices, 3)


def _box3d(x: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int], padding: Sequence[int],
           ceil_mode: bool, count_include_pad: bool,
           divisor_override: int | None) -> tuple[torch.Tensor, list, list, torch.Tensor, torch.Tensor | int]:
    """avg_pool3d's terms as a convolution: (x as (N C, 1, D, H, W), the stride and padding as lists, a box of
    ones the kernel's size, each window's divisor: the override, the kernel's volume, or without the padding its
    count of input values, small integers exact on any device, counted natively)."""
    k = [kernel_size[0]] * 3 if len(kernel_size) == 1 else list(kernel_size)
    s = k if not stride else [stride[0]] * 3 if len(stride) == 1 else list(stride)
    p = [padding[0]] * 3 if len(padding) == 1 else list(padding)
    if ceil_mode:
        raise UnsupportedOpError(str(aten.avg_pool3d.default), "ceil_mode=True: the registry has floor-mode windows "
                                 "(vtrain.composites)")
    flat = x.reshape(-1, 1, *x.shape[-3:])
    box = torch.ones(1, 1, *k, dtype=x.dtype, device=x.device)
    if divisor_override:
        divisor: torch.Tensor | int = divisor_override
    elif count_include_pad or not any(p):
        divisor = math.prod(k)
    else:
        divisor = torch.nn.functional.conv3d(torch.ones_like(flat[:1]), box, None, s, p)
    return flat, s, p, box, divisor


def avg_pool3d(call: Call, x: torch.Tensor, kernel_size: Sequence[int], stride: Sequence[int] = (),
               padding: Sequence[int] = (0,), ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: int | None = None) -> torch.Tensor:
    """aten.avg_pool3d: each window's sum, a convolution of x with a box of ones (the device's sum), divided by
    its divisor (one IEEE division)."""
    flat, s, p, box, divisor = _box3d(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                         divisor_override)
    total = call(aten.convolution.default, flat, box, None, s, p, [1, 1, 1], False, [0, 0, 0], 1)
    out = call(aten.div.Tensor, total, divisor)
    return out.reshape(*x.shape[:-3], *out.shape[-3:])


def avg_pool3d_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, kernel_size: Sequence[int],
                        stride: Sequence[int], padding: Sequence[int], ceil_mode: bool, count_include_pad: bool,
                        divisor_override: int | None) -> torch.Tensor:
    """aten.avg_pool3d_backward: each output's gradient divided by its divisor (one IEEE division), then summed
    into the inputs its window covers by the box convolution's input gradient (the device's sum)."""
    flat, s, p, box, divisor = _box3d(x, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                         divisor_override)
    g = call(aten.div.Tensor, grad.reshape(-1, 1, *grad.shape[-3:]), divisor)
    out = call(aten.convolution_backward.default, g, flat, box, None, s, p, [1, 1, 1], False, [0, 0, 0], 1,
               [True, False, False])[0]
    return out.reshape(x.shape)


def _source_index(call: Call, coord: torch.Tensor, size: int, padding: int,
                  align: bool) -> tuple[torch.Tensor, float, torch.Tensor | None]:
    """torch's grid_sampler_compute_source_index for zeros (0) and border (1) padding: the coordinate from [-1, 1]
    to pixels, ((coord + 1) / 2) (size - 1) with `align` (corners), ((coord + 1) size - 1) / 2 without, each
    operation rounded; border padding clamps it into the image (exact). (the index, its derivative's factor, where
    border padding left it unclamped or None)"""
    one = call(aten.add.Tensor, coord, 1)
    if align:
        ix, scale = call(aten.mul.Tensor, call(aten.div.Tensor, one, 2), size - 1), (size - 1) / 2
    else:
        ix, scale = call(aten.div.Tensor, call(aten.sub.Tensor, call(aten.mul.Tensor, one, size), 1), 2), size / 2
    if padding == 0:
        return ix, scale, None
    return ix.clamp(0, size - 1), scale, (ix > 0) & (ix < size - 1)


def _grid_corner(x: torch.Tensor, xs: torch.Tensor, ys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                              torch.Tensor]:
    """x's values at whole pixel coordinates (xs, ys) (N, Ho, Wo), 0 outside the image (exact): (the values (N, C,
    Ho, Wo), whether inside, the flat pixel index clamped into the image)."""
    n, _, h, w = x.shape
    inside = (xs >= 0) & (xs <= w - 1) & (ys >= 0) & (ys <= h - 1)
    xi, yi = xs.clamp(0, w - 1).long(), ys.clamp(0, h - 1).long()
    values = x[torch.arange(n).view(n, 1, 1).expand_as(xi), :, yi, xi].movedim(-1, 1)
    return torch.where(inside.unsqueeze(1), values, 0), inside, yi * w + xi


def _bilinear_weights(call: Call, ix: torch.Tensor, iy: torch.Tensor) -> tuple[list, tuple]:
    """torch's vectorised CPU kernel's bilinear weights: w = ix - floor(ix), e = 1 - w, n = iy - floor(iy),
    s = 1 - n, and nw = s e, ne = s w, sw = n e, se = n w, each operation rounded: ([(xs, ys, weight) of the four
    corners nw, ne, sw, se], (w, e, n, s))."""
    x0, y0 = torch.floor(ix), torch.floor(iy)
    one = torch.ones_like(ix)
    wx = call(aten.sub.Tensor, ix, x0)
    ex = call(aten.sub.Tensor, one, wx)
    ny = call(aten.sub.Tensor, iy, y0)
    sy = call(aten.sub.Tensor, one, ny)
    weights = [call(aten.mul.Tensor, a, b) for a, b in ((sy, ex), (sy, wx), (ny, ex), (ny, wx))]
    return list(zip((x0, x0 + 1, x0, x0 + 1), (y0, y0, y0 + 1, y0 + 1), weights)), (wx, ex, ny, sy)


def _grid_checked(op: Any, interpolation: int, padding: int) -> None:
    if interpolation not in (0, 1) or padding not in (0, 1):
        raise UnsupportedOpError(str(op), f"interpolation mode {interpolation}, padding mode {padding}: the registry "
                                 "has bilinear and nearest sampling with zeros and border padding (vtrain.composites)")


def grid_sampler_2d(call: Call, x: torch.Tensor, grid: torch.Tensor, interpolation: int, padding: int,
                    align: bool) -> torch.Tensor:
    """aten.grid_sampler_2d (`F.grid_sample` on 4-d input), bilinear or nearest, zeros or border padding: each
    grid point's source index (`_source_index`); nearest takes the value at its rounding (half to even, as
    nearbyint), bilinear adds its four corners' values times their weights (`_bilinear_weights`) in torch's order
    nw, ne, sw, se, each product and sum rounded. Corners outside the image give 0."""
    _grid_checked(aten.grid_sampler_2d.default, interpolation, padding)
    ix = _source_index(call, grid[..., 0], x.shape[-1], padding, align)[0]
    iy = _source_index(call, grid[..., 1], x.shape[-2], padding, align)[0]
    if interpolation == 1:
        return _grid_corner(x, torch.round(ix), torch.round(iy))[0]
    out = None
    for xs, ys, weight in _bilinear_weights(call, ix, iy)[0]:
        term = call(aten.mul.Tensor, _grid_corner(x, xs, ys)[0], weight.unsqueeze(1))
        out = term if out is None else call(aten.add.Tensor, out, term)
    return out


def grid_sampler_2d_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, grid: torch.Tensor,
                             interpolation: int, padding: int, align: bool,
                             output_mask: Sequence[bool]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """aten.grid_sampler_2d_backward: the input's gradient adds each output's gradient times each corner's weight
    at that corner, as `scatter_add` (per output the corners nw, ne, sw, se, outputs in order; a corner outside
    the image adds 0); the grid's, torch's vectorised kernel's ((ne - nw) s + (se - sw) n) g and ((sw - nw) e +
    (se - ne) w) g (corner values), summed over channels by the device, times the index's derivative (0 where
    border padding clamped it); nearest sampling's is 0."""
    _grid_checked(aten.grid_sampler_2d_backward.default, interpolation, padding)
    n, c, h, w = x.shape
    ix, scale_x, free_x = _source_index(call, grid[..., 0], w, padding, align)
    iy, scale_y, free_y = _source_index(call, grid[..., 1], h, padding, align)
    if interpolation == 1:
        corners, parts = [(torch.round(ix), torch.round(iy), None)], None
    else:
        corners, parts = _bilinear_weights(call, ix, iy)
    grad_input = grad_grid = None
    sampled = [_grid_corner(x, xs, ys) for xs, ys, _ in corners]
    if output_mask[0]:
        srcs, targets = [], []
        for (_, inside, flat), (_, _, weight) in zip(sampled, corners):
            value = grad if weight is None else call(aten.mul.Tensor, grad, weight.unsqueeze(1))
            srcs.append(torch.where(inside.unsqueeze(1), value, 0))
            targets.append(flat.unsqueeze(1).expand_as(value))
        zeros = torch.zeros(n, c, h * w, dtype=grad.dtype, device=grad.device)
        grad_input = scatter_add(call, zeros, 2, torch.stack(targets, -1).flatten(2),
                                 torch.stack(srcs, -1).flatten(2)).reshape(x.shape)
    if output_mask[1]:
        if parts is None:
            grad_grid = torch.zeros_like(grid)
        else:
            (nw, _, _), (ne, _, _), (sw, _, _), (se, _, _) = sampled
            wx, ex, ny, sy = (t.unsqueeze(1) for t in parts)

            def along(a: torch.Tensor, b: torch.Tensor, fa: torch.Tensor, c_: torch.Tensor, d: torch.Tensor,
                      fb: torch.Tensor, scale: float, free: torch.Tensor | None) -> torch.Tensor:
                # ((a - b) fa + (c_ - d) fb) g summed over channels, times the index's derivative
                term = call(aten.add.Tensor, call(aten.mul.Tensor, call(aten.sub.Tensor, a, b), fa),
                            call(aten.mul.Tensor, call(aten.sub.Tensor, c_, d), fb))
                total = call(aten.sum.dim_IntList, call(aten.mul.Tensor, term, grad), [1])
                total = call(aten.mul.Tensor, total, scale)
                return total if free is None else torch.where(free, total, 0)

            grad_grid = torch.stack([along(ne, nw, sy, se, sw, ny, scale_x, free_x),
                                     along(sw, nw, ex, se, ne, wx, scale_y, free_y)], -1)
    return grad_input, grad_grid


def linspace(call: Call, start: float, end: float, steps: int, *, dtype: torch.dtype | None = None,
             layout: Any = None, device: Any = None, pin_memory: bool | None = None) -> torch.Tensor:
    """aten.linspace (F.affine_grid's base grid): torch's CPU kernel's formula, start + i step for the first half
    and end - (steps - 1 - i) step for the rest, step = (end - start) / (steps - 1) in float64, each product and
    sum rounded (one value: start, rounded); integer dtypes as torch gives them (exact)."""
    dtype = dtype or torch.get_default_dtype()
    if not dtype.is_floating_point or steps < 1:
        return torch.linspace(start, end, steps, dtype=dtype, device=device)
    i = torch.arange(steps, dtype=dtype, device=device)
    if steps == 1:
        return call(aten.add.Tensor, i, float(start))
    step = (float(end) - float(start)) / (steps - 1)
    lower = call(aten.add.Tensor, call(aten.mul.Tensor, i, step), float(start))
    upper = call(aten.sub.Tensor, torch.full_like(i, float(end)), call(aten.mul.Tensor, (steps - 1) - i, step))
    return torch.where(i < steps // 2, lower, upper)


def affine_grid_generator(call: Call, theta: torch.Tensor, size: Sequence[int], align: bool) -> torch.Tensor:
    """aten.affine_grid_generator (`F.affine_grid`, 2-d): torch's base grid, rows (x, y, 1) over the pixels with
    coordinates `linspace(-1, 1, n)` (times (n - 1), over n, without `align`), times theta's transpose, a bmm. Its
    backward pass is torch's decomposition: the same base grid (this module's linspace), a bmm."""
    if len(size) != 4:
        raise UnsupportedOpError(str(aten.affine_grid_generator.default), f"size {list(size)}: the registry has 2-d "
                                 "grids (a 4-d size) only (vtrain.composites)")
    n, _, h, w = size

    def coords(count: int) -> torch.Tensor:
        if count <= 1:
            return torch.zeros(count, dtype=theta.dtype, device=theta.device)
        line = call(aten.linspace.default, -1, 1, count, dtype=theta.dtype, device=theta.device)
        return line if align else call(aten.div.Tensor, call(aten.mul.Tensor, line, count - 1), count)

    base = torch.stack([coords(w).expand(h, w), coords(h).unsqueeze(1).expand(h, w),
                        torch.ones(h, w, dtype=theta.dtype, device=theta.device)], -1)
    grid = call(aten.bmm.default, base.reshape(1, h * w, 3).expand(n, h * w, 3), theta.transpose(1, 2))
    return grid.reshape(n, h, w, 2)


def _occurrences(keys: torch.Tensor) -> torch.Tensor:
    """Each key's rank among the equal keys before it in flat order (0 for a first occurrence): integer work,
    exact on any device, done natively."""
    flat = keys.reshape(-1)
    order = torch.argsort(flat, stable=True)
    ordered = flat[order]
    first = torch.ones_like(ordered, dtype=torch.bool)
    first[1:] = ordered[1:] != ordered[:-1]
    starts = torch.nonzero(first).squeeze(1)
    group = torch.cumsum(first.long(), 0) - 1  # (each sorted key's group)
    ranks = torch.empty_like(flat)
    ranks[order] = torch.arange(flat.numel()) - starts[group]
    return ranks.reshape(keys.shape)


def _scattered(x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> tuple:
    """(src's values over index's shape, flat; each one's position in x, one row of coordinates per dim, and flat;
    each one's rank among the values before it in flat order at its position) for the scatters along dim."""
    dim %= max(x.dim(), 1)
    src = src[tuple(slice(0, n) for n in index.shape)]  # (torch reads src over index's shape)
    coords = list(torch.meshgrid(*(torch.arange(n) for n in index.shape), indexing="ij"))
    coords[dim] = index
    target = torch.stack(coords).reshape(len(coords), -1)
    flat = sum(c * math.prod(x.shape[d + 1:]) for d, c in enumerate(target))
    return src.reshape(-1), target, flat, _occurrences(flat)


def scatter_add(call: Call, x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """aten.scatter_add (the backward pass of `gather`): x plus each src value at its index along dim, one IEEE
    addition per value, a position's values added in src's flat order (torch's CPU kernel's; a GPU's atomics
    take them in any order). Pass r adds every position's r-th value, all at distinct positions (index_put with
    accumulate, class 2), so a position that n values reach is rounded after each of its n additions."""
    values, target, _, ranks = _scattered(x, dim, index, src)
    out = x
    for r in range(int(ranks.max()) + 1 if ranks.numel() else 0):
        pick = ranks == r
        out = call(aten.index_put.default, out, list(target[:, pick]), values[pick], True)
    return out


_SCATTER_REDUCTIONS = {"sum": aten.add.Tensor, "mean": aten.add.Tensor, "prod": aten.mul.Tensor,
                       "amax": aten.maximum.default, "amin": aten.minimum.default}


def scatter_reduce(call: Call, x: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str, *,
                   include_self: bool = True) -> torch.Tensor:
    """aten.scatter_reduce.two: each src value combined into x at its index along dim, a position's values in src's
    flat order as `scatter_add` takes them (torch's CPU kernel's), each combination one IEEE operation (sum, prod)
    or an exact selection (amax, amin); mean is the sum divided by the count of values (x's own among them). Without
    include_self a position that values reach starts from its first value (torch's kernels combine it with the
    reduction's identity: the same value, but that a first -0 summed stays -0 here)."""
    if reduce not in _SCATTER_REDUCTIONS:
        raise UnsupportedOpError(str(aten.scatter_reduce.two), f"reduce={reduce!r} (torch knows sum, prod, mean, "
                                 "amax and amin)")
    values, target, flat, ranks = _scattered(x, dim, index, src)
    out = x
    for r in range(int(ranks.max()) + 1 if ranks.numel() else 0):
        at, here = list(target[:, ranks == r]), values[ranks == r]
        if r or include_self:
            here = call(_SCATTER_REDUCTIONS[reduce], call(aten.index.Tensor, out, at), here)
        out = call(aten.index_put.default, out, at, here)
    if reduce != "mean":
        return out
    counts = torch.bincount(flat, minlength=x.numel()).to(x.dtype)  # (whole numbers: exact)
    counts = (counts + include_self).clamp_min_(1).reshape(x.shape)
    return call(aten.div.Tensor, out, counts)


def scatter_reduce_(call: Call, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return call(aten.copy_.default, x, scatter_reduce(call, x, *args, **kwargs))


def index_add(call: Call, x: torch.Tensor, dim: int, index: torch.Tensor, source: torch.Tensor, *,
              alpha: float = 1) -> torch.Tensor:
    """aten.index_add (the backward pass of `index_select`): `scatter_add` of alpha source (one IEEE
    multiplication first, where alpha is not 1), index repeated over source's other dims."""
    dim %= max(x.dim(), 1)
    shape = [1] * source.dim()
    shape[dim] = -1
    return scatter_add(call, x, dim, index.reshape(shape).expand_as(source), _times(call, source, alpha))


def _flat_index(indices: Sequence[torch.Tensor], sizes: Sequence[int]) -> torch.Tensor:
    """The row-major flat index into dims of `sizes` of every combination of `indices` (one index vector a dim),
    in row-major order of the combinations."""
    flat = torch.zeros((), dtype=torch.long)
    for index, size in zip(indices, sizes):
        flat = flat.unsqueeze(-1) * size + index
    return flat.reshape(-1)


def _add_into(call: Call, shape: Sequence[int], dims: int, index: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """Zeros of `shape`, its last `dims` dims flattened, plus each of src's values (the leading dims, then a value
    for each of `index`'s positions) at its index, in src's order (`index_add`), reshaped back: the scatter
    additions of the backward passes of padding and interpolation, and of fold."""
    lead = list(shape[:-dims])
    zeros = torch.zeros([*lead, math.prod(shape[-dims:])], dtype=src.dtype)
    return index_add(call, zeros, len(lead), index, src.reshape(*lead, -1)).reshape(shape)


Taps = tuple[list[torch.Tensor], list[torch.Tensor]]  # along one dim: each output's source indices, their weights


def _source(size: int, out_size: int, align_corners: bool, scale: float | None, cubic: bool) -> torch.Tensor:
    """Each output's real source position along one dim, as torch's CPU kernels compute it
    (area_pixel_compute_source_index: a linear one clamped at 0, a cubic one not), in float64."""
    dst = torch.arange(out_size, dtype=torch.float64)
    if align_corners:
        return ((size - 1) / (out_size - 1) if out_size > 1 else 0.0) * dst
    ratio = 1.0 / scale if scale is not None and scale > 0 else size / out_size
    real = ratio * (dst + 0.5) - 0.5
    return real if cubic else real.clamp_min(0.0)


def _linear_taps(size: int, out_size: int, align_corners: bool, scale: float | None) -> Taps:
    """The two taps of each output along one dim of a linear interpolation and their weights, as torch's CPU kernel
    places them: integer taps, float64 weights from the sizes and scale alone, the same on every device."""
    real = _source(size, out_size, align_corners, scale, False)
    first = real.floor().long().clamp_max(size - 1)
    second = torch.where(first < size - 1, first + 1, first)
    w1 = (real - first).clamp(0.0, 1.0)
    return [first, second], [1 - w1, w1]


_CUBIC_A = -0.75  # (torch's, and OpenCV's, cubic convolution constant)


def _cubic_taps(size: int, out_size: int, align_corners: bool, scale: float | None) -> Taps:
    """The four taps of each output along one dim of a bicubic interpolation (the source's floor - 1 to floor + 2,
    clamped to the edges) and their cubic convolution weights at t (the source's distance past its floor, within
    [0, 1]), as torch's CPU kernels place them (guard_index_and_lambda, get_cubic_upsample_coefficients), in
    float64."""
    real = _source(size, out_size, align_corners, scale, True)
    floor = real.floor().long().clamp_max(size - 1)
    t = (real - floor).clamp(0.0, 1.0)
    a = _CUBIC_A

    def near(x: torch.Tensor) -> torch.Tensor:  # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: torch.Tensor) -> torch.Tensor:  # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    taps = [(floor + k).clamp(0, size - 1) for k in (-1, 0, 1, 2)]
    return taps, [far(t + 1), near(t), near(1 - t), far(2 - t)]


def _all_taps(taps: Callable[..., Taps], sizes: Sequence[int], output_size: Sequence[int], align_corners: bool,
              scales: tuple[float | None, ...]) -> list[Taps]:
    """`taps` (`_linear_taps` or `_cubic_taps`) of each interpolated dim (`scales` may stop short: None for the
    rest)."""
    scales = scales + (None,) * (len(output_size) - len(scales))
    return [taps(n, o, align_corners, s) for n, o, s in zip(sizes, output_size, scales)]


def _interpolate(call: Call, x: torch.Tensor, taps: list[Taps], dim: int) -> torch.Tensor:
    """Interpolation along x's dims from `dim` on (one `Taps` each), the first of them outermost: w0 f(x at tap 0)
    + w1 f(x at tap 1) + ..., added in tap order, f the same over the remaining dims, as torch's kernels nest it
    (bilinear: h0 (w0 x00 + w1 x01) + h1 (w0 x10 + w1 x11)), each operation rounded."""
    if not taps:
        return x
    (indices, weights), rest = taps[0], taps[1:]
    shape = [-1] + [1] * len(rest)  # (a weight per position along dim, broadcast over the dims after it)
    parts = [_interpolate(call, x.index_select(dim, i), rest, dim + 1) for i in indices]  # (gathers)
    out = None
    for part, w in zip(parts, weights):
        term = call(aten.mul.Tensor, part, w.to(x.dtype).reshape(shape))
        out = term if out is None else call(aten.add.Tensor, out, term)
    return out


def _upsample(kind: Callable[..., Taps]) -> Callable[..., torch.Tensor]:
    def upsample(call: Call, x: torch.Tensor, output_size: Sequence[int], align_corners: bool,
                 *scales: float | None) -> torch.Tensor:
        """aten.upsample_linear1d, upsample_bilinear2d, upsample_trilinear3d and upsample_bicubic2d
        (`F.interpolate(mode="linear" / "bilinear" / "trilinear" / "bicubic")`, any sizes or scales, corners
        aligned or not): torch's formula one IEEE operation at a time (torch's kernels keep the partial sums
        unrounded), with torch's taps and weights (`_linear_taps`, `_cubic_taps`; the weights held in the work
        dtype)."""
        dims = len(output_size)
        return _interpolate(call, x, _all_taps(kind, x.shape[-dims:], output_size, align_corners, scales),
                            x.dim() - dims)

    return upsample


def _upsample_backward(kind: Callable[..., Taps]) -> Callable[..., torch.Tensor]:
    def upsample_backward(call: Call, grad: torch.Tensor, output_size: Sequence[int], input_size: Sequence[int],
                          align_corners: bool, *scales: float | None) -> torch.Tensor:
        """The backward passes of `_upsample`: each output's gradient times each of its taps' weights (the product
        of the per-dim weights, outer dim first, in float64, held in the work dtype: one IEEE multiplication
        each), added into the input's gradient from 0 output by output, the taps in torch's order (the outer dim's
        first tap first: 00, 01, 10, 11 in bilinear 2-d), one IEEE addition apiece (`index_add`)."""
        dims = len(output_size)
        spatial = input_size[-dims:]
        taps = _all_taps(kind, spatial, output_size, align_corners, scales)
        parts, index = [], []
        for pick in itertools.product(range(len(taps[0][0])), repeat=dims):
            weight = torch.ones((), dtype=torch.float64)
            for (_, weights), k in zip(taps, pick):  # (outer products over the dims, outer dim first)
                weight = weight.unsqueeze(-1) * weights[k]
            parts.append(call(aten.mul.Tensor, grad, weight.to(grad.dtype)))
            index.append(_flat_index([indices[k] for (indices, _), k in zip(taps, pick)], spatial))
        # (output-major, an output's taps together)
        return _add_into(call, input_size, dims, torch.stack(index, -1).reshape(-1), torch.stack(parts, -1))

    return upsample_backward


def col2im(call: Call, cols: torch.Tensor, output_size: Sequence[int], kernel_size: Sequence[int],
           dilation: Sequence[int], padding: Sequence[int], stride: Sequence[int]) -> torch.Tensor:
    """aten.col2im (`F.fold`, and `F.unfold`'s backward pass): each column value added into the image position
    its window tap covers, from 0, in the columns' flat order (torch's CPU loop's), one IEEE addition apiece
    (`index_add`); the taps that fall on the padding are dropped. (im2col, the gather, is exact: class 1.)"""
    # torch's own checks of the arguments first, on a meta tensor (shapes only: its errors, no values)
    aten.col2im.default(torch.empty_like(cols, device="meta"), output_size, kernel_size, dilation, padding, stride)
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = kernel_size, dilation, padding, stride
    height, width = output_size
    rows = (height + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wide = (width + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    batched = cols.dim() == 3
    cols = cols if batched else cols.unsqueeze(0)
    channels = cols.shape[1] // (kh * kw)
    c, i, j, y, x = torch.meshgrid(torch.arange(channels), torch.arange(kh), torch.arange(kw), torch.arange(rows),
                                   torch.arange(wide), indexing="ij")
    y, x = y * sh - ph + i * dh, x * sw - pw + j * dw
    inside = ((y >= 0) & (y < height) & (x >= 0) & (x < width)).reshape(-1)
    index = ((c * height + y) * width + x).reshape(-1)[inside]
    src = cols.reshape(cols.shape[0], -1)[:, inside]
    out = _add_into(call, (cols.shape[0], channels, height, width), 3, index, src)
    return out if batched else out.squeeze(0)


def glu(call: Call, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """aten.glu: a sigmoid(b), a and b x's halves along dim."""
    a, b = x.chunk(2, dim)
    return call(aten.mul.Tensor, a, call(aten.sigmoid.default, b))


def glu_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, dim: int) -> torch.Tensor:
    """aten.glu_backward: (g s, ((g a) s) (1 - s)) along dim, s = sigmoid(b)."""
    a, b = x.chunk(2, dim)
    s = call(aten.sigmoid.default, b)
    grad_b = call(aten.mul.Tensor, call(aten.mul.Tensor, call(aten.mul.Tensor, grad, a), s),
                  call(aten.rsub.Scalar, s, 1))
    return torch.cat([call(aten.mul.Tensor, grad, s), grad_b], dim)


def _in_dtype(call: Call, x: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """x converted to a reduction's `dtype` argument first (a rounded copy), where one is given."""
    return x if dtype is None or dtype == x.dtype else call(aten._to_copy.default, x, dtype=dtype)


def _partials(call: Call, combine: Any, x: torch.Tensor, dim: int) -> list[torch.Tensor]:
    """y_0 = x_0, y_i = y_(i-1) combine x_i along dim (of one value at least), each partial result rounded: the
    recurrence of cumsum, cumprod and prod."""
    partial = [x.select(dim, 0)]
    for i in range(1, x.shape[dim]):
        partial.append(call(combine, partial[-1], x.select(dim, i)))
    return partial


def _prod(call: Call, x: torch.Tensor, dim: int, keepdim: bool, dtype: torch.dtype | None) -> torch.Tensor:
    x = _in_dtype(call, x, dtype)
    if not x.is_floating_point() or x.dim() == 0:
        return aten.prod.dim_int(x, dim, keepdim) if x.dim() else x.clone()
    dim %= x.dim()
    # (the product of no values is 1, exact; of one, a copy of it)
    out = _partials(call, aten.mul.Tensor, x, dim)[-1].clone() if x.shape[dim] else \
        x.new_ones(x.shape[:dim] + x.shape[dim + 1:])
    return out.unsqueeze(dim) if keepdim else out


def prod(call: Call, x: torch.Tensor, dim: int | None = None, keepdim: bool = False, *,
         dtype: torch.dtype | None = None) -> torch.Tensor:
    """aten.prod (over every value, or one dim): integers as torch multiplies them; floating values
    x_0 x_1 ... in order, each partial product rounded (`_partials`, the last)."""
    if dim is None:
        return _prod(call, x.reshape(-1), 0, False, dtype)
    return _prod(call, x, dim, keepdim, dtype)


def soft_margin_loss(call: Call, x: torch.Tensor, target: torch.Tensor, reduction: int = 1) -> torch.Tensor:
    """aten.soft_margin_loss: log1p(exp(-(x t))), reduced (torch's formula)."""
    z = call(aten.exp.default, call(aten.neg.default, call(aten.mul.Tensor, x, target)))
    return _reduce(call, call(aten.log1p.default, z), reduction)


def soft_margin_loss_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor,
                              reduction: int) -> torch.Tensor:
    """aten.soft_margin_loss_backward: (-t z / (1 + z)) grad, z = exp(-(x t)), over the count under a mean
    (torch's formula)."""
    z = call(aten.exp.default, call(aten.neg.default, call(aten.mul.Tensor, x, target)))
    g = call(aten.div.Tensor, call(aten.mul.Tensor, call(aten.neg.default, target), z), call(aten.add.Tensor, z, 1))
    return _scaled_grad(call, g, grad, reduction)


def _pixels_as_rows(x: torch.Tensor) -> torch.Tensor:
    """(N, C, d1, ...) as (N d1 ..., C): each pixel's class scores a row."""
    return x.movedim(1, -1).reshape(-1, x.shape[1])


def nll_loss2d(call: Call, x: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, reduction: int,
               ignore_index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """aten.nll_loss2d_forward (cross-entropy over an image's pixels, `F.cross_entropy` on (N, C, H, W)): the
    registry's nll_loss over every pixel as a row, in row-major pixel order; an unreduced loss in the target's
    shape."""
    loss, total = call(aten.nll_loss_forward.default, _pixels_as_rows(x), target.reshape(-1), weight, reduction,
                       ignore_index)
    return (loss.reshape(target.shape) if reduction == 0 else loss), total


def nll_loss2d_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor,
                        weight: torch.Tensor | None, reduction: int, ignore_index: int,
                        total: torch.Tensor) -> torch.Tensor:
    """aten.nll_loss2d_backward: the registry's nll_loss_backward over the pixels as rows, moved back."""
    rows = call(aten.nll_loss_backward.default, grad.reshape(-1) if reduction == 0 else grad, _pixels_as_rows(x),
                target.reshape(-1), weight, reduction, ignore_index, total)
    return rows.reshape(x.shape[0], *x.shape[2:], x.shape[1]).movedim(-1, 1).contiguous()


_BAG_SUM, _BAG_MEAN, _BAG_MAX = 0, 1, 2


def _plain_bags(op: Any, scale_grad_by_freq: bool, sparse: bool) -> None:
    if scale_grad_by_freq or sparse:
        raise UnsupportedOpError(str(op), "scale_grad_by_freq and sparse gradients are not in the registry "
                                 "(vtrain.composites): train with both off")


def _bag_rows(call: Call, table: torch.Tensor, rows: torch.Tensor, indices: torch.Tensor, padding_idx: int,
              per_sample_weights: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(which of the bags' indices count (not padding_idx), table's `rows` at those, times their per-sample
    weights: one IEEE multiplication each)."""
    keep = indices != padding_idx if padding_idx >= 0 else torch.ones_like(indices, dtype=torch.bool)
    picked = table.index_select(0, rows[keep])
    if per_sample_weights is not None:
        picked = call(aten.mul.Tensor, picked, per_sample_weights[keep].unsqueeze(1))
    return keep, picked


def _over_bag_sizes(call: Call, t: torch.Tensor, bag_size: torch.Tensor) -> torch.Tensor:
    """t's rows divided by their bags' sizes (an empty bag's by 1): a mean bag's."""
    return call(aten.div.Tensor, t, bag_size.clamp_min(1).unsqueeze(1).to(t.dtype))


def embedding_bag(op: Any, call: Call, weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                  scale_grad_by_freq: bool = False, mode: int = 0, sparse: bool = False,
                  per_sample_weights: torch.Tensor | None = None, include_last_offset: bool = False,
                  padding_idx: int = -1) -> tuple:
    """aten._embedding_bag (`nn.EmbeddingBag`; `_embedding_bag_forward_only` without gradients): the bags' rows of
    weight (a gather), times their per-sample weights (one IEEE multiplication each), added into each bag's sum from
    0 in the indices' order, one IEEE addition apiece (`index_add`; padding_idx's rows left out), a mean's sum
    divided by the bag's size; a max is a selection, torch's own (exact). The bookkeeping outputs (each index's bag,
    the bags' sizes, the max's indices) are torch's, integers."""
    _plain_bags(op, scale_grad_by_freq, sparse)
    native = op(weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights, include_last_offset,
                padding_idx)
    if mode == _BAG_MAX:
        return native
    out, bag_of, bag_size, max_indices = native
    keep, rows = _bag_rows(call, weight, indices, indices, padding_idx, per_sample_weights)
    sums = index_add(call, torch.zeros_like(out), 0, bag_of[keep], rows)
    return (_over_bag_sizes(call, sums, bag_size) if mode == _BAG_MEAN else sums), bag_of, bag_size, max_indices


def embedding_bag_backward(call: Call, grad: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                           bag_of: torch.Tensor, bag_size: torch.Tensor, max_indices: torch.Tensor,
                           num_weights: int, scale_grad_by_freq: bool, mode: int, sparse: bool,
                           per_sample_weights: torch.Tensor | None, padding_idx: int = -1) -> torch.Tensor:
    """aten._embedding_bag_backward: each index's bag's gradient (over the bag's size for a mean, times its
    per-sample weight), added into its weight row from 0 in the indices' order (`index_add`; padding_idx's left
    out); a max's gradient goes to the row each value came from (`scatter_add`, bag after bag)."""
    _plain_bags(aten._embedding_bag_backward.default, scale_grad_by_freq, sparse)
    zeros = torch.zeros(num_weights, grad.shape[1], dtype=grad.dtype)
    if mode == _BAG_MAX:
        filled = bag_size > 0  # (an empty bag's max indices are -1: no row)
        return scatter_add(call, zeros, 0, max_indices[filled], grad[filled])
    if mode == _BAG_MEAN:
        grad = _over_bag_sizes(call, grad, bag_size)
    keep, rows = _bag_rows(call, grad, bag_of, indices, padding_idx, per_sample_weights)
    return index_add(call, zeros, 0, indices[keep], rows)


def embedding_bag_per_sample_weights_backward(call: Call, grad: torch.Tensor, weight: torch.Tensor,
                                               indices: torch.Tensor, offsets: torch.Tensor, bag_of: torch.Tensor,
                                               mode: int, padding_idx: int = -1) -> torch.Tensor:
    """aten._embedding_bag_per_sample_weights_backward (per-sample weights that require a gradient: sum bags, as
    torch allows): each index's gradient, its bag's gradient times its weight row (a rounded product a value)
    summed over the row (the device's sum), 0 at padding_idx."""
    products = call(aten.mul.Tensor, grad.index_select(0, bag_of), weight.index_select(0, indices))
    sums = call(aten.sum.dim_IntList, products, [1])
    return torch.where(indices != padding_idx, sums, torch.zeros((), dtype=sums.dtype))


def _pad_sources(size: int, before: int, after: int, reflect: bool) -> torch.Tensor:
    """The input index each of a padded dim's size + before + after outputs reads: mirrored about the edge
    (reflection) or the edge repeated (replication)."""
    j = torch.arange(-before, size + after)
    if reflect:
        return torch.where(j < 0, -j, torch.where(j >= size, 2 * (size - 1) - j, j))
    return j.clamp(0, size - 1)


def _pad_backward(reflect: bool, call: Call, grad: torch.Tensor, x: torch.Tensor,
                  padding: Sequence[int]) -> torch.Tensor:
    """aten.reflection_pad{1,2,3}d_backward and aten.replication_pad{1,2,3}d_backward: each input value's gradient
    is the sum of the gradients of the outputs that read it, 0 plus each in the output's row-major order, one IEEE
    addition apiece (`index_add` over the flattened spatial dims: an interior value takes its one gradient
    exactly, an edge's the few its mirror images or copies add). Torch's kernels add the same values in an order
    of their own, unrounded."""
    dims = len(padding) // 2
    spatial = x.shape[-dims:]
    # padding lists the last dim first: (before, after) of dim -1, then of dim -2, ...
    sources = [_pad_sources(n, padding[2 * (dims - 1 - d)], padding[2 * (dims - 1 - d) + 1], reflect)
               for d, n in enumerate(spatial)]
    return _add_into(call, x.shape, dims, _flat_index(sources, spatial), grad)


def _cumulative(op: Any, combine: Any, call: Call, x: torch.Tensor, dim: int, *,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """aten.cumsum and aten.cumprod: integers and booleans as torch computes them (exact, a position id from a
    mask); floating values by one IEEE operation per value along dim, in order, each partial result rounded:
    y_0 = x_0, y_i = y_(i-1) op x_i. (Torch's CPU kernel runs the same recurrence unrounded; a GPU's parallel scan
    combines in another order.) Autograd's backward passes run through here too: cumsum's is a flipped cumsum."""
    x = _in_dtype(call, x, dtype)
    if not x.is_floating_point() or x.numel() == 0 or x.dim() == 0:  # (no value to round, or one)
        return op(x, dim)
    dim %= x.dim()
    return torch.stack(_partials(call, combine, x, dim), dim)


def _margins(call: Call, x: torch.Tensor, target: torch.Tensor,
             margin: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x as (N, C), the hinge terms' z = (margin - x_target) + x_c, whether a term counts: z > 0 off the target's
    column) of a multi-class margin loss, torch's kernel's operations in its order, each rounded."""
    x2, t = x.reshape(-1, x.shape[-1]), target.reshape(-1, 1)
    z = call(aten.add.Tensor, call(aten.rsub.Scalar, x2.gather(1, t), margin), x2)
    return x2, z, (z > 0) & (torch.arange(x2.shape[1]) != t)


def _hinge_unit(x2: torch.Tensor, reduction: int) -> float:
    """g of the margin losses' gradients (torch's): 1 / C, or 1 / (N C) under a mean."""
    return 1.0 / (x2.shape[1] * (x2.shape[0] if reduction == 1 else 1))


def _times_loss_grad(call: Call, rows: torch.Tensor, grad: torch.Tensor, reduction: int,
                     shape: Sequence[int]) -> torch.Tensor:
    """A margin loss's (N, C) gradient rows times the loss's gradient (a sample's own when unreduced), in x's
    shape."""
    return call(aten.mul.Tensor, rows, grad.reshape(-1, 1) if reduction == 0 else grad).reshape(shape)


def multi_margin_loss(call: Call, x: torch.Tensor, target: torch.Tensor, p: int = 1, margin: float = 1,
                      weight: torch.Tensor | None = None, reduction: int = 1) -> torch.Tensor:
    """aten.multi_margin_loss (`nn.MultiMarginLoss`): per sample, the sum over the other classes of max(0, z)^p
    (times the target class's weight) over the class count, then reduced (`_margins`; the sum the device's)."""
    x2, z, counts = _margins(call, x, target, margin)
    h = torch.where(counts, z, torch.zeros((), dtype=z.dtype))
    if p == 2:
        h = call(aten.mul.Tensor, h, h)
    if weight is not None:
        h = call(aten.mul.Tensor, h, weight[target.reshape(-1)].unsqueeze(1))
    per = call(aten.div.Scalar, call(aten.sum.dim_IntList, h, [1]), x2.shape[1])
    return _reduce(call, per.reshape(target.shape), reduction)


def multi_margin_loss_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor, p: int,
                               margin: float, weight: torch.Tensor | None = None, reduction: int = 1) -> torch.Tensor:
    """aten.multi_margin_loss_backward: torch's formula, g = 1 / C (1 / (N C) under a mean), a counted term's
    gradient g (p = 1) or (2 g) z (p = 2), times the target class's weight; the target's column minus their sum (the
    device's); all times the loss's gradient."""
    x2, z, counts = _margins(call, x, target, margin)
    g = _hinge_unit(x2, reduction)
    h = call(aten.mul.Tensor, counts.to(z.dtype), g) if p == 1 else \
        torch.where(counts, call(aten.mul.Tensor, z, 2 * g), torch.zeros((), dtype=z.dtype))
    if weight is not None:
        h = call(aten.mul.Tensor, h, weight[target.reshape(-1)].unsqueeze(1))
    total = call(aten.sum.dim_IntList, h, [1], True)
    out = torch.where(torch.arange(x2.shape[1]) == target.reshape(-1, 1), -total, h)
    return _times_loss_grad(call, out, grad, reduction, x.shape)


def _label_margins(call: Call, x: torch.Tensor,
                   target: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(x as (N, C), the targets (N, C) with C for the unlisted ones (after the first -1), is_target (N, C) 0/1,
    z = (1 - x_(target j)) + x_d (N, C, C) in torch's kernel's operations, each rounded, and whether a (j, d) term
    counts: j a listed target, d not one, z > 0) of a multi-label margin loss."""
    c = x.shape[-1]
    x2, t2 = x.reshape(-1, c), target.reshape(-1, c)
    listed = (t2 >= 0).cumprod(1).bool()
    picked = torch.where(listed, t2, c)  # (c: a column past the end for the unlisted)
    is_target = torch.zeros(x2.shape[0], c + 1, dtype=x.dtype).scatter_(1, picked, 1.0)[:, :c]
    xt = x2.gather(1, picked.clamp_max(c - 1))
    z = call(aten.add.Tensor, call(aten.rsub.Scalar, xt.unsqueeze(2), 1), x2.unsqueeze(1))
    return x2, picked, is_target, z, listed.unsqueeze(2) & (is_target == 0).unsqueeze(1) & (z > 0)


def multilabel_margin_loss(call: Call, x: torch.Tensor, target: torch.Tensor,
                           reduction: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """aten.multilabel_margin_loss_forward (`nn.MultiLabelMarginLoss`): per sample, the sum over its listed targets
    j and the non-target classes d of max(0, z) (`_label_margins`; the device's sum), over the class count, reduced;
    and is_target, as torch returns it."""
    x2, _, is_target, z, counts = _label_margins(call, x, target)
    h = torch.where(counts, z, torch.zeros((), dtype=z.dtype))
    per = call(aten.div.Scalar, call(aten.sum.dim_IntList, h, [1, 2]), x2.shape[1])
    return _reduce(call, per.reshape(x.shape[:-1]), reduction), is_target.reshape(x.shape)


def multilabel_margin_loss_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, target: torch.Tensor,
                                    reduction: int, is_target: torch.Tensor) -> torch.Tensor:
    """aten.multilabel_margin_loss_backward: g = 1 / C (1 / (N C) under a mean) times, for a class, how many counted
    terms it gains (as d) less how many it loses (as a target): integer counts, exact, then one rounded product
    each; all times the loss's gradient."""
    x2, picked, _, _, counts = _label_margins(call, x, target)
    c = x2.shape[1]
    lost = torch.zeros(x2.shape[0], c + 1, dtype=torch.long).scatter_add_(1, picked, counts.sum(2))[:, :c]
    net = call(aten.mul.Tensor, (counts.sum(1) - lost).to(x.dtype), _hinge_unit(x2, reduction))
    return _times_loss_grad(call, net, grad, reduction, x.shape)


def _differences(call: Call, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """x1's rows minus x2's, every pair: (..., P, M) and (..., R, M) -> (..., P, R, M), one rounded subtraction
    each."""
    return call(aten.sub.Tensor, x1.unsqueeze(-2), x2.unsqueeze(-3))


def cdist_forward(call: Call, x1: torch.Tensor, x2: torch.Tensor, p: float,
                  compute_mode: int | None = None) -> torch.Tensor:
    """aten._cdist_forward (`torch.cdist`): the p-norm of each pair's difference (`_differences`): sqrt(sum d^2)
    for p = 2, sum |d| for 1, max |d| for inf, the count of d != 0 for 0, else (sum |d|^p)^(1/p); each operation
    rounded, the sums the device's. One formula whatever `compute_mode` asks: torch's matrix product form for
    p = 2 (|x1|^2 + |x2|^2 - 2 x1 x2) cancels where rows lie close, the differences do not."""
    return _p_norms(call, _differences(call, x1, x2), p)


def _p_norms(call: Call, d: torch.Tensor, p: float) -> torch.Tensor:
    """`cdist_forward`'s p-norm of differences d along their last dim."""
    if p == 0:
        return call(aten.sum.dim_IntList, (d != 0).to(d.dtype), [-1])  # (a count: exact)
    if p == math.inf:
        return d.abs().amax(-1)
    if p == 1:
        return call(aten.sum.dim_IntList, d.abs(), [-1])
    if p == 2:
        return call(aten.sqrt.default, call(aten.sum.dim_IntList, call(aten.mul.Tensor, d, d), [-1]))
    powered = call(aten.sum.dim_IntList, call(aten.pow.Tensor_Scalar, d.abs(), p), [-1])
    return call(aten.pow.Tensor_Scalar, powered, 1 / p)


def cdist_backward(call: Call, grad: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, p: float,
                   dist: torch.Tensor) -> torch.Tensor:
    """aten._cdist_backward: x1's gradient, torch's formula summed over x2's rows (the device's sum): each
    pair's grad times sign(d) |d|^(p-1) / dist^(p-1) (for p = 2, d / dist; for 1, sign(d); for inf, sign(d)
    where |d| is the distance), 0 where the distance is 0, and for p = 0 nothing."""
    d = _differences(call, x1, x2)
    if p == 0:
        return torch.zeros_like(x1)
    g = grad.unsqueeze(-1)
    if p == 1:
        terms = call(aten.mul.Tensor, g, d.sign())
    elif p == math.inf:
        terms = call(aten.mul.Tensor, g, torch.where(d.abs() == dist.unsqueeze(-1), d.sign(), torch.zeros_like(d)))
    else:
        zero = dist == 0
        safe = torch.where(zero, torch.ones_like(dist), dist)  # (no 0 / 0 on the way: those pairs give 0)
        if p == 2:
            ratio = call(aten.div.Tensor, d, safe.unsqueeze(-1))
        else:
            ratio = call(aten.div.Tensor, call(aten.mul.Tensor, d.sign(), call(aten.pow.Tensor_Scalar, d.abs(), p - 1)),
                         call(aten.pow.Tensor_Scalar, safe, p - 1).unsqueeze(-1))
        terms = call(aten.mul.Tensor, g, torch.where(zero.unsqueeze(-1), torch.zeros_like(ratio), ratio))
    return call(aten.sum.dim_IntList, terms, [-2])


def pdist_forward(call: Call, x: torch.Tensor, p: float = 2) -> torch.Tensor:
    """aten._pdist_forward (`F.pdist`): the p-norm (`_p_norms`) of x[i] - x[j] for each pair i < j, in row-major
    order, one rounded subtraction each."""
    i, j = torch.triu_indices(len(x), len(x), 1)
    return _p_norms(call, call(aten.sub.Tensor, x[i], x[j]), p)


def pdist_backward(call: Call, grad: torch.Tensor, x: torch.Tensor, p: float, pdist: torch.Tensor) -> torch.Tensor:
    """aten._pdist_backward: `cdist_backward` of x against itself, with each pair's gradient and distance at
    (i, j) and (j, i): row i's gradient sums every pair it is in (the difference x_i - x_j's, which a pair (j, i)
    gives with its sign turned), zeros elsewhere (the diagonal's distance 0 gives nothing)."""
    i, j = torch.triu_indices(len(x), len(x), 1)
    g, dist = (torch.zeros(len(x), len(x), dtype=x.dtype, device=x.device) for _ in range(2))
    g[i, j], g[j, i], dist[i, j], dist[j, i] = grad, grad, pdist, pdist  # (copies of grid values: exact)
    return cdist_backward(call, g, x, x, p, dist)


# aten op -> its sequence (the aten schema's arguments after `call`)
COMPOSITES: dict[Any, Callable[..., Any]] = {
    aten.native_layer_norm.default: layer_norm,
    aten.native_layer_norm_backward.default: layer_norm_backward,
    aten.native_batch_norm.default: batch_norm,
    aten.native_batch_norm_backward.default: batch_norm_backward,
    aten.native_group_norm.default: group_norm,
    aten.native_group_norm_backward.default: group_norm_backward,
    aten.linalg_vector_norm.default: vector_norm,
    aten.var.correction: var,
    aten.std.correction: std,
    aten.var_mean.correction: var_mean,
    aten.std_mean.correction: std_mean,
    aten.silu.default: silu,
    aten.silu_backward.default: silu_backward,
    aten.leaky_relu.default: leaky_relu,
    aten.leaky_relu_backward.default: leaky_relu_backward,
    aten.rrelu_with_noise_backward.default: rrelu_with_noise_backward,
    aten.max_unpool2d.default: max_unpool2d,
    aten._safe_softmax.default: safe_softmax,
    aten._scaled_dot_product_flash_attention_for_cpu.default: flash_attention,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: flash_attention_backward,
    aten.mse_loss.default: mse_loss,
    aten.mse_loss_backward.default: mse_loss_backward,
    aten.huber_loss.default: huber_loss,
    aten.huber_loss_backward.default: huber_loss_backward,
    aten.smooth_l1_loss.default: smooth_l1_loss,
    aten.smooth_l1_loss_backward.default: smooth_l1_loss_backward,
    aten.binary_cross_entropy_with_logits.default: bce_with_logits,
    aten.softplus.default: softplus,
    aten.softplus_backward.default: softplus_backward,
    aten.elu.default: elu,
    aten.elu_.default: elu_,
    aten.celu.default: celu,
    aten.celu_.default: celu_,
    aten.elu_backward.default: elu_backward,
    aten.upsample_nearest1d_backward.default: functools.partial(_upsample_nearest_backward,
                                                                aten.upsample_nearest1d_backward.default),
    aten.upsample_nearest2d_backward.default: functools.partial(_upsample_nearest_backward,
                                                                aten.upsample_nearest2d_backward.default),
    aten.upsample_nearest3d_backward.default: functools.partial(_upsample_nearest_backward,
                                                                aten.upsample_nearest3d_backward.default),
    # (nearest-exact reads pixel floor((i + 1/2) / f), nearest floor(i / f): at a whole factor f the same, since
    # i = q f + r with r + 1/2 < f)
    **{op: functools.partial(_upsample_nearest_backward, op)
       for op in (aten._upsample_nearest_exact1d_backward.default, aten._upsample_nearest_exact2d_backward.default,
                  aten._upsample_nearest_exact3d_backward.default)},
    aten.hardsigmoid.default: hardsigmoid,
    aten.hardsigmoid_backward.default: hardsigmoid_backward,
    aten.hardswish.default: hardswish,
    aten.hardswish_backward.default: hardswish_backward,
    aten.log_sigmoid_forward.default: log_sigmoid,
    aten.log_sigmoid_backward.default: log_sigmoid_backward,
    aten.mish.default: mish,
    aten.mish_backward.default: mish_backward,
    aten.xlogy.Tensor: functools.partial(_x_times_log, aten.log.default, 1.0),
    aten.scatter_reduce.two: scatter_reduce,
    aten.linalg_solve_triangular.default: solve_triangular,
    aten.linalg_cholesky_ex.default: cholesky,
    aten.scatter_reduce_.two: scatter_reduce_,
    aten.special_xlog1py.default: functools.partial(_x_times_log, aten.log1p.default, 0.0),
    aten.logsumexp.default: logsumexp,
    aten.baddbmm.default: baddbmm,
    aten.norm.Scalar: norm,
    aten.norm.ScalarOpt_dim: norm,
    aten.binary_cross_entropy.default: binary_cross_entropy,
    aten.binary_cross_entropy_backward.default: binary_cross_entropy_backward,
    aten._prelu_kernel.default: prelu,
    aten._prelu_kernel_backward.default: prelu_backward,
    aten._adaptive_avg_pool2d.default: _adaptive_avg_pool(2),
    aten._adaptive_avg_pool2d_backward.default: _adaptive_avg_pool_backward(2),
    aten._adaptive_avg_pool3d.default: _adaptive_avg_pool(3),
    aten._adaptive_avg_pool3d_backward.default: _adaptive_avg_pool_backward(3),
    aten.adaptive_max_pool2d_backward.default: adaptive_max_pool2d_backward,
    aten.scatter_add.default: scatter_add,
    aten.index_add.default: index_add,
    **{op: functools.partial(_pad_backward, reflect) for op, reflect in (
        (aten.reflection_pad1d_backward.default, True), (aten.reflection_pad2d_backward.default, True),
        (aten.reflection_pad3d_backward.default, True), (aten.replication_pad1d_backward.default, False),
        (aten.replication_pad2d_backward.default, False), (aten.replication_pad3d_backward.default, False))},
    **{op: functools.partial(embedding_bag, op) for op in (aten._embedding_bag.default,
                                                           aten._embedding_bag_forward_only.default)},
    aten._embedding_bag_backward.default: embedding_bag_backward,
    aten._embedding_bag_per_sample_weights_backward.default: embedding_bag_per_sample_weights_backward,
    **{op: _upsample(_linear_taps) for op in (aten.upsample_linear1d.default, aten.upsample_bilinear2d.default,
                                              aten.upsample_trilinear3d.default)},
    **{op: _upsample_backward(_linear_taps) for op in (aten.upsample_linear1d_backward.default,
                                                       aten.upsample_bilinear2d_backward.default,
                                                       aten.upsample_trilinear3d_backward.default)},
    aten.upsample_bicubic2d.default: _upsample(_cubic_taps),
    aten.upsample_bicubic2d_backward.default: _upsample_backward(_cubic_taps),
    aten.col2im.default: col2im,
    aten._cdist_forward.default: cdist_forward,
    aten.multi_margin_loss.default: multi_margin_loss,
    aten.multilabel_margin_loss_forward.default: multilabel_margin_loss,
    aten.multilabel_margin_loss_backward.default: multilabel_margin_loss_backward,
    aten.multi_margin_loss_backward.default: multi_margin_loss_backward,
    aten._cdist_backward.default: cdist_backward,
    aten._pdist_forward.default: pdist_forward,
    aten._pdist_backward.default: pdist_backward,
    aten.grid_sampler_2d.default: grid_sampler_2d,
    aten.grid_sampler_2d_backward.default: grid_sampler_2d_backward,
    aten.linspace.default: linspace,
    aten.affine_grid_generator.default: affine_grid_generator,
    aten.glu.default: glu,
    aten.glu_backward.default: glu_backward,
    aten.prod.default: prod,
    aten.prod.dim_int: prod,
    aten.soft_margin_loss.default: soft_margin_loss,
    aten.soft_margin_loss_backward.default: soft_margin_loss_backward,
    aten.nll_loss2d_forward.default: nll_loss2d,
    aten.nll_loss2d_backward.default: nll_loss2d_backward,
    aten.cumsum.default: functools.partial(_cumulative, aten.cumsum.default, aten.add.Tensor),
    aten.cumprod.default: functools.partial(_cumulative, aten.cumprod.default, aten.mul.Tensor),
    aten._foreach_norm.Scalar: foreach_norm,
    **_foreach_ops(),
    **{op: functools.partial(_fused_adam, op) for op in (aten._fused_adam_.default, aten._fused_adam_.tensor_lr,
                                                          aten._fused_adamw_.default, aten._fused_adamw_.tensor_lr)},
    aten._fused_sgd_.default: fused_sgd,
    aten._fused_sgd_.tensor_lr: fused_sgd,
    aten._fused_adagrad_.default: fused_adagrad,
    aten._fused_adagrad_.tensor_lr: fused_adagrad,
    aten.addmv.default: addmv,
    aten.addbmm.default: addbmm,
    aten.trace.default: trace,
    aten.addr.default: addr,
    aten.vdot.default: vdot,
    aten._trilinear.default: trilinear,
    aten.logaddexp.default: functools.partial(_logaddexp, aten.exp.default, 1.0),
    aten.logaddexp2.default: functools.partial(_logaddexp, aten.exp2.default, 1 / math.log(2)),
    aten.hypot.default: hypot,
    aten.renorm.default: renorm,
    aten._weight_norm_interface.default: weight_norm,
    aten._weight_norm_interface_backward.default: weight_norm_backward,
    aten.embedding_renorm_.default: embedding_renorm_,
    # (windows of any size over the volume; the forward pass is exact, class 1)
    aten.adaptive_max_pool3d_backward.default: functools.partial(_add_at_indices, dims=3),
    aten.dist.default: dist,
    aten.max_pool3d_with_indices_backward.default: max_pool3d_backward,
    aten.avg_pool3d.default: avg_pool3d,
    aten.avg_pool3d_backward.default: avg_pool3d_backward,
}
