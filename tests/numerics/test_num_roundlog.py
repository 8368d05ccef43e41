"""StepLog byte format: exact round trip, content hash, and named errors for corrupt or truncated bytes."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
import sha3

from vtrain.roundlog import VERSION, CorruptLogError, SiteLog, StepLog, _varint_encode, dense_ternary_size, site_tag


def _log() -> StepLog:
    gen = np.random.default_rng(3)
    sites = []
    for i, shape in enumerate([(32, 10), (3,), (), (5000, 7000), (2, 3, 4)]):
        n = int(np.prod(shape)) if shape else 1
        pos = np.sort(gen.choice(n, size=min(n, 50), replace=False)).astype(np.int64)
        split = len(pos) // 3
        val_pos, dir_pos = np.sort(pos[:split]), np.sort(pos[split:])
        widths = gen.integers(0, 20, val_pos.size).astype(np.uint8)
        residues = gen.integers(0, 2**19, val_pos.size) % (1 << widths.astype(np.int64))
        sites.append(SiteLog(i, f"aten.op{i % 2}.default", shape, dir_pos, gen.random(dir_pos.size) < 0.5,
                             val_pos, residues, widths))
    sites.append(SiteLog(len(sites), "aten.mm.default", (4, 4)))  # a site with no entries keeps its header
    sites.append(SiteLog(len(sites), "aten.mm.default", (2**40,), np.array([0, 2**40 - 1]), np.array([True, False])))
    return StepLog(sites, "bound", 19)


def test_round_trip_is_exact_and_hash_is_keccak_of_bytes() -> None:
    log = _log()
    data = log.to_bytes()
    back = StepLog.from_bytes(data, "x.vlog")
    assert back.sites == log.sites and back.policy == "bound" and back.bits == 19
    # on disk a site keeps its tag, not its op name and shape
    assert [s.tag for s in back.sites] == [site_tag(s.op, s.shape) for s in log.sites]
    assert all(s.op is None and s.shape is None for s in back.sites)
    assert back.sites[5].num_entries == 0 and back.sites[6].dir_pos.tolist() == [0, 2**40 - 1]
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
        "bad magic": b"XXXX" + data[4:],
        "flipped body byte": data[:60] + bytes([data[60] ^ 0xFF]) + data[61:],
        "trailing bytes": data + b"\x00",
        "wrong version": data[:4] + b"\x09" + data[5:],
        "bad flags": data[:7] + b"\x80" + data[8:],
        "version 1": b"VTRLOG\x00\x01" + b"\x01\x00" + data[10:],
    }
    for what, blob in bad_inputs.items():
        with pytest.raises(CorruptLogError, match="runs/a/logs/000007.vlog") as err:
            StepLog.from_bytes(blob, "runs/a/logs/000007.vlog")
        assert "fetch it again" in str(err.value), what


def _framed(policy: int, bits: int, rest: bytes) -> bytes:
    """Bytes with a valid header and checksum around `rest` (counts and body), to reach the body's checks."""
    return struct.pack("<4sBBBBI", b"VTRL", VERSION, policy, bits, 0, zlib.crc32(rest)) + rest


def test_well_framed_but_inconsistent_bodies_are_named() -> None:
    one_site = StepLog([SiteLog(0, "aten.mm.default", (10,), np.array([1, 4]), np.array([True, False]))])
    rest = one_site.to_bytes()[12:]
    bad_inputs = {
        "more listed sites than sites": _framed(0, 32, bytes([1, 2, 2, 0]) + rest[4:]),
        "counts past the body": _framed(0, 32, bytes([1, 1, 9, 0]) + rest[4:]),
        "repeated position": _framed(0, 32, rest[:9] + bytes([1, 0]) + rest[11:]),
        "truncated counts": _framed(0, 32, bytes([0x80])),
        # counts past any buffer: numpy's own reads would overflow, not just run short
        "absurd value count": _framed(0, 19, _varint_encode(np.array([1, 1, 0, 2**63], np.uint64)) + bytes(16)),
        "absurd site count": _framed(0, 19, _varint_encode(np.array([2**63, 0, 0, 0], np.uint64)) + bytes(16)),
    }
    for what, blob in bad_inputs.items():
        with pytest.raises(CorruptLogError, match="s.vlog"):
            StepLog.from_bytes(blob, "s.vlog")


def test_sites_without_entries_cost_their_tag_only_and_large_bodies_compress() -> None:
    quiet = StepLog([SiteLog(i, "aten.mm.default", (32, 10)) for i in range(8)])
    assert len(quiet.to_bytes()) == 12 + 4 + 2 * 8  # header, counts, one tag a site
    busy = StepLog([SiteLog(0, "aten.mm.default", (10**6,), np.arange(0, 10**6, 97), np.arange(0, 10**6, 97) % 3 == 0)])
    data = busy.to_bytes()
    assert data[7] == 1 and len(data) < busy.sites[0].dir_pos.size  # zstd: under a byte an entry
    assert StepLog.from_bytes(data).sites == busy.sites
    assert StepLog.from_bytes(quiet.to_bytes()).sites == quiet.sites


def _leb128(values: list[int]) -> bytes:
    out = bytearray()
    for v in values:
        while v >= 0x80:
            out.append(v & 0x7F | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def _leb128_values(buf: bytes, count: int) -> list[int] | str:
    """The reference decoding: `count` varints filling buf, none over 10 bytes (the 10th byte's bits past the
    64th dropped, as uint64 wraps), else "refused"."""
    values, v, run = [], 0, 0
    for byte in buf:
        v |= (byte & 0x7F) << (7 * run)
        run += 1
        if run > 10:
            return "refused"
        if byte < 0x80:
            values.append(v & (2**64 - 1))
            v, run = 0, 0
    return values if len(values) == count and not run else "refused"


def test_varints_code_as_leb128_and_malformed_runs_are_refused() -> None:
    # The compiled varint coders (a step's counts, its positions' deltas): LEB128's bytes and values, for runs of
    # a few values as a step's header holds and of thousands as a scale model's step; a run that is truncated,
    # has bytes to spare, holds another number of values or one over 10 bytes is refused
    from vtrain import roundlog
    gen = np.random.default_rng(7)
    cases = [(b"", 0), (b"", 1), (b"\x00", 0), (b"\x80", 1), (b"\x7f\x00", 1), (b"\xff" * 9 + b"\x01", 1),
             (b"\xff" * 10 + b"\x01", 1), (b"\xff" * 9 + b"\x7f", 1)]  # trailing, truncated, 11 bytes, > 2^64
    for _ in range(3000):
        k = int(gen.choice([gen.integers(0, 8), gen.integers(8, 2000)], p=[0.9, 0.1]))
        values = gen.integers(0, 2**63, k, dtype=np.uint64) >> gen.integers(0, 64, k).astype(np.uint64)
        if k and gen.random() < 0.1:
            values[0] = np.uint64(2**64 - 1)
        data = _varint_encode(values)
        assert data == _leb128(values.tolist())
        buf = bytearray(data)
        if buf and gen.random() < 0.5:  # a damaged byte: a value split, merged or grown
            buf[int(gen.integers(len(buf)))] = int(gen.choice([0x00, 0x7F, 0x80, 0xFF]))
        cases.append((bytes(buf), k + int(gen.choice([0, 0, 0, -1, 1])) if k else k))
    outcomes = []
    for buf, count in cases:
        try:
            got = roundlog._varint_decode(buf, count).tolist()
        except ValueError:
            got = "refused"
        assert got == _leb128_values(buf, count), (buf[:40], count)
        outcomes.append(got)
    assert sum(got == "refused" for got in outcomes) > 500  # (the malformed ones were refused)
    assert outcomes[5] == outcomes[7] == [2**64 - 1]  # (the top byte wraps as uint64 does)
    with pytest.raises(ValueError, match="1 varints where 1099511627776 were announced"):
        roundlog._varint_decode(b"\x00", 2**40)  # (an absurd count, as a corrupt header has it: refused, not allocated)


def test_a_quiet_step_decodes_by_its_tags_and_a_body_of_another_length_is_refused() -> None:
    quiet = StepLog([SiteLog(i, "aten.mm.default", (32, i + 1)) for i in range(5)])
    data = quiet.to_bytes()
    back = StepLog.from_bytes(data)
    assert back.sites == quiet.sites and back.to_bytes() == data
    rest = data[12:]
    for blob in (_framed(0, 32, rest + b"\x00"), _framed(0, 32, rest[:-1]), _framed(0, 32, b"\x06" + rest[1:])):
        with pytest.raises(CorruptLogError, match="q.vlog"):
            StepLog.from_bytes(blob, "q.vlog")


@pytest.mark.parametrize("bits", [10, 19, 32])
def test_value_entries_take_their_width_in_bits(bits: int) -> None:
    widths = np.array([0, 1, 2, 7, 8, 9, bits, 4], np.uint8)
    residues = np.array([0, 1, 2, 127, 0, 300, 2**bits - 1, 5])
    log = StepLog([SiteLog(0, "aten.mm.default", (100,), val_pos=np.arange(widths.size) * 3, val_res=residues,
                           val_bits=widths)], bits=bits)
    data = log.to_bytes()
    back = StepLog.from_bytes(data).sites[0]
    assert back.val_res.tolist() == residues.tolist() and back.val_bits.tolist() == widths.tolist()
    stream = (int(widths.sum()) + 7) // 8
    # header, counts, tag, a width byte an entry, the site's head, the gaps, the residues' bit stream
    assert len(data) == 12 + 4 + 2 + widths.size + 3 + widths.size + stream
    for res, width in [(2, 1), (-1, 3), (0, bits + 1)]:
        with pytest.raises(ValueError, match="does not fit its width"):
            StepLog([SiteLog(0, "aten.mm.default", (4,), val_pos=np.array([1]), val_res=np.array([res]),
                             val_bits=np.array([width], np.uint8))], bits=bits).to_bytes()
    rest = data[12:]
    wide = rest[:6] + bytes([bits + 1]) + rest[7:]  # the first width byte, past the counts and the tag
    padded = rest[:-1] + bytes([rest[-1] | 0x80])  # (the stream's last byte has unused high bits)
    assert (widths.sum() % 8) != 0
    for what, blob in {"wider than the grid": wide, "padding": padded}.items():
        with pytest.raises(CorruptLogError, match="v.vlog"):
            StepLog.from_bytes(_framed(0, bits, blob), "v.vlog")


def test_dense_ternary_baseline() -> None:
    log = StepLog([SiteLog(0, "aten.mm.default", (10,), np.array([1, 4]), np.array([True, False]),
                           np.array([7]), np.array([5]), np.array([3], np.uint8))])
    dense, dense_zip = dense_ternary_size(13, [3], log)
    assert dense == 3  # ceil(13 / 5)
    assert dense_zip > 0
