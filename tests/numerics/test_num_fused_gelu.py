"""vtrain.fused_gelu against GPT-2's written-out GELU under rounded execution (autograd's ops, each dispatched and
rounded): the same output and gradient bit for bit, the same log, the same ops and rounded values counted, the same
error for a value off the grid, in one pass or in parts on two threads (tests/families/test_family_fused_ops.py
trains GPT-2-tiny both ways)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_num_grid import _adversarial_fp64
from vtrain import fused_gelu, omp, omp_kernels
from vtrain.devices import get_device
from vtrain.models.gpt2 import gelu
from vtrain.rounding import NonFiniteError, RoundedExecution


def _values(n: int, bits: int, seed: int, top: float = 2.0**20) -> torch.Tensor:
    """Ties and near-ties of the grid, subnormals and zeros of both signs, below `top` in magnitude (x^3 then stays
    on the grid), and the values where tanh saturates."""
    gen = np.random.default_rng(seed)
    pool = _adversarial_fp64(4000, bits - 9, gen)
    pool = np.concatenate([pool[np.abs(pool) < top], [0.0, -0.0, 5.0, -5.0, 20.0, -20.0, 2.0**-149]])
    return torch.from_numpy(gen.choice(pool, n))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.view(torch.int64), b.view(torch.int64))


def _gelu(x0: torch.Tensor, g: torch.Tensor, bits: int, fused: bool, mode: str = "record") -> tuple:
    """(y, x's gradient, the log's bytes, ops and rounded values counted) of one GELU and its backward."""
    fused_gelu.ENABLED = fused
    try:
        x = x0.clone().requires_grad_()
        rx = RoundedExecution(bits=bits, device=get_device("cpu"), mode=mode)
        with rx:
            y = gelu(x)
            y.backward(g)
        return y.detach(), x.grad, rx.log.to_bytes(), rx._counts["ops"], rx._counts["rounded"]
    finally:
        fused_gelu.ENABLED = True


@pytest.mark.parametrize("shape", [(7,), (4, 33, 65)])
def test_the_passes_give_the_written_out_values(shape: tuple[int, ...]) -> None:
    bits = 32
    n = int(np.prod(shape))
    x, g = _values(n, bits, 1).reshape(shape), _values(n, bits, 2, top=2.0**10).reshape(shape)
    runs = []
    for fused in (True, False):
        passes = []
        run = fused_gelu._run
        fused_gelu._run = lambda *a, **k: (out := run(*a, **k), passes.append(out is not None))[0]
        try:
            runs.append(_gelu(x, g, bits, fused))
        finally:
            fused_gelu._run = run
        # the three passes ran fused (none failed), and the written-out form ran none
        assert passes == ([True] * 3 if fused else [])
    (y1, g1, log1, ops1, n1), (y2, g2, log2, ops2, n2) = runs
    assert _same_bits(y1, y2) and _same_bits(g1, g2)
    assert log1 == log2 and (ops1, n1) == (ops2, n2) == (23, 23 * n)


def test_the_parts_on_two_threads_give_the_one_pass_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(omp, "MIN_VALUES", 512)
    ran, launch = [], omp.run
    monkeypatch.setattr(omp, "run", lambda kernel, block, parts: ran.append((kernel, parts)) or launch(kernel, block,
                                                                                                       parts))
    x, g = _values(10_000, 32, 3).reshape(10, 1000), _values(10_000, 32, 4, top=2.0**10).reshape(10, 1000)
    torch.set_num_threads(2)
    try:
        split = _gelu(x, g, 32, True)
    finally:
        torch.set_num_threads(1)
    whole = _gelu(x, g, 32, True)
    # the three passes ran in two parts each (libgomp's team, as torch's), and gave the one pass's bits
    assert [p for k, p in ran if k == omp_kernels._chain_part.address] == [2, 2, 2]
    assert all(_same_bits(a, b) for a, b in zip(split[:2], whole[:2])) and split[2:] == whole[2:]


def test_a_gradient_the_passes_refuse_takes_autograd_s_ops() -> None:
    # a broadcast gradient (not contiguous): the backward dispatches autograd's fourteen ops one by one
    x = _values(64 * 32, 32, 5).reshape(64, 32)
    g = _values(32, 32, 6, top=2.0**10).expand(64, 32)
    assert not g.is_contiguous()
    (y1, g1, log1, ops1, n1), (y2, g2, log2, ops2, n2) = (_gelu(x, g, 32, f) for f in (True, False))
    assert _same_bits(y1, y2) and _same_bits(g1, g2) and log1 == log2 and (ops1, n1) == (ops2, n2)


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_value_off_the_grid_names_the_op_that_wrote_it(where: str) -> None:
    # forward: x^3 beyond float32's largest value (x x, the second op, is still on the grid); backward: the
    # gradient times x/2, autograd's first op
    x = torch.full((300,), 2.0**50 if where == "forward" else 4.0, dtype=torch.float64)
    g = torch.full((300,), 2.0**127, dtype=torch.float64)
    messages = []
    for fused in (True, False):
        with pytest.raises(NonFiniteError) as exc:
            _gelu(x, g, 32, fused, mode="plain")
        messages.append((exc.value.site, str(exc.value)))
    assert messages[0] == messages[1] and messages[0][0] == (2 if where == "forward" else 9)


def test_outside_rounded_execution_and_on_other_grids_the_written_out_form_runs() -> None:
    x = _values(100, 24, 7).requires_grad_()
    assert fused_gelu.gelu(x) is None
    assert type(gelu(x).grad_fn).__name__ == "MulBackward0"
    with RoundedExecution(bits=24, device=get_device("cpu"), mode="plain"):  # (float64 work at bits = 32 only)
        assert fused_gelu.gelu(x) is None
        assert type(gelu(x).grad_fn).__name__ == "MulBackward0"
