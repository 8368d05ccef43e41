"""vtrain.accumulation: the autograd engine's sums of gradients written over their left operand under rounded
execution only where nothing else holds it, with the bits of the sum into a fresh tensor."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from vtrain import accumulation, fused_binary, fused_norms, rounding
from vtrain.devices import get_device
from vtrain.models import gpt2
from vtrain.rounding import RoundedExecution

aten = torch.ops.aten
N = fused_binary.MIN_ELEMENTS  # values a gradient: the one-pass path's least
_OWNERS = accumulation._owners


class _Ops(TorchDispatchMode):
    """Records (the autograd node being evaluated, op) for every op a backward pass dispatches."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        node = torch._C._current_autograd_node()
        if node is not None:
            self.seen.append((node.name(), func))
        return func(*args, **(kwargs or {}))


def _leaf(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(sum(shape)),
                       requires_grad=True)


# Each graph uses every tensor once, so the engine sums nothing: an add in its backward pass is a formula's.
FORMULAS = {
    "MulBackward0": [lambda: _leaf(4, 3) * _leaf(4, 3), lambda: _leaf(4, 3) * _leaf(3),
                     lambda: _leaf(4, 1) * _leaf(1, 3)],
    "MeanBackward1": [lambda: _leaf(4, 3).mean(1), lambda: _leaf(2, 4, 3).mean((0, 2), keepdim=True)],
    "SubBackward0": [lambda: _leaf(4, 3) - _leaf(4, 3), lambda: _leaf(4, 3) - _leaf(4, 1)],
    "MmBackward0": [lambda: _leaf(4, 5) @ _leaf(5, 3), lambda: _leaf(5, 4).t() @ _leaf(5, 3)],
    "ConvolutionBackward0": [lambda: F.conv2d(_leaf(2, 3, 6, 6), _leaf(4, 3, 3, 3), _leaf(4), padding=1),
                             lambda: F.conv2d(_leaf(2, 3, 6, 6), _leaf(4, 3, 3, 3), stride=2)],
    # (vtrain's fused GELU and norms, layer and batch, run under rounded execution on leaves made outside it: (the
    # function, its leaves); a norm's x given as two tensors, so that the engine sums nothing)
    "_GeluBackward": [lambda: (gpt2.gelu, [_leaf(4, 3)])],
    "_NormBackward": [lambda: (lambda x, y, w, b: fused_norms._Norm.apply(x, y, w, b, 1e-5, layout(x), None),
                               [_leaf(*shape), _leaf(*shape), _leaf(shape[c]), _leaf(shape[c])])
                      for layout, shape, c in ((fused_norms.layer_layout, (4, 3), -1),
                                               (fused_norms.batch_layout, (2, 3, 2, 2), 1))],
}
_ROUNDED = {"_GeluBackward", "_NormBackward"}


@pytest.mark.parametrize("name", sorted(accumulation.ADD_FREE))
def test_the_add_free_nodes_formulas_dispatch_no_add(name: str) -> None:
    assert set(FORMULAS) == accumulation.ADD_FREE
    for make in FORMULAS[name]:
        if name in _ROUNDED:
            fn, leaves = make()
            with _Ops() as ops, RoundedExecution(bits=32, device=get_device("cpu"), mode="plain"):
                out = fn(*leaves)
                out.backward(torch.ones_like(out))
        else:
            out = make()
            with _Ops() as ops:
                out.backward(torch.ones_like(out))
        nodes = {node for node, _ in ops.seen}
        # the formula ran, under the mode (the fused GELU's backward is one pass, and dispatches nothing at all)
        assert name in nodes or (name == "_GeluBackward" and out.grad_fn.name() == name)
        assert not [(node, func) for node, func in ops.seen if func in (aten.add.Tensor, aten.add_.Tensor)]


def test_the_owners_of_a_sole_gradient_are_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    # on this torch a second owner shows, so the sums below can run in place (None would turn them off)
    assert accumulation.sole_owners() is not None
    # where it would not show, none is taken for sole
    monkeypatch.setattr(accumulation, "_owners", lambda args: (1, 1))
    assert accumulation._measure() is None
    # measured outside any backward pass, under inference mode and a meta default device too
    monkeypatch.setattr(accumulation, "_owners", _OWNERS)
    with torch.inference_mode(), torch.device("meta"):
        assert accumulation._measure() == accumulation.sole_owners()


def test_the_owners_are_not_measured_inside_a_backward_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accumulation, "_MEASURED", [])
    inside: list = []
    p = torch.ones(4, dtype=torch.float64, requires_grad=True)
    y = p * 2.0
    y.register_hook(lambda g: inside.append(accumulation.sole_owners()))
    y.sum().backward()
    assert inside == [None] and accumulation._MEASURED == []  # (none kept: asked again outside, it measures)
    assert accumulation.sole_owners() is not None and accumulation._MEASURED


def _spy(monkeypatch: pytest.MonkeyPatch, spy: list, in_place: bool) -> None:
    """The rounded execution's sole_gradient noting in `spy` what it said of each sum in a backward pass;
    `in_place` False: every sum into a fresh tensor."""
    decide = accumulation.sole_gradient

    def noted(func: Any, args: tuple) -> bool:
        said = decide(func, args) and in_place
        if func is aten.add.Tensor and torch._C._current_graph_task_id() != -1:
            spy.append(said)
        return said

    monkeypatch.setattr(rounding, "sole_gradient", noted)


def _parameter() -> torch.Tensor:
    return torch.linspace(-3.0, 5.0, N, dtype=torch.float64).requires_grad_()


def _backward(graph: Any, spy: list, monkeypatch: pytest.MonkeyPatch, in_place: bool = True,
              mode: type = RoundedExecution) -> torch.Tensor:
    """p.grad after graph(p) and its backward pass under rounded execution (plain), spied on (`_spy`)."""
    _spy(monkeypatch, spy, in_place)
    p = _parameter()
    with mode(bits=32, device=get_device("cpu"), mode="plain"):
        graph(p).sum().backward()
    return p.grad


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.view(torch.int64), b.view(torch.int64))


def test_a_sole_gradient_takes_the_sum_in_place_with_the_same_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    q1 = torch.linspace(0.1, 3.3, N, dtype=torch.float64).float().double()  # (grid values)
    q2 = torch.linspace(-7.0, 2.0, N, dtype=torch.float64).float().double()

    def graph(p: torch.Tensor) -> torch.Tensor:
        return p * q1 + p * q2  # p's buffer: one product's gradient (q2) added to the other's (q1)

    said: list = []
    got = _backward(graph, said, monkeypatch)
    fresh: list = []
    want = _backward(graph, fresh, monkeypatch, in_place=False)
    assert said == [True] and fresh == [False]
    assert _same_bits(got, want)
    assert _same_bits(want, (q1 + q2).float().double())  # the float64 sum on the grid


def test_a_gradient_two_buffers_hold_is_not_summed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    def graph(p: torch.Tensor) -> torch.Tensor:
        a, b = p * 0.3, p * 0.7
        c = a * 1.1
        # a + b passes one gradient on to a's node and b's: c's is added to a's while b's buffer holds it
        return ((a + b) + c) * p

    said: list = []
    got = _backward(graph, said, monkeypatch)
    want = _backward(graph, [], monkeypatch, in_place=False)
    assert said[0] is False and True in said  # the shared gradient kept; a sole one later summed in place
    assert _same_bits(got, want)


def test_a_view_of_a_gradient_another_buffer_holds_is_not_summed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    def graph(p: torch.Tensor) -> torch.Tensor:
        y, k = p * 0.3, p * 0.9
        w, v = y * 0.7, y.view(N)
        # v + k passes one gradient on to v's node and k's; v's node gives y's buffer a view of it, and w's adds
        # its gradient to that view while k's buffer (k's node runs last: made first) still holds the gradient
        return ((v + k) + w) * p

    said: list = []
    got = _backward(graph, said, monkeypatch)
    want = _backward(graph, [], monkeypatch, in_place=False)
    assert said[0] is False
    assert _same_bits(got, want)


def test_only_the_add_free_nodes_sums_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    # p's buffer sums the gradients of its two uses under the node that runs second, the one made first
    said: list = []
    _backward(lambda p: p.exp() + p * 0.5, said, monkeypatch)  # under ExpBackward0 (not in ADD_FREE)
    assert said == [False]
    said.clear()
    _backward(lambda p: p * 0.5 + p.exp(), said, monkeypatch)  # under MulBackward0
    assert said == [True]


# grid values, made outside the rounded execution (which has no random ops)
Q = [torch.randn(N, dtype=torch.float64, generator=torch.Generator().manual_seed(i)).float().double() for i in range(7)]


def _hooked(kept: list) -> Any:
    def graph(p: torch.Tensor) -> torch.Tensor:
        u = p * Q[1]
        t = u - Q[2]  # (t's gradient passes through SubBackward0 to u's buffer, where u * r's is added)
        t.register_hook(lambda g: kept.append((g, g.clone())))
        u.retain_grad()
        return t * Q[3] + u * Q[2]
    return graph


def _twice(p: torch.Tensor) -> list:
    y = (p * Q[1] - Q[2]) * Q[3] + p * Q[2]
    torch.autograd.backward(y.sum(), retain_graph=True)
    first = p.grad.clone()
    torch.autograd.backward(y.sum())
    return [first, p.grad]


def _several(p: torch.Tensor) -> list:
    u = p * Q[1]
    t = u - Q[2]
    outs = [t * Q[3], u * Q[2], t - Q[1]]
    return list(torch.autograd.grad(outs, [p, t, u], grad_outputs=[Q[4], Q[5], Q[6]]))


def _results(case: str, monkeypatch: pytest.MonkeyPatch, in_place: bool) -> tuple[list, list, list]:
    said: list = []
    _spy(monkeypatch, said, in_place)
    p = _parameter()
    kept: list = []
    with RoundedExecution(bits=32, device=get_device("cpu"), mode="plain"):
        if case == "hook":
            _hooked(kept)(p).sum().backward()
            got = [p.grad]
        elif case == "retain_graph":
            got = _twice(p)
        else:
            got = _several(p)
    monkeypatch.undo()
    return got, kept, said


@pytest.mark.parametrize("case", ["hook", "retain_graph", "several outputs"])
def test_hooks_retained_graphs_and_several_outputs_give_the_fresh_sums_bits(case: str,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    got, kept, said = _results(case, monkeypatch, True)
    want, _, fresh = _results(case, monkeypatch, False)
    assert True in said and True not in fresh  # (some sums written in place, then none)
    assert len(got) == len(want) and all(_same_bits(a, b) for a, b in zip(got, want))
    # a gradient the hook keeps is never summed over (its reference shows)
    assert all(_same_bits(g, copy) for g, copy in kept) and len(kept) == (case == "hook")


class _Keeper(RoundedExecution):
    """Rounded execution that also keeps every product of the backward pass, as the matmul pre-filter keeps
    its operands: Python references that no use count shows."""

    kept: list = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if func is aten.mul.Tensor and torch._C._current_graph_task_id() != -1:
            self.kept.append((out, out.clone()))
        return out


def test_a_gradient_python_holds_is_not_summed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_Keeper, "kept", [])
    said: list = []
    _backward(lambda p: p * 0.3 + p * 0.7, said, monkeypatch, mode=_Keeper)
    assert said == [False]
    assert len(_Keeper.kept) == 2 and all(_same_bits(t, copy) for t, copy in _Keeper.kept)


def test_sums_outside_a_backward_pass_or_with_grad_mode_are_not_taken() -> None:
    x, y = torch.ones(N, dtype=torch.float64), torch.ones(N, dtype=torch.float64)
    assert not accumulation.sole_gradient(aten.add.Tensor, (x, y))  # no graph task
    seen: list = []

    class Asks(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
            if func is aten.add.Tensor and torch._C._current_graph_task_id() != -1:
                seen.append(accumulation.sole_gradient(func, args))
            return func(*args, **(kwargs or {}))

    p = torch.ones(N, dtype=torch.float64, requires_grad=True)
    with Asks():
        torch.autograd.grad((p * 2.0 + p * 3.0).sum(), p, create_graph=True)  # a graph of the gradients: grad mode on
    assert seen == [False]
    seen.clear()
    with Asks():
        (p * 2.0 + p * 3.0).sum().backward()
    assert seen == [True]
