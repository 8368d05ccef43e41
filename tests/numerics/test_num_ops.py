"""The op registry: classes, the decomposed fused ops, and the refusal of unknown ops."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vtrain.devices import get_device
from vtrain.grid import round_to_grid
from vtrain.ops import OpClass, UnsupportedOpError, classify, registry
from vtrain.rounding import RoundedExecution

aten = torch.ops.aten


def test_classes_of_representative_ops() -> None:
    assert classify(aten.view.default, (), {}).cls is OpClass.EXACT
    assert classify(aten.relu.default, (), {}).cls is OpClass.EXACT
    assert classify(aten.mul_.Tensor, (), {}).cls is OpClass.IEEE and classify(aten.mul_.Tensor, (), {}).inplace
    for op in (aten.mm.default, aten.convolution_backward.default, aten.sum.dim_IntList, aten._log_softmax.default,
               aten.nll_loss_forward.default, aten.exp.default):
        assert classify(op, (), {}).cls is OpClass.DEVICE and classify(op, (), {}).bound is not None
    for op in (aten.addcmul_.default, aten.lerp_.Scalar, aten.add_.Tensor):
        spec = classify(op, (), {})
        assert spec.cls is OpClass.IEEE and spec.decomposed is not None and spec.inplace
    assert registry()["aten.mm.default"] is OpClass.DEVICE
    assert classify(aten._foreach_add_.List, (), {}).cls is OpClass.COMPOSITE  # (each tensor's add_ in turn)
    assert classify(aten._fused_adam_.default, (), {}).cls is OpClass.COMPOSITE  # (each parameter's loop in turn)
    with pytest.raises(UnsupportedOpError, match="aten._cudnn_rnn"):
        classify(aten._cudnn_rnn.default, (), {})


@pytest.mark.parametrize("mode", ["record", "plain"])
def test_a_gradient_held_elsewhere_is_accumulated_under_rounded_execution(mode: str) -> None:
    # A gradient that something else still references (here a hook's list; in a step, any module holding the
    # tensor) cannot be taken over by AccumulateGrad, which copies it into new_empty_strided's tensor instead.
    p = torch.tensor([[0.1, -2.5], [3.0, 7.25]], dtype=torch.float64, requires_grad=True)
    held: list[torch.Tensor] = []
    p.register_hook(held.append)
    with RoundedExecution(bits=32, device=get_device("cpu"), mode=mode):
        (p * 3.0).sum().backward()
    assert held[0] is not p.grad and torch.equal(p.grad, torch.full((2, 2), 3.0, dtype=torch.float64))


def test_decomposed_ops_follow_their_fixed_formula_on_every_device() -> None:
    gen = torch.Generator().manual_seed(2)
    x, t1, t2 = (torch.randn(1000, generator=gen, dtype=torch.float64).to(torch.float32).double() for _ in range(3))
    want = {
        "lerp": x + (t1 - x) * 0.1,
        "addcmul": x + (t1 * t2) * -0.3,
        "addcdiv": x + (t1 / t2) * 0.7,
        "add_alpha": x + t1 * -0.05,
        "add_scalar_alpha": x + 3.0 * 0.1,
    }
    for device in ("cpu", "emu:splitk8-tree"):
        with RoundedExecution(bits=32, device=get_device(device)) as rx:
            got = {
                "lerp": torch.lerp(x, t1, 0.1),
                "addcmul": x.clone().addcmul_(t1, t2, value=-0.3),
                "addcdiv": torch.addcdiv(x, t1, t2, value=0.7),
                "add_alpha": torch.add(x, t1, alpha=-0.05),
                "add_scalar_alpha": aten.add.Scalar(x, 3.0, 0.1),
            }
        for name, value in got.items():
            assert torch.equal(value, want[name].to(torch.float32).double()), name
        assert rx.stats["sites"] == 0 and rx.stats["rounded"] == 5 * 1000



@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_square_root_is_correctly_rounded(dtype: torch.dtype) -> None:
    # An IEEE op must give every device the same bits: the correctly rounded root r, with (r - ulp/2)^2 < x <
    # (r + ulp/2)^2 (exact Fractions; a root is never a midpoint). torch's vectorised CPU kernel misses on
    # ~0.7 % of values (0x1.1d24p-16 in float32 among them); the registry's decomposition must not.
    from fractions import Fraction

    import numpy as np

    from vtrain.grid import round_to_grid
    from vtrain.ops import _sqrt

    gen = torch.Generator().manual_seed(5)
    x = torch.rand(20000, generator=gen, dtype=torch.float64).mul_(10.0).to(dtype)
    x[:3] = torch.tensor([0.0, 2.0**-140, float.fromhex("0x1.1d24p-16")], dtype=torch.float64).to(dtype)
    root = _sqrt(x)
    assert root.dtype == dtype and root.shape == x.shape and _sqrt(x[0]).shape == ()
    for i in [*range(3), *range(3, x.numel(), 7)]:  # the named values and a sample, checked exactly
        r, v = Fraction(float(root[i])), Fraction(float(x[i]))
        half = Fraction(float(np.spacing(root[i].numpy()))) / 2
        assert r == 0 if v == 0 else (r - half) ** 2 < v < (r + half) ** 2, (i, float(x[i]))
    # the rounded execution takes it, in place or not (and then rounds it to the grid)
    with RoundedExecution(bits=32, device=get_device("cpu"), mode="plain"):
        ours, inplace = torch.sqrt(x), x.clone().sqrt_()
    assert torch.equal(ours, inplace) and torch.equal(ours, round_to_grid(root, 32))


def test_ops_outside_the_registry_run_on_integers_and_stay_refused_elsewhere() -> None:
    # integer arithmetic is exact on every device: a position id's remainder, a count's floor division, a mask's
    # exclusive or run as they are; on floating operands, drawing random numbers, or returning floating values
    # from integers, the same ops stay refused, named
    ids, mask = torch.tensor([[3, 7, 12], [5, 0, 9]]), torch.tensor([True, False, True])
    with RoundedExecution(bits=32, device=get_device("cpu"), mode="record"):
        got = (ids % 5, torch.floor_divide(ids, 4), mask ^ torch.tensor([True, True, False]))
        with pytest.raises(UnsupportedOpError, match="aten.floor_divide"):
            torch.floor_divide(ids.double(), 4.0)
        with pytest.raises(UnsupportedOpError, match="aten.randint_like"):
            torch.randint_like(ids, 10)
        with pytest.raises(UnsupportedOpError, match="aten.i0.*floating values from integer operands"):
            torch.i0(ids)
    assert [t.tolist() for t in got] == [[[3, 2, 2], [0, 0, 4]], [[0, 1, 3], [1, 0, 2]], [False, True, True]]
    for op in (aten.floor_divide.default, aten.bitwise_xor.Tensor):  # (the rule, not entries)
        assert str(op) not in registry()


def test_fmod_of_grid_values_is_exact_and_remainder_one_rounded_addition() -> None:
    # IEEE's fmod is exact, and of two grid values a grid value (a multiple of the smaller lsb, below |y|): class 1;
    # by a number off the grid (0.7) its exact float64 result is rounded onto the grid once, as for the other ops
    # that take numbers. remainder adds y to it where the signs differ (torch's kernels): one rounded addition.
    gen = torch.Generator().manual_seed(3)
    x, y = (round_to_grid(torch.randn(4000, generator=gen, dtype=torch.float64)
                          * 2.0 ** torch.randint(-30, 30, (4000,), generator=gen), 32) for _ in range(2))
    with RoundedExecution(bits=32, device=get_device("cpu"), mode="record") as rx:
        got = [torch.fmod(x, y), torch.fmod(x, 0.7), torch.remainder(x, y), torch.remainder(x, -0.7),
               torch.nan_to_num(x)]
    xn, yn = x.numpy(), y.numpy()
    assert torch.equal(got[0], torch.from_numpy(np.fmod(xn, yn))) and torch.equal(got[0], round_to_grid(got[0], 32))
    for g, e in zip(got[1:4], (np.fmod(xn, 0.7), np.remainder(xn, yn), np.remainder(xn, -0.7))):
        assert torch.equal(g, round_to_grid(torch.from_numpy(e), 32))
    assert not torch.equal(got[2], torch.remainder(x, y))  # (some sums do round: a tiny x and a large y of other sign)
    assert torch.equal(got[4], x) and not rx.log.sites
    for op in (aten.fmod.Tensor, aten.nan_to_num.default, aten.cummax.default, aten.take.default,
               aten.masked_select.default, aten.masked_scatter_.default, aten.median.dim, aten.kthvalue.default,
               aten.frac.default, aten.ceil_.default):
        assert classify(op, (), {}).cls is OpClass.EXACT
    assert classify(aten.remainder.Tensor, (), {}).cls is OpClass.IEEE


def test_take_backward_refuses_a_position_taken_twice_by_name() -> None:
    # take's backward puts the gradients back with accumulate=True: one addition a position, refused where a
    # position would get two (summed in the device's order)
    x = torch.zeros(3, 4, dtype=torch.float64, requires_grad=True)
    with RoundedExecution(bits=32, device=get_device("cpu")):
        torch.take(x, torch.tensor([1, 5])).sum().backward()
        assert x.grad.reshape(-1).tolist() == [0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]
        with pytest.raises(UnsupportedOpError, match="aten.index_put.*named twice"):
            torch.take(x, torch.tensor([1, 1])).sum().backward()
    with pytest.raises(UnsupportedOpError, match="aten.put.*named twice"):  # (without accumulate: which value lands)
        with RoundedExecution(bits=32, device=get_device("cpu")):
            torch.zeros(4, dtype=torch.float64).put_(torch.tensor([2, 2]), torch.tensor([1.0, 2.0]).double())


def test_index_copy_copies_and_refuses_an_index_named_twice() -> None:
    x, src = torch.zeros(4, 3, dtype=torch.float64), torch.tensor([[1.5, 2, 3], [-4, 5, 6.25]], dtype=torch.float64)
    with RoundedExecution(bits=32, device=get_device("cpu"), mode="record"):
        got = x.index_copy(0, torch.tensor([3, 1]), src)
        with pytest.raises(UnsupportedOpError, match="aten.index_copy.*named twice"):
            x.clone().index_copy_(0, torch.tensor([1, 1]), src)
    assert torch.equal(got, torch.zeros(4, 3, dtype=torch.float64).index_copy(0, torch.tensor([3, 1]), src))
