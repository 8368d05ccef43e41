"""The rounding log of a step trained in micro-batch shards: one StepLog per shard, then one for the
optimizer step, in a container of its own.

    b"VTSHARDS" | uint16 version | uint32 parts | parts x uint64 length | the parts' StepLog bytes

A run with `shards = 1` keeps the plain StepLog format; the leaf commits to the container bytes.
"""

from __future__ import annotations

import struct

from vtrain.roundlog import CorruptLogError, StepLog

MAGIC = b"VTSHARDS"
VERSION = 1
_HEADER = struct.Struct(">8sHI")


class ShardedLog:
    """Per-shard rounding logs of one step (shards 0..M-1), then the optimizer step's log."""

    def __init__(self, parts: list[StepLog]) -> None:
        self.parts = parts

    def num_entries(self) -> int:
        return sum(p.num_entries() for p in self.parts)

    def to_bytes(self) -> bytes:
        blobs = [p.to_bytes() for p in self.parts]
        return (_HEADER.pack(MAGIC, VERSION, len(blobs)) + struct.pack(f">{len(blobs)}Q", *map(len, blobs))
                + b"".join(blobs))

    @classmethod
    def from_bytes(cls, data: bytes, source: str, parts: int) -> "ShardedLog":
        if len(data) < _HEADER.size:
            raise CorruptLogError(source, f"{len(data)} bytes, shorter than the sharded-log header")
        magic, version, count = _HEADER.unpack_from(data)
        if magic != MAGIC or version != VERSION:
            raise CorruptLogError(source, f"not a sharded rounding log of version {VERSION}")
        if count != parts:
            raise CorruptLogError(source, f"{count} parts, the spec's shards need {parts}")
        pos = _HEADER.size + 8 * count
        if len(data) < pos:
            raise CorruptLogError(source, "truncated part table")
        lengths = struct.unpack_from(f">{count}Q", data, _HEADER.size)
        if pos + sum(lengths) != len(data):
            raise CorruptLogError(source, f"part lengths sum to {sum(lengths)}, {len(data) - pos} bytes follow")
        out = []
        for i, n in enumerate(lengths):
            out.append(StepLog.from_bytes(data[pos:pos + n], f"{source} part {i}"))
            pos += n
        return cls(out)

    @staticmethod
    def empty(parts: int) -> "ShardedLog":
        return ShardedLog([StepLog.empty() for _ in range(parts)])


def parse_step_log(data: bytes, source: str, shards: int) -> StepLog | ShardedLog:
    """A step's log bytes as the spec's format: a StepLog (shards = 1) or a ShardedLog of shards + 1 parts."""
    if shards == 1:
        return StepLog.from_bytes(data, source)
    return ShardedLog.from_bytes(data, source, shards + 1)
