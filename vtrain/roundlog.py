"""The per-step rounding log and its file format (DESIGN.md §1.3).

A StepLog holds, for every device-dependent op site of one training step in trace order, a header
(site index, op name, output shape) and the site's entries:
- direction entries: sorted flat positions and one bit each, "up" = the trainer's grid value is the
  upper neighbour (toward +inf) of the rounding boundary nearest to the auditor's value;
- value entries (wide band, e.g. cancellation): sorted flat positions and the trainer's grid value itself,
  stored as FP32 (every grid value with bits <= 32 is FP32-representable).

Byte format, version 1 (little endian):
    magic b"VTRLOG\\x00\\x01" | u16 version | u8 policy (0 bound, 1 tau) | u8 bits |
    u32 sites | u64 direction entries | u64 value entries | u64 body bytes | zstd(body, with checksum)
    body = u32 op-table bytes | op names joined by "\\n" | u64 varint count | u64 varint bytes |
           varints (per site: op index, ndim, dims, n_dir, n_val; then every site's direction positions
           as deltas; then every site's value positions as deltas) | direction bits (np.packbits, all sites)
           | values (float32)
Positions are strictly increasing within a site; the first delta is the position itself.

`dense_ternary_size` is the paper's encoding (one trit per rounded value, 5 trits a byte), the storage
baseline the benchmarks compare against.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import numpy as np
import sha3
import zstandard

from vtrain.errors import VtrainError

MAGIC = b"VTRLOG\x00\x01"
VERSION = 1
POLICIES = ("bound", "tau")
_HEADER = struct.Struct("<8sHBBIQQQ")
_MAX_VARINT_BYTES = 10


class CorruptLogError(VtrainError):
    """Rounding-log bytes that do not parse (truncated, corrupt, wrong format)."""

    def __init__(self, source: str, what: str):
        self.source = source
        super().__init__(
            f"rounding log {source} is corrupt or truncated ({what}); fetch it again from the trainer's run "
            "directory (its keccak-256 is committed in the step's leaf) or re-run that step"
        )


@dataclass
class SiteLog:
    """The log of one op site (one floating output of one device-dependent op call)."""

    site: int
    op: str
    shape: tuple[int, ...]
    dir_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    dir_up: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    val_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    val: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))

    @property
    def num_entries(self) -> int:
        return int(self.dir_pos.size + self.val_pos.size)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SiteLog) and (self.site, self.op, self.shape) == (other.site, other.op, other.shape) \
            and all(np.array_equal(a, b) for a, b in zip(self._arrays(), other._arrays()))

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return self.dir_pos, self.dir_up, self.val_pos, self.val.view(np.int32)


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
        ops = sorted({s.op for s in self.sites})
        op_index = {name: i for i, name in enumerate(ops)}
        heads: list[int] = []
        for s in self.sites:
            heads += [op_index[s.op], len(s.shape), *s.shape, int(s.dir_pos.size), int(s.val_pos.size)]
        allints = np.concatenate([np.asarray(heads, np.uint64), _deltas([s.dir_pos for s in self.sites]),
                                  _deltas([s.val_pos for s in self.sites])])
        varints = _varint_encode(allints)
        bits = np.packbits(np.concatenate([s.dir_up for s in self.sites] or [np.zeros(0, bool)]).astype(bool))
        values = np.concatenate([s.val for s in self.sites] or [np.zeros(0, np.float32)]).astype("<f4")
        table = "\n".join(ops).encode()
        body = b"".join([struct.pack("<I", len(table)), table, struct.pack("<QQ", allints.size, len(varints)),
                         varints, bits.tobytes(), values.tobytes()])
        packed = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True).compress(body)
        n_dir = sum(int(s.dir_pos.size) for s in self.sites)
        head = _HEADER.pack(MAGIC, VERSION, POLICIES.index(self.policy), self.bits, len(self.sites), n_dir,
                            self.num_values(), len(packed))
        return head + packed

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "<memory>") -> StepLog:
        if len(data) < _HEADER.size:
            raise CorruptLogError(source, f"{len(data)} bytes, shorter than the {_HEADER.size}-byte header")
        magic, version, policy, bits, n_sites, n_dir, n_val, body_len = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise CorruptLogError(source, "bad magic: not a vtrain rounding log")
        if version != VERSION:
            raise CorruptLogError(source, f"format version {version}, this vtrain reads version {VERSION}")
        if policy >= len(POLICIES) or not 10 <= bits <= 32:
            raise CorruptLogError(source, f"bad header fields (policy {policy}, bits {bits})")
        if len(data) != _HEADER.size + body_len:
            raise CorruptLogError(source, f"{len(data) - _HEADER.size} body bytes, header says {body_len}")
        try:
            body = zstandard.ZstdDecompressor().decompress(data[_HEADER.size:])
        except zstandard.ZstdError as exc:
            raise CorruptLogError(source, f"compressed body does not decode: {exc}") from None
        try:
            sites = _decode_body(body, n_sites, n_dir, n_val)
        except (struct.error, ValueError, IndexError, UnicodeDecodeError) as exc:
            raise CorruptLogError(source, str(exc)) from None
        return cls(sites, POLICIES[policy], bits)

    def content_hash(self) -> bytes:
        """keccak-256 of to_bytes() (32 bytes), committed in the step's leaf."""
        return sha3.keccak_256(self.to_bytes()).digest()


def _decode_body(body: bytes, n_sites: int, n_dir: int, n_val: int) -> list[SiteLog]:
    (table_len,) = struct.unpack_from("<I", body, 0)
    ops = body[4 : 4 + table_len].decode().split("\n") if table_len else []
    off = 4 + table_len
    n_ints, n_varint_bytes = struct.unpack_from("<QQ", body, off)
    off += 16
    ints = _varint_decode(body[off : off + n_varint_bytes], n_ints)
    off += n_varint_bytes
    i = 0
    heads = []
    for site in range(n_sites):
        op_i, ndim = int(ints[i]), int(ints[i + 1])
        shape = tuple(int(d) for d in ints[i + 2 : i + 2 + ndim])
        if len(shape) != ndim or op_i >= len(ops):
            raise ValueError(f"site {site}: header out of range")
        nd, nv = int(ints[i + 2 + ndim]), int(ints[i + 3 + ndim])
        i += 4 + ndim
        heads.append((site, ops[op_i], shape, nd, nv))
    if sum(h[3] for h in heads) != n_dir or sum(h[4] for h in heads) != n_val:
        raise ValueError("entry counts do not match the header")
    if ints.size != i + n_dir + n_val:
        raise ValueError("varint count does not match the entry counts")
    n_bits = (n_dir + 7) // 8
    bits = np.unpackbits(np.frombuffer(body, np.uint8, n_bits, off))[:n_dir].astype(bool)
    off += n_bits
    values = np.frombuffer(body, "<f4", n_val, off).astype(np.float32)
    if off + 4 * n_val != len(body):
        raise ValueError("body length does not match the entry counts")
    if not np.isfinite(values).all():
        raise ValueError("a value entry is not finite")
    sites = []
    d_off, v_off, b_off = i, i + n_dir, 0
    val_off = 0
    for site, op, shape, nd, nv in heads:
        numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
        dir_pos = _undelta(ints[d_off : d_off + nd], numel, site)
        val_pos = _undelta(ints[v_off : v_off + nv], numel, site)
        sites.append(SiteLog(site, op, shape, dir_pos, bits[b_off : b_off + nd].copy(), val_pos,
                             values[val_off : val_off + nv].copy()))
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


def _undelta(d: np.ndarray, numel: int, site: int) -> np.ndarray:
    if d.size and (d[1:] == 0).any():
        raise ValueError(f"site {site}: positions not strictly increasing")
    pos = np.cumsum(d.astype(np.int64))
    if pos.size and (pos[-1] >= numel or pos[-1] < 0):
        raise ValueError(f"site {site}: position {int(pos[-1])} outside a tensor of {numel} elements")
    return pos


def _varint_encode(a: np.ndarray) -> bytes:
    """LEB128 varints of a uint64 array, vectorised over elements (loops over <= 10 byte groups)."""
    a = a.astype(np.uint64)
    if a.size == 0:
        return b""
    nbytes = np.ones(a.size, np.int64)
    rest = a >> np.uint64(7)
    while rest.any():
        nbytes += rest > 0
        rest >>= np.uint64(7)
    starts = np.cumsum(nbytes) - nbytes
    out = np.empty(int(nbytes.sum()), np.uint8)
    for g in range(int(nbytes.max())):
        sel = nbytes > g
        byte = (a[sel] >> np.uint64(7 * g)) & np.uint64(0x7F)
        more = (nbytes[sel] - 1 > g).astype(np.uint64) << np.uint64(7)
        out[starts[sel] + g] = (byte | more).astype(np.uint8)
    return out.tobytes()


def _varint_decode(buf: bytes, count: int) -> np.ndarray:
    b = np.frombuffer(buf, np.uint8)
    if count == 0:
        if b.size:
            raise ValueError("trailing varint bytes")
        return np.zeros(0, np.uint64)
    ends = np.flatnonzero(b < 0x80)
    if ends.size != count or ends[-1] != b.size - 1:
        raise ValueError(f"{ends.size} varints where {count} were announced")
    starts = np.concatenate([[0], ends[:-1] + 1])
    lens = ends - starts + 1
    if lens.max() > _MAX_VARINT_BYTES:
        raise ValueError("varint longer than 64 bits")
    group = np.arange(b.size) - np.repeat(starts, lens)
    vals = (b & 0x7F).astype(np.uint64) << (7 * group).astype(np.uint64)
    return np.add.reduceat(vals, starts)


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
