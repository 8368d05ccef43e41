"""vtrain.fused_layer_norm against the written-out LayerNorm under rounded execution (its ops and autograd's, each
dispatched and rounded): the same output and gradients bit for bit, with x's gradient summed in the same order where x
has another consumer, the same log, the same ops and rounded values counted, the same error for a value off the grid,
in one pass or in parts on two threads (tests/families/test_family_fused_ops.py trains GPT-2-tiny both ways)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_num_fused_gelu import _same_bits, _values
from vtrain import fused_layer_norm, omp, omp_kernels
from vtrain.devices import get_device
from vtrain.models.norms import LayerNorm
from vtrain.rounding import NonFiniteError, RoundedExecution


def _norm(x0: torch.Tensor, g: torch.Tensor, w: torch.Tensor, b: torch.Tensor, bits: int, fused: bool,
          residual: bool = False, mode: str = "record") -> tuple:
    """(y, the gradients of x, w and b, the log's bytes, ops and rounded values counted, the passes run fused) of
    one LayerNorm and its backward; `residual`: x also feeds a sum with the output, as GPT-2's residual stream."""
    fused_layer_norm.ENABLED = fused
    passes, run = [], fused_layer_norm._fused
    fused_layer_norm._fused = lambda *a, **k: (out := run(*a, **k), passes.append(out is not None))[0]
    try:
        m = LayerNorm(x0.shape[-1]).double()
        with torch.no_grad():
            m.weight.copy_(w)
            m.bias.copy_(b)
        x = x0.clone().requires_grad_()
        rx = RoundedExecution(bits=bits, device=get_device("cpu"), mode=mode)
        with rx:
            h = x * 1.0 if residual else x
            y = m(h) + h if residual else m(h)
            y.backward(g)
        grads = (x.grad, m.weight.grad, m.bias.grad)
        return y.detach(), grads, rx.log.to_bytes(), rx._counts["ops"], rx._counts["rounded"], passes
    finally:
        fused_layer_norm._fused, fused_layer_norm.ENABLED = run, True


def _operands(shape: tuple[int, ...], bits: int, seed: int) -> tuple[torch.Tensor, ...]:
    n, d = int(np.prod(shape)), shape[-1]
    return (_values(n, bits, seed, top=2.0**30).reshape(shape), _values(n, bits, seed + 1, top=2.0**10).reshape(shape),
            _values(d, bits, seed + 2, top=2.0**10), _values(d, bits, seed + 3, top=2.0**10))


def _alike(a: tuple, b: tuple) -> bool:
    return _same_bits(a[0], b[0]) and all(_same_bits(p, q) for p, q in zip(a[1], b[1])) and a[2:5] == b[2:5]


@pytest.mark.parametrize("shape", [(2, 3, 8), (4, 16, 64)])
@pytest.mark.parametrize("residual", [False, True])
def test_the_passes_give_the_written_out_values(shape: tuple[int, ...], residual: bool) -> None:
    bits = 32
    x, g, w, b = _operands(shape, bits, 1)
    fast, slow = (_norm(x, g, w, b, bits, fused, residual) for fused in (True, False))
    assert fast[5] == [True] * 6 and slow[5] == []  # (all six passes fused, then none)
    assert _alike(fast, slow)


def test_the_parts_on_two_threads_give_the_one_pass_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(omp, "MIN_VALUES", 512)
    ran, launch = [], omp.run
    monkeypatch.setattr(omp, "run", lambda kernel, block, parts: ran.append((kernel, parts)) or launch(kernel, block,
                                                                                                       parts))
    x, g, w, b = _operands((4, 50, 64), 32, 3)
    torch.set_num_threads(2)
    try:
        split = _norm(x, g, w, b, 32, True, residual=True)
    finally:
        torch.set_num_threads(1)
    whole = _norm(x, g, w, b, 32, True, residual=True)
    # the six passes ran in two parts each (libgomp's team, as torch's), and gave the one pass's bits
    assert [p for k, p in ran if k == omp_kernels._chain_part.address] == [2] * 6
    assert _alike(split, whole)


def test_a_gradient_the_passes_refuse_takes_autograd_s_ops() -> None:
    # a broadcast gradient (not contiguous): its pass dispatches autograd's two products; the rest run fused
    x, _, w, b = _operands((8, 16), 32, 5)
    g = _values(16, 32, 6, top=2.0**10).expand(8, 16)
    fast, slow = (_norm(x, g, w, b, 32, fused) for fused in (True, False))
    assert fast[5] == [True, True, False, True, True, True]
    assert _alike(fast, slow)


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_value_off_the_grid_names_the_op_that_wrote_it(where: str) -> None:
    # forward: the centred values' squares beyond float32's largest value (x - mean is still on the grid); backward:
    # the gradient times the weight, the second of autograd's products (the bias's sum of the gradient before them
    # stays on the grid)
    x = torch.tensor([[2.0**70, -(2.0**70)], [1.0, 2.0]] if where == "forward" else [[1.0, 2.0], [3.0, 5.0]],
                     dtype=torch.float64)
    g = torch.full((2, 2), 2.0**126, dtype=torch.float64)
    w, b = torch.full((2,), 4.0, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    errors = []
    for fused in (True, False):
        with pytest.raises(NonFiniteError) as exc:
            _norm(x, g, w, b, 32, fused, mode="plain")
        errors.append((exc.value.site, str(exc.value)))
    assert errors[0] == errors[1] and errors[0][0] == (2 if where == "forward" else 11)


def test_outside_rounded_execution_and_on_other_grids_the_written_out_form_runs() -> None:
    m = LayerNorm(8).double()
    x = _values(24, 24, 7).reshape(3, 8).requires_grad_()
    assert fused_layer_norm.layer_norm(x, m.weight, m.bias, m.eps) is None
    assert type(m(x).grad_fn).__name__ == "AddBackward0"
    with RoundedExecution(bits=24, device=get_device("cpu"), mode="plain"):  # (float64 work at bits = 32 only)
        assert fused_layer_norm.layer_norm(x, m.weight, m.bias, m.eps) is None
        assert type(m(x).grad_fn).__name__ == "AddBackward0"
