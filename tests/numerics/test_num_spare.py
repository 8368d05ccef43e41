"""vtrain.spare: a buffer is reused only when nothing else can see it, and never handed out twice."""

from __future__ import annotations

import pytest
import torch

from vtrain import spare


@pytest.fixture(autouse=True)
def empty_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spare, "_POOL", type(spare._POOL)())


def _big(n: int = spare.MIN_BYTES // 8) -> torch.Tensor:
    return torch.ones(n, dtype=torch.float64)


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_a_given_tensor_is_taken_once_by_its_dtype_and_size() -> None:
    t = _big()
    spare.give(t)
    like = torch.empty(2, t.numel() // 2, dtype=torch.float64)
    assert not _shares(spare.take(torch.empty(t.numel(), dtype=torch.float32)), t)  # another dtype
    got = spare.take(like)
    assert _shares(got, t) and got.shape == like.shape and got.is_contiguous()
    assert not _shares(spare.take(like), t)  # taken: gone from the pool


def test_shared_small_and_strided_tensors_are_not_kept() -> None:
    t = _big()
    view = t[: t.numel() // 2]
    spare.give(t)  # a view of it is alive: its owner could still read what the next op writes
    spare.give(view)  # a view of a larger storage
    spare.give(_big(100))  # below MIN_BYTES
    base = _big(2 * (spare.MIN_BYTES // 8)).view(2, -1)
    spare.give(base.t())  # not contiguous
    assert not spare._POOL
    del view
    spare.give(t)
    assert list(spare._POOL) == [(torch.float64, t.numel())]


def test_the_pool_keeps_the_latest_few() -> None:
    sizes = [spare.MIN_BYTES // 8 + i for i in range(spare.KEEP + 2)]
    for n in sizes:
        spare.give(_big(n))
    assert [n for _, n in spare._POOL] == sizes[-spare.KEEP:]


def test_sole_means_nothing_else_sees_the_memory() -> None:
    t = _big(100)  # (any size: rounding in place asks it of small outputs too)
    assert spare.sole(t)
    view = t[:50]
    assert not spare.sole(t) and not spare.sole(view)  # each sees the other's writes
    del view
    assert spare.sole(t)
    assert not spare.sole(_big(100).view(10, 10).t())  # not contiguous
    assert not spare.sole(_big(100)[10:])  # a view into a larger storage, its base gone
