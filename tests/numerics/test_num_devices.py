"""Device profiles: real variations of the summation order, equally accurate, found by name."""

from __future__ import annotations

import math
import struct

import pytest
import torch

from vtrain.devices import DeviceOpError, UnknownDeviceError, get_device, list_devices
from vtrain.grid import round_to_grid

aten = torch.ops.aten


def test_profiles_are_listed_and_found() -> None:
    names = [d.name for d in list_devices()]
    assert names[0] == "cpu" and ("cuda" in names) == torch.cuda.is_available()
    assert {"emu:splitk8-tree", "emu:splitk16-revseq", "emu:lanes8-butterfly"} <= set(names)
    assert all(get_device(n).name == n and get_device(n).description for n in names)
    with pytest.raises(UnknownDeviceError, match="emu:splitk8-tree"):
        get_device("tpu")


@pytest.mark.parametrize("name", ["emu:splitk8-tree", "emu:splitk16-revseq", "emu:lanes8-butterfly"])
def test_emulated_profiles_differ_from_cpu_and_each_other_but_not_in_accuracy(name: str) -> None:
    gen = torch.Generator().manual_seed(0)
    a = round_to_grid(torch.randn(32, 64, generator=gen, dtype=torch.float64), 32).float()
    b = round_to_grid(torch.randn(64, 128, generator=gen, dtype=torch.float64), 32).float()
    dev, cpu = get_device(name), get_device("cpu")
    got, native = dev.mm(a, b), cpu.mm(a, b)
    exact = a.double() @ b.double()  # products are exact in float64; the sum nearly so
    assert (got != native).float().mean() > 0.3  # a genuinely different order
    others = [get_device(n).mm(a, b) for n in ("emu:splitk8-tree", "emu:splitk16-revseq", "emu:lanes8-butterfly")
              if n != name]
    assert all((got != o).any() for o in others)
    rms = exact.pow(2).mean().sqrt()
    assert (got.double() - exact).abs().max() < 16 * 2.0**-24 * rms * 8  # equally accurate
    # reductions and convolutions too
    x = torch.randn(6, 1000, generator=gen)
    assert (dev.sum(x, [1]) != x.sum(1)).any()
    img = torch.randn(2, 3, 8, 8, generator=gen)
    w = torch.randn(4, 3, 3, 3, generator=gen)
    conv = dev.execute(aten.convolution.default, (img, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {})
    assert torch.allclose(conv, torch.nn.functional.conv2d(img, w, padding=1), atol=1e-5)
    # a 1-d convolution as a 2-d one of height 1, both ways
    seq, w1 = img[:, :, 0], w[:, :, 0]
    conv1 = dev.execute(aten.convolution.default, (seq, w1, None, [2], [1], [1], False, [0], 1), {})
    assert torch.allclose(conv1, torch.nn.functional.conv1d(seq, w1, stride=2, padding=1), atol=1e-5)
    grads = dev.execute(aten.convolution_backward.default, (conv1, seq, w1, [4], [2], [1], [1], False, [0], 1,
                                                            [True, True, True]), {})
    native = aten.convolution_backward.default(conv1, seq, w1, [4], [2], [1], [1], False, [0], 1, [True, True, True])
    assert all(g.shape == n.shape and torch.allclose(g, n, atol=1e-4) for g, n in zip(grads, native))
    with pytest.raises(DeviceOpError, match=r"1-d, 2-d and 3-d inputs only \(got input \(2, 3, 1, 1, 8, 8\)\)"):
        dev.execute(aten.convolution.default, (img[:, :, None, None], w[:, :, None, None], None, [1] * 4, [1] * 4,
                                               [1] * 4, False, [0] * 4, 1), {})


# (transposed, groups, stride, padding, dilation, output padding, spatial dims): strided, dilated and padded
# windows, output padding below the stride and (stride 1) below the dilation only, where the transposed
# convolution's output holds windows that the convolution it transposes has no input for
_CONV_CASES = [(False, 2, 2, 1, 1, 0, 2), (False, 4, 1, 1, 2, 0, 2), (False, 2, 2, 0, 1, 0, 1),
               (True, 1, 2, 1, 1, 1, 2), (True, 2, 1, 1, 2, 1, 2), (True, 2, 2, 0, 2, 1, 1),
               (True, 1, 1, 0, 1, 0, 1), (False, 2, 2, 1, 2, 0, 3), (True, 2, 1, 1, 2, 1, 3)]


@pytest.mark.parametrize("name", ["emu:splitk8-tree", "emu:splitk16-revseq", "emu:lanes8-butterfly"])
@pytest.mark.parametrize("case", _CONV_CASES)
def test_emulated_grouped_and_transposed_convolutions_and_their_gradients_are_torchs_in_another_order(
        name: str, case: tuple) -> None:
    transposed, groups, stride, padding, dilation, output_padding, nd = case
    gen = torch.Generator().manual_seed(1)
    cin, cout = 4, 8
    w = torch.randn(*((cin, cout // groups) if transposed else (cout, cin // groups)), *(3, 2, 2)[:nd], generator=gen,
                    dtype=torch.float64)
    x = torch.randn(2, cin, *(7, 6, 5)[:nd], generator=gen, dtype=torch.float64)
    bias = torch.randn(cout, dtype=torch.float64)
    geometry = ([stride] * nd, [padding] * nd, [dilation] * nd, transposed, [output_padding] * nd, groups)
    dev = get_device(name)
    got = dev.execute(aten.convolution.default, (x, w, bias, *geometry), {})
    want = aten.convolution.default(x, w, bias, *geometry)
    assert got.shape == want.shape and torch.allclose(got, want, rtol=0, atol=1e-12)
    g = torch.randn(want.shape, generator=gen, dtype=torch.float64)
    args = (g, x, w, [cout], *geometry, [True, True, True])
    grads = dev.execute(aten.convolution_backward.default, args, {})
    native = aten.convolution_backward.default(*args)
    assert all(a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=1e-12) for a, b in zip(grads, native))


def _bits(values: list[float]) -> list[int]:
    return [struct.unpack("<q", struct.pack("<d", v))[0] for v in values]


def _fixed_order_sums(lines: list[list[float]], lanes: int) -> float:
    """The CPU device's order for one kept element's lines (one per outer index), written out in Python floats
    (each + one IEEE float64 addition): value k of each line goes to lane k % lanes, each lane adds from 0.0 in
    order of line, then k, and the lanes combine by the halving tree (value k + n // 2 added to value k, an odd
    count's last moved down, until one is left)."""
    acc = [0.0] * lanes
    for line in lines:
        for k, v in enumerate(line):
            acc[k % lanes] += v
    while len(acc) > 1:
        h = len(acc) // 2
        acc = [acc[k] + acc[k + h] for k in range(h)] + acc[2 * h:]
    return acc[0]


@pytest.mark.parametrize("shape,dims", [((3, 5, 37), [2]), ((4, 6, 5, 7), [0, 2, 3]), ((3, 4, 10, 13), [0, 2, 3]),
                                        ((2, 3, 128), [0, 2]), ((6, 13), [0]), ((2, 3, 9), [0, 1]), ((5, 19), [0, 1]),
                                        ((2, 6, 70), [2]), ((17, 5, 3, 50), [0, 2, 3]), ((16, 40, 70), [0, 2])],
                         ids=["trailing", "batch-norm", "batch-norm-rows", "rows-exactly", "leading", "leading-2",
                              "all", "special", "many-images", "many-images-blocks"])
def test_cpu_float64_sums_follow_one_fixed_order(shape: tuple[int, ...], dims: list[int],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from vtrain import fused
    monkeypatch.setattr(fused, "BLOCK_SUM_ELEMENTS", 1)  # (lines of any size: these tensors are small)
    # magnitudes spread over 2^-40..2^40 with both signs, so that any other order gives other bits somewhere
    gen = torch.Generator().manual_seed(len(shape) * 7 + len(dims))
    x = torch.randn(*shape, generator=gen, dtype=torch.float64) * torch.exp2(
        torch.randint(-40, 40, shape, generator=gen).double())
    if shape == (2, 6, 70):  # -0 only (lanes start at +0); inf; inf and -inf in two lanes, then in one; NaN
        x[:, 0] = -0.0
        x[0, 1, 3] = x[0, 2, 5] = x[0, 3, 3] = math.inf
        x[0, 2, 6] = x[0, 3, 67] = -math.inf
        x[1, 4, 9] = math.nan
    cpu = get_device("cpu")
    got = cpu.execute(aten.sum.dim_IntList, (x, dims, True), {})
    kept = [d for d in range(x.dim()) if d not in dims]
    lines = x.permute(*kept, *dims).reshape(-1, math.prod(x.shape[d] for d in dims))
    if dims == list(range(len(dims))) and kept:  # reduced dims lead: a column's values, row after row, one add each
        want = [sum(col, 0.0) for col in lines.tolist()]  # (Python's sum adds left to right from 0.0)
        want_abs = [sum((abs(v) for v in col), 0.0) for col in lines.tolist()]
    else:  # lines of the innermost reduced block, one per outer index, in lanes (64 or the line's length)
        inner = math.prod(x.shape[d] for d in dims if d > max(kept, default=-1))
        outer = math.prod(x.shape[d] for d in dims if d < min(kept)) if kept else 1
        split = [[row[o * inner:(o + 1) * inner] for o in range(outer)] for row in lines.tolist()]
        lanes = min(inner, 64)  # (the device's sums are defined by 64 lanes: fused.SUM_LANES changes them)
        want = [_fixed_order_sums(rows, lanes) for rows in split]
        want_abs = [_fixed_order_sums([[abs(v) for v in r] for r in rows], lanes) for rows in split]
    assert got.shape == tuple(1 if d in dims else n for d, n in enumerate(shape))
    # bit for bit (a zero's sign and NaN included): the order is the code's
    assert _bits(got.reshape(-1).tolist()) == _bits(want)
    assert _bits(fused.take_abs_sums(got).tolist()) == _bits(want_abs)
    assert fused.take_abs_sums(got) is None  # handed out once
    torch.set_num_threads(2)
    try:
        assert _bits(cpu.execute(aten.sum.dim_IntList, (x, dims, True), {}).reshape(-1).tolist()) == _bits(
            got.reshape(-1).tolist())  # any thread count
    finally:
        torch.set_num_threads(1)


def test_cpu_means_divide_the_fixed_order_sum_and_other_tensors_keep_torch_s_kernels(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vtrain import fused
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(4, 8, 6, 6, generator=gen, dtype=torch.float64)
    cpu = get_device("cpu")
    # lines below fused.BLOCK_SUM_ELEMENTS values in all are torch's (in cache, its sum is the faster)
    assert torch.equal(cpu.execute(aten.sum.dim_IntList, (x, [0, 2, 3]), {}), torch.sum(x, [0, 2, 3]))
    assert fused.take_abs_sums(cpu.execute(aten.sum.dim_IntList, (x, [3]), {})) is None
    monkeypatch.setattr(fused, "BLOCK_SUM_ELEMENTS", 1)
    total = cpu.execute(aten.sum.dim_IntList, (x, [0, 2, 3]), {})
    mean = cpu.execute(aten.mean.dim, (x, [0, 2, 3]), {})
    assert mean.shape == (8,) and torch.equal(mean, total / 144)
    assert torch.equal(cpu.execute(aten.sum.default, (x,), {}).reshape(1), cpu.execute(
        aten.sum.dim_IntList, (x, [0, 1, 2, 3]), {}).reshape(1))
    for other in (x.float(), x.transpose(1, 2), x[:, :, :, :3]):  # float32, strided: torch's own
        assert torch.equal(cpu.execute(aten.sum.dim_IntList, (other, [0, 2, 3], True), {}),
                           torch.sum(other, [0, 2, 3], True))
    assert cpu.execute(aten.sum.dim_IntList, (x, [0], False), {"dtype": torch.float32}).dtype == torch.float32
    for bad in ([4], [-5], [1, 1], [0, -4]):  # torch's own errors for dims out of range or repeated
        with pytest.raises((IndexError, RuntimeError)):
            cpu.execute(aten.sum.dim_IntList, (x, bad, True), {})


def test_a_sum_s_error_bound_takes_the_device_s_sums_of_abs_and_bounds_the_exact_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from fractions import Fraction

    from vtrain import fused
    from vtrain.bounds import BOUNDS, gamma, unit_roundoff
    monkeypatch.setattr(fused, "BLOCK_SUM_ELEMENTS", 1)
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(16, 3, 12, 12, generator=gen, dtype=torch.float64) * 2.0**20
    out = get_device("cpu").execute(aten.sum.dim_IntList, (x, [0, 2, 3], True), {})
    held = fused._ABS_SUMS[1]
    (e,) = BOUNDS[aten.sum.dim_IntList]((x, [0, 2, 3], True), {}, [out])
    assert fused.take_abs_sums(out) is None and held is not None  # consumed by the bound
    n = 16 * 144
    for c in range(3):
        terms = [Fraction(v) for v in x[:, c].reshape(-1).tolist()]
        exact, absolute = sum(terms, Fraction(0)), sum((abs(t) for t in terms), Fraction(0))
        assert abs(Fraction(out.reshape(-1)[c].item()) - exact) <= Fraction(e.reshape(-1)[c].item())
        assert Fraction(e.reshape(-1)[c].item()) >= Fraction(gamma(n, unit_roundoff(torch.float64))) * absolute


@pytest.mark.filterwarnings("ignore:TF32 acceleration")  # (torch's, as its mkldnn flags are set)
@pytest.mark.parametrize("onednn", [True, False])
def test_cpu_float32_convolutions_stay_within_any_orders_bound_with_nnpack_off(onednn: bool) -> None:
    # The band's premise for the CPU device: |computed - exact| <= K 2^-24 sum|terms| (K terms a sum). oneDNN's
    # convolutions and torch's im2col ones (oneDNN off) hold it; NNPACK's Winograd ones, which torch takes with
    # oneDNN off, measured 1.9x it on this case: rounded execution turns NNPACK off (test_num_rounding.py).
    gen = torch.Generator().manual_seed(0)
    x = round_to_grid(torch.randn(32, 8, 8, 8, generator=gen), 19)
    w = round_to_grid(torch.randn(8, 8, 3, 3, generator=gen), 19)
    with torch.backends.mkldnn.flags(enabled=onednn), torch.backends.nnpack.flags(enabled=False):
        y = torch.nn.functional.conv2d(x, w, padding=1)
    exact = torch.nn.functional.conv2d(x.double(), w.double(), padding=1)
    terms = torch.nn.functional.conv2d(x.double().abs(), w.double().abs(), padding=1)
    assert ((y.double() - exact).abs() <= 72 * 2.0**-24 * terms).all()
