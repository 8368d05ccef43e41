"""The run directory: what a trainer writes, an auditor downloads and a referee reads.

    RUN/spec.toml            the spec as given (for people)
    RUN/spec.json            canonical JSON (what the spec hash covers; what readers parse)
    RUN/states/NNNNNN.vst    state after step t (t = 0 is the initial state), vtrain.state format
    RUN/logs/NNNNNN.vlog     rounding log of step t (StepLog.to_bytes()), t >= 1 (none under resolution exact)
    RUN/leaves.bin           b"VTLEAVES" | uint16 version | uint16 record size | uint64 count, then per
                             step t = 0..N: leaf ‖ state hash ‖ log hash ‖ batch hash (4 × 32 bytes)
    RUN/metrics.jsonl        one JSON line per step (loss, logged, corrections, seconds, log bytes)
    RUN/commitment.json      {"root": "0x…", "size": N+1, "spec_hash": "0x…"}

Every file is written to a temporary name and renamed, and leaves.bin is written last for a step,
so the last record in leaves.bin is always a complete step: an interrupted run resumes after it.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from vtrain.errors import VtrainError
from vtrain.leaves import RECORD_SIZE, LeafRecord, hex0x, keccak256
from vtrain.merkle import MerkleTree
from vtrain.spec import Spec, spec_from_json

LEAVES_MAGIC = b"VTLEAVES"
LEAVES_VERSION = 1
_LEAVES_HEADER = struct.Struct(">8sHHQ")


class RunError(VtrainError):
    """A run directory is missing, incomplete, corrupt, or belongs to another spec."""


class TamperedFileError(RunError):
    """A step's file does not hash to what the step's leaf commits to."""


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` via a temporary file and a rename, so readers never see half a file."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def encode_leaves(records: list[LeafRecord]) -> bytes:
    return _LEAVES_HEADER.pack(LEAVES_MAGIC, LEAVES_VERSION, RECORD_SIZE, len(records)) + b"".join(
        r.to_bytes() for r in records)


def decode_leaves(data: bytes, source: str) -> list[LeafRecord]:
    fix = "re-download the run or re-run `vtrain train` on it"
    if len(data) < _LEAVES_HEADER.size:
        raise RunError(f"{source}: truncated leaves file ({len(data)} bytes); {fix}")
    magic, version, rsize, count = _LEAVES_HEADER.unpack_from(data)
    if magic != LEAVES_MAGIC or version != LEAVES_VERSION or rsize != RECORD_SIZE:
        raise RunError(f"{source}: not a vtrain leaves file of version {LEAVES_VERSION}; {fix}")
    if len(data) != _LEAVES_HEADER.size + count * RECORD_SIZE:
        raise RunError(f"{source}: says {count} leaves but holds {len(data) - _LEAVES_HEADER.size} bytes "
                       f"of records; {fix}")
    records = []
    for t in range(count):
        rec = data[_LEAVES_HEADER.size + t * RECORD_SIZE:][:RECORD_SIZE]
        r = LeafRecord(t, rec[32:64], rec[64:96], rec[96:128])
        if r.leaf != rec[:32]:
            raise TamperedFileError(f"{source}: leaf {t} does not match its own state/log/batch hashes; {fix}")
        records.append(r)
    return records


def write_commitment(path: Path, records: list[LeafRecord], spec: Spec) -> dict:
    tree = MerkleTree(r.leaf for r in records)
    commitment = {"root": hex0x(tree.root), "size": tree.size, "spec_hash": hex0x(spec.hash)}
    atomic_write(path, (json.dumps(commitment, indent=2) + "\n").encode())
    return commitment


@dataclass
class Run:
    """A trainer's run directory, opened for reading. Use Run.open(path)."""

    path: Path
    spec: Spec
    records: list[LeafRecord]

    @classmethod
    def open(cls, path: str | Path) -> "Run":
        path = Path(path)
        spec_file = path / "spec.json"
        if not spec_file.is_file():
            raise RunError(f"{path}: not a run directory (no spec.json); give the --out of `vtrain train`")
        spec = spec_from_json(spec_file.read_text(encoding="utf-8"), str(spec_file))
        leaves_file = path / "leaves.bin"
        if not leaves_file.is_file():
            raise RunError(f"{leaves_file}: missing; the run never completed step 0, run `vtrain train` again")
        return cls(path, spec, decode_leaves(leaves_file.read_bytes(), str(leaves_file)))

    @property
    def spec_hash(self) -> bytes:
        return self.spec.hash

    @property
    def leaves(self) -> list[bytes]:
        return [r.leaf for r in self.records]

    @cached_property
    def tree(self) -> MerkleTree:
        return MerkleTree(self.leaves)

    @property
    def root(self) -> bytes:
        return self.tree.root

    @property
    def size(self) -> int:
        return len(self.records)

    @property
    def steps(self) -> int:
        """Completed optimizer steps (size - 1)."""
        return self.size - 1

    def state_path(self, t: int) -> Path:
        return self.path / "states" / f"{t:06d}.vst"

    def log_path(self, t: int) -> Path:
        return self.path / "logs" / f"{t:06d}.vlog"

    def _read(self, path: Path) -> bytes:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise RunError(f"{path}: missing from the run; re-download it from the trainer") from None

    def _read_checked(self, path: Path, committed: bytes, what: str, t: int) -> bytes:
        data = self._read(path)
        if keccak256(data) != committed:
            raise TamperedFileError(f"{path}: does not hash to the {what} committed in leaf {t}; "
                                    "the file was modified or corrupted, re-download it")
        return data

    def read_state(self, t: int) -> bytes:
        """State bytes after step t, checked against the committed state hash."""
        self._check_step(t)
        return self._read_checked(self.state_path(t), self.records[t].state_hash, "state hash", t)

    @property
    def has_logs(self) -> bool:
        """False for resolution "exact": such a run has no rounding logs (its leaves commit a zero hash)."""
        return self.spec.resolution != "exact"

    def read_log_bytes(self, t: int) -> bytes:
        """Log bytes of step t, checked against the committed log hash."""
        if not self.has_logs:
            raise RunError(f"{self.path}: resolution 'exact' runs have no rounding logs (step {t})")
        self._check_step(t, first=1)
        return self._read_checked(self.log_path(t), self.records[t].log_hash, "log hash", t)

    def verify_files(self, t: int) -> None:
        """Check step t's state (and log, t >= 1) against its leaf; a tampered file is named."""
        self.read_state(t)
        if t >= 1 and self.has_logs:
            self.read_log_bytes(t)

    def metrics(self) -> list[dict]:
        path = self.path / "metrics.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def _check_step(self, t: int, first: int = 0) -> None:
        if not first <= t < self.size:
            raise RunError(f"{self.path}: step {t} is outside the run (steps {first}..{self.size - 1})")


def _metrics_step(line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return 1 << 62  # a torn last line: drop it


class RunWriter:
    """Appends steps to a run directory; reopening an existing one resumes after its last step."""

    def __init__(self, path: str | Path, spec: Spec, spec_toml: str) -> None:
        self.path = Path(path)
        self.spec = spec
        spec_json = self.path / "spec.json"
        if self.path.is_dir() and not spec_json.exists() and any(self.path.iterdir()):
            raise RunError(f"{self.path}: not empty and not a run directory; choose another --out")
        (self.path / "states").mkdir(parents=True, exist_ok=True)
        (self.path / "logs").mkdir(exist_ok=True)
        if spec_json.exists():
            existing = spec_json.read_text(encoding="utf-8").strip()
            if existing != spec.to_json():
                raise RunError(f"{self.path}: holds a run of another spec; choose another --out or delete it")
        else:
            atomic_write(self.path / "spec.toml", spec_toml.encode())
            atomic_write(spec_json, spec.to_json().encode())
        leaves_file = self.path / "leaves.bin"
        self.records = decode_leaves(leaves_file.read_bytes(), str(leaves_file)) if leaves_file.exists() else []
        self._trim_metrics()

    @property
    def last_step(self) -> int:
        """The last complete step, or -1 when not even the initial state was written."""
        return len(self.records) - 1

    def write_step(self, record: LeafRecord, state: bytes, log: bytes | None, metrics: dict | None) -> None:
        t = record.step
        if t != len(self.records):
            raise RunError(f"{self.path}: step {t} written out of order (next is {len(self.records)})")
        atomic_write(self.path / "states" / f"{t:06d}.vst", state)
        if log is not None:
            atomic_write(self.path / "logs" / f"{t:06d}.vlog", log)
        if metrics is not None:
            with open(self.path / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": t, **metrics}, sort_keys=True) + "\n")
        self.records.append(record)
        atomic_write(self.path / "leaves.bin", encode_leaves(self.records))

    def finish(self) -> dict:
        return write_commitment(self.path / "commitment.json", self.records, self.spec)

    def _trim_metrics(self) -> None:
        # a crash between the metrics line and leaves.bin leaves a line for an incomplete step
        path = self.path / "metrics.jsonl"
        if path.exists():
            lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if _metrics_step(ln) <= self.last_step]
            atomic_write(path, "".join(ln + "\n" for ln in lines).encode())
