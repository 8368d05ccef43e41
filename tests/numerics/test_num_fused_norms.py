"""vtrain.fused_norms against the written-out LayerNorm and BatchNorm2d under rounded execution (their ops and
autograd's, each dispatched and rounded): the same output, gradients and running statistics bit for bit, with x's
gradient summed in the same order where x has another consumer, the same log, the same ops and rounded values counted,
the same error for a value off the grid, in one pass or in parts on two threads (tests/families/test_family_fused_ops.py
trains GPT-2-tiny and resnet-tiny both ways)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_num_fused_gelu import _same_bits, _values
from vtrain import fused_norms, omp, omp_kernels
from vtrain.devices import get_device
from vtrain.models.norms import BatchNorm2d, LayerNorm
from vtrain.rounding import NonFiniteError, RoundedExecution


def _module(kind: str, shape: tuple[int, ...]) -> LayerNorm | BatchNorm2d:
    return (LayerNorm(shape[-1]) if kind == "layer" else BatchNorm2d(shape[1])).double()


def _norm(kind: str, x0: torch.Tensor, g: torch.Tensor, w: torch.Tensor, b: torch.Tensor, fused: bool,
          residual: bool = False, mode: str = "record", running: bool = True) -> tuple:
    """(y, the gradients of x, w and b, the running statistics (a batch norm's), the log's bytes, ops and rounded
    values counted, the passes run fused) of one norm (`kind` "layer" or "batch", in training) and its backward at
    bits = 32; `residual`: x also feeds a sum with the output, as GPT-2's residual stream; `running`: whether a batch
    norm updates its running statistics."""
    fused_norms.ENABLED = fused
    passes, run = [], fused_norms._fused
    fused_norms._fused = lambda *a, **k: (out := run(*a, **k), passes.append(out is not None))[0]
    try:
        m = _module(kind, x0.shape)
        if kind == "batch":
            m.update_running = running
        with torch.no_grad():
            m.weight.copy_(w)
            m.bias.copy_(b)
        x = x0.clone().requires_grad_()
        rx = RoundedExecution(bits=32, device=get_device("cpu"), mode=mode)
        with rx:
            h = x * 1.0 if residual else x
            y = m(h) + h if residual else m(h)
            y.backward(g)
        grads = (x.grad, m.weight.grad, m.bias.grad)
        buffers = tuple(t.clone() for t in m.buffers())
        return y.detach(), grads, buffers, rx.log.to_bytes(), rx._counts["ops"], rx._counts["rounded"], passes
    finally:
        fused_norms._fused, fused_norms.ENABLED = run, True


def _operands(kind: str, shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, ...]:
    n, c = int(np.prod(shape)), shape[-1] if kind == "layer" else shape[1]
    return (_values(n, 32, seed, top=2.0**30).reshape(shape), _values(n, 32, seed + 1, top=2.0**10).reshape(shape),
            _values(c, 32, seed + 2, top=2.0**10), _values(c, 32, seed + 3, top=2.0**10))


def _alike(a: tuple, b: tuple) -> bool:
    tensors = [a[0], *a[1], *a[2]], [b[0], *b[1], *b[2]]
    return len(tensors[0]) == len(tensors[1]) and all(_same_bits(p, q) for p, q in zip(*tensors)) and a[3:6] == b[3:6]


# (a batch of one, or planes of one value: autograd's sums over the statistics' dims skip those of one value, whose
# sums are the same values, logs and counts)
NORMS = [("layer", (2, 3, 8)), ("layer", (4, 16, 64)), ("batch", (2, 3, 4, 5)), ("batch", (4, 8, 8, 8)),
         ("batch", (1, 3, 2, 2)), ("batch", (2, 3, 1, 1))]


@pytest.mark.parametrize("kind,shape", NORMS)
@pytest.mark.parametrize("residual", [False, True])
def test_the_passes_give_the_written_out_values(kind: str, shape: tuple[int, ...], residual: bool) -> None:
    x, g, w, b = _operands(kind, shape, 1)
    fast, slow = (_norm(kind, x, g, w, b, fused, residual) for fused in (True, False))
    assert fast[6] == [True] * 6 and slow[6] == []  # (all six passes fused, then none)
    assert _alike(fast, slow)
    if kind == "batch":  # (the running statistics moved, both ways alike)
        assert not torch.equal(fast[2][0], torch.zeros(shape[1], dtype=torch.float64))


def test_a_batch_norm_that_keeps_its_running_statistics_runs_fused_alike() -> None:
    # (data parallel: shards after the first do not update them)
    x, g, w, b = _operands("batch", (3, 5, 2, 7), 2)
    fast, slow = (_norm("batch", x, g, w, b, fused, running=False) for fused in (True, False))
    assert fast[6] == [True] * 6 and _alike(fast, slow)
    assert torch.equal(fast[2][0], torch.zeros(5, dtype=torch.float64)) and torch.equal(fast[2][1], torch.ones(5,
                                                                                               dtype=torch.float64))


@pytest.mark.parametrize("kind,shape", [("layer", (4, 3, 1)), ("layer", (6,)), ("batch", (1, 3, 1, 1))])
def test_norms_whose_backward_sums_less_run_written_out(kind: str, shape: tuple[int, ...]) -> None:
    # statistics over one value each (autograd's backward dispatches no sum over them, nor, for a batch norm, over
    # its weight's and bias's gradients) and a 1-d layer norm input (its weight's gradient summed over no dim): the
    # passes' order would dispatch sums the written-out form does not, so none runs, and the values, logs and counts
    # are the written-out form's (a batch norm of one value a channel keeps its running statistics: their unbiased
    # variance would divide by zero, both ways)
    x, g, w, b = _operands(kind, shape, 9)
    fast, slow = (_norm(kind, x, g, w, b, fused, running=False) for fused in (True, False))
    assert fast[6] == [] and _alike(fast, slow)


@pytest.mark.parametrize("kind,shape", [("layer", (4, 50, 64)), ("batch", (4, 8, 10, 10))])
def test_the_parts_on_two_threads_give_the_one_pass_values(kind: str, shape: tuple[int, ...],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(omp, "MIN_VALUES", 512)
    ran, launch = [], omp.run
    monkeypatch.setattr(omp, "run", lambda kernel, block, parts: ran.append((kernel, parts)) or launch(kernel, block,
                                                                                                       parts))
    x, g, w, b = _operands(kind, shape, 3)
    torch.set_num_threads(2)
    try:
        split = _norm(kind, x, g, w, b, True, residual=True)
    finally:
        torch.set_num_threads(1)
    whole = _norm(kind, x, g, w, b, True, residual=True)
    # the six passes ran in two parts each (libgomp's team, as torch's), and gave the one pass's bits
    assert [p for k, p in ran if k == omp_kernels._chain_part.address] == [2] * 6
    assert _alike(split, whole)


@pytest.mark.parametrize("kind,shape", [("layer", (8, 16)), ("batch", (4, 3, 2, 5))])
def test_a_gradient_the_passes_refuse_takes_autograd_s_ops(kind: str, shape: tuple[int, ...]) -> None:
    # a broadcast gradient (not contiguous): its pass dispatches autograd's two products; the rest run fused
    x, _, w, b = _operands(kind, shape, 5)
    g = _values(int(np.prod(shape[1:])), 32, 6, top=2.0**10).reshape(shape[1:]).expand(shape)
    fast, slow = (_norm(kind, x, g, w, b, fused) for fused in (True, False))
    assert fast[6] == [True, True, False, True, True, True]
    assert _alike(fast, slow)


# The op of the written-out form that leaves the grid: the forward's square, or the backward's gradient times the
# weight (the batch norm's forward also updates its running statistics: six ops more before it)
SITES = {("layer", "forward"): 2, ("layer", "backward"): 11, ("batch", "forward"): 2, ("batch", "backward"): 17}


@pytest.mark.parametrize("kind", ["layer", "batch"])
@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_value_off_the_grid_names_the_op_that_wrote_it(kind: str, where: str) -> None:
    # forward: the centred values' squares beyond float32's largest value (x - mean is still on the grid); backward:
    # the gradient times the weight, the second of autograd's products (the bias's sum of the gradient before them
    # stays on the grid)
    rows = [[2.0**70, -(2.0**70)], [1.0, 2.0]] if where == "forward" else [[1.0, 2.0], [3.0, 5.0]]
    x = torch.tensor(rows if kind == "layer" else rows[0], dtype=torch.float64)
    x = x if kind == "layer" else x.reshape(2, 1, 1, 1)  # (one channel of two values)
    g = torch.full(x.shape, 2.0**126, dtype=torch.float64)
    c = x.shape[-1] if kind == "layer" else 1
    w, b = torch.full((c,), 4.0, dtype=torch.float64), torch.zeros(c, dtype=torch.float64)
    errors = []
    for fused in (True, False):
        with pytest.raises(NonFiniteError) as exc:
            _norm(kind, x, g, w, b, fused, mode="plain")
        errors.append((exc.value.site, str(exc.value)))
    assert errors[0] == errors[1] and errors[0][0] == SITES[kind, where]


def test_outside_rounded_execution_on_other_grids_and_in_evaluation_the_written_out_form_runs() -> None:
    layer, batch = LayerNorm(8).double(), BatchNorm2d(2).double()
    x, x4 = _values(24, 24, 7).reshape(3, 8).requires_grad_(), _values(24, 24, 8).reshape(3, 2, 2, 2)
    assert fused_norms.layer_norm(x, layer.weight, layer.bias, layer.eps) is None
    assert fused_norms.batch_norm(x4, batch.weight, batch.bias, batch.eps, None) is None
    assert type(layer(x).grad_fn).__name__ == "AddBackward0"
    with RoundedExecution(bits=24, device=get_device("cpu"), mode="plain"):  # (float64 work at bits = 32 only)
        assert fused_norms.layer_norm(x, layer.weight, layer.bias, layer.eps) is None
        assert fused_norms.batch_norm(x4, batch.weight, batch.bias, batch.eps, None) is None
        assert type(layer(x).grad_fn).__name__ == "AddBackward0"
        assert type(batch(x4).grad_fn).__name__ == "AddBackward0"
    with RoundedExecution(bits=32, device=get_device("cpu"), mode="plain"):  # (float32 work; a strided x)
        assert fused_norms.batch_norm(x4.float(), batch.weight.float(), batch.bias.float(), batch.eps, None) is None
        assert fused_norms.batch_norm(x4.contiguous(memory_format=torch.channels_last), batch.weight, batch.bias,
                                      batch.eps, None) is None
        assert fused_norms.batch_norm(x4, batch.weight, batch.bias, batch.eps, None) is not None
    passes, run = [], fused_norms._fused
    fused_norms._fused = lambda *a, **k: passes.append(a) or run(*a, **k)
    try:
        batch.eval()  # (the running statistics' affine map: no statistics of x, no pass)
        with RoundedExecution(bits=32, device=get_device("cpu"), mode="plain"):
            assert type(batch(x4.requires_grad_()).grad_fn).__name__ == "AddBackward0"
    finally:
        fused_norms._fused = run
    assert passes == []
