"""Device profiles: real variations of the summation order, equally accurate, found by name."""

from __future__ import annotations

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
    with pytest.raises(DeviceOpError, match="groups"):
        dev.execute(aten.convolution.default, (img, w[:, :1], None, [1, 1], [1, 1], [1, 1], False, [0, 0], 3), {})
