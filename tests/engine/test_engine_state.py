"""Canonical state bytes, state/leaf/batch hashes, and readers that refuse corrupt files."""

from __future__ import annotations

import struct

import pytest
import torch
from eth_hash.auto import keccak

from vtrain.leaves import LeafRecord, batch_hash, leaf_hash
from vtrain.state import CorruptStateError, StateError, decode_state, encode_state, state_hash


def _tensors():
    return {
        "model/w": torch.tensor([[1.0, -0.5], [0.25, 3.0]], dtype=torch.float64),
        "model/b": torch.tensor([2.0**-149, -(2.0**127)], dtype=torch.float64),   # subnormal and huge
        "optim/w/step": torch.tensor(3.0, dtype=torch.float32),
    }


def test_round_trip_and_layout():
    data = encode_state(7, _tensors())
    assert data[:8] == b"VTSTATE\0"
    assert struct.unpack_from(">HQI", data, 8) == (1, 7, 3)
    step, back = decode_state(data)
    assert step == 7 and sorted(back) == sorted(_tensors())
    for k, v in _tensors().items():
        assert back[k].dtype == v.dtype and torch.equal(back[k], v)
    assert encode_state(7, back) == data
    assert state_hash(data) == keccak(data)


def test_entries_are_sorted_so_insertion_order_does_not_matter():
    t = _tensors()
    assert encode_state(1, dict(reversed(list(t.items())))) == encode_state(1, t)


def test_float32_and_float64_work_store_the_same_fp32_values():
    t64 = {"model/w": torch.tensor([0.1], dtype=torch.float32).double()}
    t32 = {"model/w": torch.tensor([0.1], dtype=torch.float32)}
    a, b = encode_state(1, t64), encode_state(1, t32)
    assert a[-4:] == b[-4:] == struct.pack("<f", 0.1) and a != b   # only the dtype code differs


def test_off_grid_or_non_finite_is_refused():
    with pytest.raises(StateError, match="model/w"):
        encode_state(1, {"model/w": torch.tensor([0.1], dtype=torch.float64)})
    with pytest.raises(StateError, match="model/w"):
        encode_state(1, {"model/w": torch.tensor([float("nan")], dtype=torch.float64)})


@pytest.mark.parametrize("mutate, why", [
    (lambda d: d[:10], "truncated"),
    (lambda d: d[:-1], "truncated"),
    (lambda d: d + b"\0", "trailing"),
    (lambda d: b"XX" + d[2:], "magic"),
    (lambda d: d[:8] + b"\0\x09" + d[10:], "version"),
])
def test_corrupt_state_files_are_named(mutate, why):
    with pytest.raises(CorruptStateError) as exc:
        decode_state(mutate(encode_state(7, _tensors())), "run/states/000007.vst")
    assert "run/states/000007.vst" in str(exc.value) and why in str(exc.value)


def test_leaf_and_batch_hash_known_layout():
    s, lg = bytes(range(32)), bytes(range(32, 64))
    b = batch_hash([3, 1, 2])
    assert b == keccak(b"vtrain.batch.v1" + b"".join(i.to_bytes(8, "big") for i in (3, 1, 2)))
    assert leaf_hash(5, s, lg, b) == keccak(b"vtrain.leaf.v1" + (5).to_bytes(8, "big") + s + lg + b)
    assert LeafRecord(5, s, lg, b).leaf == leaf_hash(5, s, lg, b)
    assert leaf_hash(6, s, lg, b) != leaf_hash(5, s, lg, b)
    assert batch_hash([1, 2, 3]) != b
