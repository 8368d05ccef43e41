"""The per-step rounding log and its file format (DESIGN.md §1.3).

A StepLog holds, for every device-dependent op site of one training step in trace order, the site's
header (site index, op name, output shape) and entries:
- direction entries: sorted flat positions and one bit each, "up" = the trainer's grid value is the
  upper neighbour (toward +inf) of the rounding boundary nearest to the auditor's value;
- value entries (wide band, e.g. cancellation): sorted flat positions and the trainer's grid value as a
  residue: its index on the grid (vtrain.grid.grid_index) modulo 2^width, with a width per entry that
  tells apart every value the auditor's band admits (vtrain.valuecode). The auditor takes
  the value of its own legitimate range with that residue: ~2 bits a value instead of the value itself.

On disk a site's header is a 2-byte tag, a hash of its op name and shape: the auditor, who runs the same
trace, compares it with its own op's tag and so detects a trace mismatch at the first differing op (a
differing op escapes with probability 2^-16, and then the next one, or the step's leaf, catches it). Op
names and shapes spelled out cost ~150 bytes a step, more than a step's entries at bits = 32, where the
bound policy logs a handful of values. Only sites with entries are listed with their counts.

Byte format, version 3 (little endian):
    magic b"VTRL" | u8 version | u8 policy (0 bound, 1 tau) | u8 bits | u8 flags (1: body is zstd) |
    u32 crc32 of what follows | varints: sites, listed sites, direction entries, value entries | body
    body = u16 tag per site | u8 width per value entry | varints (per listed site: site index minus the
           previous listed one's, n_dir, n_val; then every listed site's direction positions as deltas;
           then every listed site's value positions as deltas) | direction bits (np.packbits, all sites) |
           residues (each value entry's `width` bits, least significant first, in one little-endian bit
           stream padded with zero bits to a byte)
The body is compressed only where that makes it smaller (a step's log with few entries is not).
Positions are strictly increasing within a site; the first delta is the position itself. The file's
keccak-256 (`content_hash`) is committed in the step's leaf; the crc only gives a clear error for a file
damaged on its own.

`dense_ternary_size` is the paper's encoding (one trit per rounded value, 5 trits a byte), the storage
baseline the benchmarks compare against.
"""

from __future__ import annotations

import functools
import hashlib
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np
import sha3
import zstandard
from numba import njit

from vtrain import valuecode
from vtrain.errors import VtrainError

MAGIC = b"VTRL"
VERSION = 3
POLICIES = ("bound", "tau")
_HEADER = struct.Struct("<4sBBBBI")
_ZSTD = 1  # flags bit: the body is zstd-compressed
_MAGIC_V1 = b"VTRLOG\x00\x01"  # version 1 (op names and shapes spelled out), which shares "VTRL"
_MAX_VARINT_BYTES = 10


class CorruptLogError(VtrainError):
    """Rounding-log bytes that do not parse (truncated, corrupt, wrong format)."""

    def __init__(self, source: str, what: str):
        self.source = source
        super().__init__(
            f"rounding log {source} is corrupt or truncated ({what}); fetch it again from the trainer's run "
            "directory (its keccak-256 is committed in the step's leaf) or re-run that step"
        )


@functools.lru_cache(maxsize=4096)
def site_tag(op: str, shape: tuple[int, ...]) -> int:
    """The 2-byte tag of an op site: a hash of its op name and output shape."""
    return int.from_bytes(hashlib.blake2b(f"{op} {list(shape)}".encode(), digest_size=2).digest(), "little")


def _empty(dtype: type) -> np.ndarray:
    a = np.zeros(0, dtype)
    a.flags.writeable = False
    return a


# A site without entries (most of them) shares these: five fresh arrays cost ~2.5 of the ~4 us a site took,
# paid at every device op of every step (~2 % of a small example's trainer step)
_NO_POSITIONS, _NO_BITS, _NO_WIDTHS = _empty(np.int64), _empty(np.bool_), _empty(np.uint8)


@dataclass
class SiteLog:
    """The log of one op site (one floating output of one device-dependent op call).

    A site read back from bytes knows its tag but not its op name and shape (None)."""

    site: int
    op: str | None
    shape: tuple[int, ...] | None
    dir_pos: np.ndarray = field(default_factory=lambda: _NO_POSITIONS)
    dir_up: np.ndarray = field(default_factory=lambda: _NO_BITS)
    val_pos: np.ndarray = field(default_factory=lambda: _NO_POSITIONS)
    val_res: np.ndarray = field(default_factory=lambda: _NO_POSITIONS)
    val_bits: np.ndarray = field(default_factory=lambda: _NO_WIDTHS)
    tag: int = -1

    def __post_init__(self) -> None:
        if self.op is not None:
            self.tag = site_tag(self.op, tuple(self.shape))

    @property
    def num_entries(self) -> int:
        return int(self.dir_pos.size + self.val_pos.size)

    def describe(self) -> str:
        if self.op is None:
            return f"an op with site tag {self.tag:#06x}"
        return f"{self.op} {list(self.shape)}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SiteLog) and (self.site, self.tag) == (other.site, other.tag) \
            and all(np.array_equal(a, b) for a, b in zip(self._arrays(), other._arrays()))

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return self.dir_pos, self.dir_up, self.val_pos, self.val_res, self.val_bits


class StepLog:
    """The sparse rounding log of one training step."""

    def __init__(self, sites: list[SiteLog] | None = None, policy: str = "bound", bits: int = 32):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.sites: list[SiteLog] = list(sites or [])
        self.policy = policy
        self.bits = bits

    @staticmethod
    def empty() -> StepLog:
        return StepLog()

    def num_entries(self) -> int:
        return sum(s.num_entries for s in self.sites)

    def num_values(self) -> int:
        return sum(int(s.val_pos.size) for s in self.sites)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StepLog) and self.to_bytes() == other.to_bytes()

    def __repr__(self) -> str:
        return f"StepLog(sites={len(self.sites)}, entries={self.num_entries()}, values={self.num_values()})"

    # -- encoding -----------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        listed, heads, prev = [], [], -1
        for i, s in enumerate(self.sites):  # (a site is its place in the list, as its tag's)
            if s.dir_pos.size or s.val_pos.size:
                listed.append(s)
                heads += [i - prev - 1, s.dir_pos.size, s.val_pos.size]
                prev = i
        widths = varints = bits = residues = b""  # (most steps log nothing: then all four are empty)
        if listed:
            varints = _varint_encode(np.concatenate([np.asarray(heads, np.uint64),
                                                     _deltas([s.dir_pos for s in listed]),
                                                     _deltas([s.val_pos for s in listed])]))
            bits = np.packbits(np.concatenate([s.dir_up for s in listed]).astype(bool)).tobytes()
            w = np.concatenate([s.val_bits for s in listed]).astype(np.uint8)
            widths, residues = w.tobytes(), valuecode.pack(np.concatenate([s.val_res for s in listed]), w, self.bits)
        tags = np.fromiter((s.tag for s in self.sites), np.uint16, len(self.sites)).astype("<u2")
        body = b"".join([tags.tobytes(), widths, varints, bits, residues])
        flags = 0
        if len(body) > 64:
            packed = zstandard.ZstdCompressor(level=3, write_checksum=False, write_content_size=True).compress(body)
            if len(packed) < len(body):
                body, flags = packed, _ZSTD
        n_dir, n_val = sum(heads[1::3]), sum(heads[2::3])
        rest = _varint_encode(np.array([len(self.sites), len(listed), n_dir, n_val], np.uint64)) + body
        return _HEADER.pack(MAGIC, VERSION, POLICIES.index(self.policy), self.bits, flags, zlib.crc32(rest)) + rest

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<memory>") -> StepLog:
        if len(data) < _HEADER.size:
            raise CorruptLogError(source, f"{len(data)} bytes, shorter than the {_HEADER.size}-byte header")
        magic, version, policy, bits, flags, crc = _HEADER.unpack_from(data)
        if data.startswith(_MAGIC_V1):
            raise CorruptLogError(source, f"format version 1, this vtrain reads version {VERSION}: re-run the "
                                          "training with this vtrain, or audit with the vtrain that wrote it")
        if magic != MAGIC:
            raise CorruptLogError(source, "bad magic: not a vtrain rounding log")
        if version != VERSION:
            raise CorruptLogError(source, f"format version {version}, this vtrain reads version {VERSION}: re-run "
                                          "the training with this vtrain, or audit with the vtrain that wrote it")
        if policy >= len(POLICIES) or not 10 <= bits <= 32 or flags & ~_ZSTD:
            raise CorruptLogError(source, f"bad header fields (policy {policy}, bits {bits}, flags {flags})")
        rest = data[_HEADER.size:]
        if zlib.crc32(rest) != crc:
            raise CorruptLogError(source, "checksum mismatch")
        try:
            counts, off = _varint_prefix(rest, 4)
            body = rest[off:]
            if flags & _ZSTD:
                body = zstandard.ZstdDecompressor().decompress(body)
            sites = _decode_body(body, *(int(c) for c in counts), bits)
        except zstandard.ZstdError as exc:
            raise CorruptLogError(source, f"compressed body does not decode: {exc}") from None
        except (struct.error, ValueError, IndexError, OverflowError) as exc:  # (Overflow: absurd counts)
            raise CorruptLogError(source, str(exc)) from None
        return cls(sites, POLICIES[policy], bits)

    def content_hash(self) -> bytes:
        """keccak-256 of to_bytes() (32 bytes), committed in the step's leaf."""
        return sha3.keccak_256(self.to_bytes()).digest()


def _varint_prefix(buf: bytes, count: int) -> tuple[np.ndarray, int]:
    """The first `count` varints of buf and the offset after them."""
    ends = np.flatnonzero(np.frombuffer(buf[:count * _MAX_VARINT_BYTES], np.uint8) < 0x80)
    if ends.size < count:
        raise ValueError("truncated counts")
    end = int(ends[count - 1]) + 1
    return _varint_decode(buf[:end], count), end


def _decode_body(body: bytes, n_sites: int, n_listed: int, n_dir: int, n_val: int, grid_bits: int) -> list[SiteLog]:
    if n_listed > n_sites:
        raise ValueError(f"{n_listed} sites with entries of {n_sites}")
    if not (n_listed or n_dir or n_val) and len(body) == 2 * n_sites:  # (most steps log nothing: tags alone)
        return [SiteLog(i, None, None, tag=t) for i, t in enumerate(np.frombuffer(body, "<u2").tolist())]
    tags = np.frombuffer(body, "<u2", n_sites).astype(np.int64)
    off = 2 * n_sites
    widths = np.frombuffer(body, np.uint8, n_val, off)
    if (widths > grid_bits).any():
        raise ValueError(f"a value entry {int(widths.max())} bits wide on the {grid_bits}-bit grid")
    off += n_val
    n_bits = (n_dir + 7) // 8
    n_residue_bytes = (int(widths.sum()) + 7) // 8
    n_varint_bytes = len(body) - off - n_bits - n_residue_bytes
    if n_varint_bytes < 0:
        raise ValueError("body shorter than its entry counts")
    ints = _varint_decode(body[off : off + n_varint_bytes], 3 * n_listed + n_dir + n_val)
    off += n_varint_bytes
    heads = ints[: 3 * n_listed].astype(np.int64).reshape(-1, 3)
    if heads[:, 1].sum() != n_dir or heads[:, 2].sum() != n_val or ((heads[:, 1] + heads[:, 2]) == 0).any():
        raise ValueError("entry counts do not match the header")
    listed = np.cumsum(heads[:, 0] + 1) - 1
    if listed.size and listed[-1] >= n_sites:
        raise ValueError(f"a listed site index {int(listed[-1])} beyond the {n_sites} sites")
    bits = np.unpackbits(np.frombuffer(body, np.uint8, n_bits, off))[:n_dir].astype(bool)
    residues = valuecode.unpack(body[off + n_bits:], widths)
    sites = [SiteLog(i, None, None, tag=int(t)) for i, t in enumerate(tags)]
    d_off, v_off, b_off, val_off = 3 * n_listed, 3 * n_listed + n_dir, 0, 0
    for site, (_, nd, nv) in zip(listed.tolist(), heads.tolist()):
        s = sites[site]
        s.dir_pos, s.dir_up = _undelta(ints[d_off : d_off + nd], site), bits[b_off : b_off + nd].copy()
        s.val_pos = _undelta(ints[v_off : v_off + nv], site)
        s.val_res, s.val_bits = residues[val_off : val_off + nv].copy(), widths[val_off : val_off + nv].copy()
        d_off, v_off, b_off, val_off = d_off + nd, v_off + nv, b_off + nd, val_off + nv
    return sites


def _deltas(positions: list[np.ndarray]) -> np.ndarray:
    """Each site's positions as differences from the previous one (the first from 0), all sites in a row.

    One pass over the concatenation instead of one np.diff per site: most sites log nothing, and a
    step has dozens of them.
    """
    sizes = np.fromiter((p.size for p in positions), np.int64, len(positions))
    flat = np.concatenate(positions).astype(np.int64) if sizes.sum() else np.zeros(0, np.int64)
    out = np.empty_like(flat)
    if flat.size:
        out[1:] = flat[1:] - flat[:-1]
        firsts = (np.cumsum(sizes) - sizes)[sizes > 0]  # where each non-empty site starts
        out[firsts] = flat[firsts]
    return out.astype(np.uint64)


def _undelta(d: np.ndarray, site: int) -> np.ndarray:
    """Positions from their deltas. (Whether they lie inside the site's output only the replaying auditor,
    who has the output, can tell.)"""
    if d.size and (d[1:] == 0).any():
        raise ValueError(f"site {site}: positions not strictly increasing")
    pos = np.cumsum(d.astype(np.uint64))
    if pos.size and (pos[-1] >= np.uint64(1 << 63) or (pos[1:] <= pos[:-1]).any()):  # (a wrapped sum)
        raise ValueError(f"site {site}: a position beyond any tensor")
    return pos.astype(np.int64)


def _varint_encode(a: np.ndarray) -> bytes:
    """LEB128 varints of a uint64 array, in one compiled pass (`_leb128`): as quick as a Python loop over a step
    header's four values, ~2 ns a value over a scale model's ~100K entries (numpy, a pass per byte group, took
    ~45 ns a value there, 5 ms of the GPT-2 scale model's trainer step)."""
    a = a.astype(np.uint64)
    out = np.empty(a.size * _MAX_VARINT_BYTES, np.uint8)
    return out[:_leb128(a, out)].tobytes()


_LOW7, _MORE, _SEVEN = np.uint64(0x7F), np.uint64(0x80), np.uint64(7)  # (uint64 constants: mixed with int64,
# numba would compare and shift uint64 values as floats)


@njit(cache=True, nogil=True)
def _leb128(a: np.ndarray, out: np.ndarray) -> int:
    """a's LEB128 varints written to out (room for 10 bytes a value); returns the bytes written."""
    n = 0
    for v in a:
        while v >= _MORE:
            out[n] = (v & _LOW7) | _MORE
            n += 1
            v >>= _SEVEN
        out[n] = v
        n += 1
    return n


def _varint_decode(buf: bytes, count: int) -> np.ndarray:
    """`count` LEB128 varints from buf, all of it (`_leb128_decode`); ValueError where buf holds another number
    of them, ends inside one, or holds one longer than 64 bits."""
    b = np.frombuffer(buf, np.uint8)
    if count == 0:
        if b.size:
            raise ValueError("trailing varint bytes")
        return np.zeros(0, np.uint64)
    out = np.empty(min(count, b.size), np.uint64)  # (an absurd count is refused below, not allocated)
    ends, longest = _leb128_decode(b, out)
    if ends != count or b[-1] >= 0x80:  # (count > 0: b is not empty)
        raise ValueError(f"{ends} varints where {count} were announced")
    if longest > _MAX_VARINT_BYTES:
        raise ValueError("varint longer than 64 bits")
    return out


@njit(cache=True, nogil=True)
def _leb128_decode(b: np.ndarray, out: np.ndarray) -> tuple[int, int]:
    """The LEB128 varints of bytes b into out, as many as it holds: (how many b ends, the longest in bytes). Bits
    past the 64th are dropped, as uint64 arithmetic wraps (the caller refuses a varint of over 10 bytes)."""
    ends, longest, run, v = 0, 0, 0, np.uint64(0)
    for x in b:
        if run < _MAX_VARINT_BYTES:  # (a shift by 64 or more is undefined in LLVM)
            v |= (np.uint64(x) & _LOW7) << np.uint64(7 * run)
        run += 1
        if x < 0x80:
            if ends < out.size:
                out[ends] = v
            ends += 1
            longest = max(longest, run)
            run, v = 0, np.uint64(0)
    return ends, longest


def dense_ternary_size(total_values: int, offsets: list[int], log: StepLog) -> tuple[int, int]:
    """(dense bytes, dense + zip bytes) of the paper's encoding for one step.

    One trit per rounded value of the step (0 = not logged, 1 = rounded up, 2 = rounded down; a value
    entry counts as logged, code 1), 5 trits a byte. `offsets[i]` is where site i's values start in the
    step's stream of `total_values` rounded values.
    """
    codes = np.zeros(total_values, np.uint8)
    for s, base in zip(log.sites, offsets):
        codes[base + s.dir_pos] = np.where(s.dir_up, 1, 2)
        codes[base + s.val_pos] = 1
    pad = (-codes.size) % 5
    groups = np.concatenate([codes, np.zeros(pad, np.uint8)]).reshape(-1, 5).astype(np.uint16)
    dense = (groups * np.array([1, 3, 9, 27, 81], np.uint16)).sum(1).astype(np.uint8).tobytes()
    return len(dense), len(zlib.compress(dense, 6))
