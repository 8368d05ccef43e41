"""StepLog byte format: exact round trip, content hash, and named errors for corrupt or truncated bytes."""

from __future__ import annotations

import numpy as np
import pytest
import sha3

from vtrain.roundlog import CorruptLogError, SiteLog, StepLog, dense_ternary_size


def _log() -> StepLog:
    gen = np.random.default_rng(3)
    sites = []
    for i, shape in enumerate([(32, 10), (3,), (), (5000, 7000), (2, 3, 4)]):
        n = int(np.prod(shape)) if shape else 1
        pos = np.sort(gen.choice(n, size=min(n, 50), replace=False)).astype(np.int64)
        split = len(pos) // 3
        val_pos, dir_pos = np.sort(pos[:split]), np.sort(pos[split:])
        sites.append(SiteLog(i, f"aten.op{i % 2}.default", shape, dir_pos, gen.random(dir_pos.size) < 0.5,
                             val_pos, gen.standard_normal(val_pos.size).astype(np.float32)))
    sites.append(SiteLog(len(sites), "aten.mm.default", (4, 4)))  # a site with no entries keeps its header
    sites.append(SiteLog(len(sites), "aten.mm.default", (2**40,), np.array([0, 2**40 - 1]), np.array([True, False])))
    return StepLog(sites, "bound", 19)


def test_round_trip_is_exact_and_hash_is_keccak_of_bytes() -> None:
    log = _log()
    data = log.to_bytes()
    back = StepLog.from_bytes(data, "x.vlog")
    assert back.sites == log.sites and back.policy == "bound" and back.bits == 19
    assert back.to_bytes() == data
    assert log.content_hash() == sha3.keccak_256(data).digest() and len(log.content_hash()) == 32
    assert log.num_entries() == sum(s.num_entries for s in log.sites)
    empty = StepLog.empty()
    assert StepLog.from_bytes(empty.to_bytes()).sites == [] and empty.num_entries() == 0
    assert empty.content_hash() != log.content_hash()


def test_corrupt_and_truncated_bytes_name_the_source() -> None:
    data = _log().to_bytes()
    bad_inputs = {
        "truncated header": data[:10],
        "truncated body": data[:-5],
        "bad magic": b"XXXXXXXX" + data[8:],
        "flipped body byte": data[:60] + bytes([data[60] ^ 0xFF]) + data[61:],
        "trailing bytes": data + b"\x00",
        "wrong version": data[:8] + b"\x09\x00" + data[10:],
    }
    for what, blob in bad_inputs.items():
        with pytest.raises(CorruptLogError, match="runs/a/logs/000007.vlog") as err:
            StepLog.from_bytes(blob, "runs/a/logs/000007.vlog")
        assert "fetch it again" in str(err.value), what


def test_dense_ternary_baseline() -> None:
    log = StepLog([SiteLog(0, "aten.mm.default", (10,), np.array([1, 4]), np.array([True, False]),
                           np.array([7]), np.array([1.5], np.float32))])
    dense, dense_zip = dense_ternary_size(13, [3], log)
    assert dense == 3  # ceil(13 / 5)
    assert dense_zip > 0
