"""The run directory: what a trainer writes, an auditor downloads and a referee reads.

    RUN/spec.toml            the spec as given (for people)
    RUN/spec.json            canonical JSON (what the spec hash covers; what readers parse)
    RUN/states/NNNNNN.vst    state after step t, for the steps that end a leaf's interval (every step
                             when checkpoint_interval = 1; t = 0 is the initial state), vtrain.state format
    RUN/logs/NNNNNN.vlog     rounding log of step t (StepLog.to_bytes()), every step t >= 1 (none at all
                             under resolution exact: those leaves commit a zero log hash)
    RUN/leaves.bin           b"VTLEAVES" | uint16 version | uint16 record size | uint64 count, then per
                             leaf i = 0..L: leaf ‖ state hash ‖ log hash ‖ batch hash (4 × 32 bytes)
    RUN/steps.bin            only when checkpoint_interval k > 1: b"VTSTEPS\0" | uint16 version |
                             uint16 record size | uint64 count, then per step t = 1..N: log hash ‖
                             batch hash (2 × 32 bytes), which each leaf's combined hashes cover
    RUN/metrics.jsonl        one JSON line per step (loss, logged, corrections, seconds, log bytes)
    RUN/commitment.json      {"root": "0x…", "size": L+1, "spec_hash": "0x…"}

With k = 1 leaf i is step i (L = N); with k > 1 leaf i covers steps (i-1)k+1 .. min(ik, N) and
L = ceil(N/k) (vtrain.intervals). Every file is written to a temporary name and renamed, and
leaves.bin is written last for a leaf, so the last record in leaves.bin is always a complete
interval: an interrupted run resumes after it and redoes a partial interval.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from vtrain.errors import VtrainError
from vtrain.intervals import Intervals, interval_record
from vtrain.leaves import RECORD_SIZE, ZERO_HASH, LeafRecord, hex0x, keccak256
from vtrain.merkle import MerkleTree
from vtrain.spec import Spec, spec_from_json

LEAVES_MAGIC = b"VTLEAVES"
LEAVES_VERSION = 1
_LEAVES_HEADER = struct.Struct(">8sHHQ")
STEPS_MAGIC = b"VTSTEPS\0"
STEPS_VERSION = 1
STEP_RECORD_SIZE = 64
STEPS_FILE = "steps.bin"


class RunError(VtrainError):
    """A run directory is missing, incomplete, corrupt, or belongs to another spec."""


class TamperedFileError(RunError):
    """A step's file does not hash to what the step's leaf commits to; `.path` names the file when known."""

    def __init__(self, message: str, path: Path | None = None) -> None:
        super().__init__(message)
        self.path = path


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


_FIX = "re-download the run or re-run `vtrain train` on it"


def _records(data: bytes, source: str, magic: bytes, version: int, size: int, what: str) -> list[bytes]:
    """The fixed-size records of a leaves.bin / steps.bin file, after checking its header and length."""
    if len(data) < _LEAVES_HEADER.size:
        raise RunError(f"{source}: truncated {what} file ({len(data)} bytes); {_FIX}")
    got_magic, got_version, got_size, count = _LEAVES_HEADER.unpack_from(data)
    if (got_magic, got_version, got_size) != (magic, version, size):
        raise RunError(f"{source}: not a vtrain {what} file of version {version}; {_FIX}")
    body = data[_LEAVES_HEADER.size:]
    if len(body) != count * size:
        raise RunError(f"{source}: says {count} records but holds {len(body)} bytes of records; {_FIX}")
    return [body[i * size:(i + 1) * size] for i in range(count)]


def decode_leaves(data: bytes, source: str) -> list[LeafRecord]:
    records = []
    for t, rec in enumerate(_records(data, source, LEAVES_MAGIC, LEAVES_VERSION, RECORD_SIZE, "leaves")):
        r = LeafRecord(t, rec[32:64], rec[64:96], rec[96:128])
        if r.leaf != rec[:32]:
            raise TamperedFileError(f"{source}: leaf {t} does not match its own state/log/batch hashes; {_FIX}")
        records.append(r)
    return records


def encode_step_hashes(hashes: list[tuple[bytes, bytes]]) -> bytes:
    return _LEAVES_HEADER.pack(STEPS_MAGIC, STEPS_VERSION, STEP_RECORD_SIZE, len(hashes)) + b"".join(
        log + batch for log, batch in hashes)


def decode_step_hashes(data: bytes, source: str) -> list[tuple[bytes, bytes]]:
    """(log hash, batch hash) of steps 1..count, as RUN/steps.bin lists them."""
    return [(rec[:32], rec[32:]) for rec in _records(data, source, STEPS_MAGIC, STEPS_VERSION, STEP_RECORD_SIZE,
                                                     "step hashes")]


def index_files(spec: Spec) -> tuple[str, ...]:
    """The files a reader needs before it can check any state or log, relative to the run directory."""
    return ("spec.json", "leaves.bin") + ((STEPS_FILE,) if spec.checkpoint_interval > 1 else ())


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
    step_hashes: list[tuple[bytes, bytes]]   # (log hash, batch hash) of steps 1..steps, checked against the leaves

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
        records = decode_leaves(leaves_file.read_bytes(), str(leaves_file))
        intervals = Intervals(spec.steps, spec.checkpoint_interval)
        if not 1 <= len(records) <= intervals.size:
            raise RunError(f"{leaves_file}: holds {len(records)} leaves, a run of this spec has 1..{intervals.size}; "
                           "re-download the run or re-run `vtrain train` on it")
        return cls(path, spec, records, _step_hashes(path, intervals, records))

    @property
    def spec_hash(self) -> bytes:
        return self.spec.hash

    @cached_property
    def intervals(self) -> Intervals:
        return Intervals(self.spec.steps, self.spec.checkpoint_interval)

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
        """Completed optimizer steps: the last step the last leaf covers (size - 1 when k = 1)."""
        return self.intervals.last_step(self.size - 1)

    def state_path(self, leaf: int) -> Path:
        """The state file of leaf `leaf` (named by the step after which it was taken)."""
        return self.path / "states" / f"{self.intervals.last_step(leaf):06d}.vst"

    def log_path(self, t: int) -> Path:
        """The rounding log of step `t`."""
        return self.path / "logs" / f"{t:06d}.vlog"

    def _read(self, path: Path) -> bytes:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise RunError(f"{path}: missing from the run; re-download it from the trainer") from None

    def _read_checked(self, path: Path, committed: bytes, what: str) -> bytes:
        data = self._read(path)
        if keccak256(data) != committed:
            raise TamperedFileError(f"{path}: does not hash to the {what}; "
                                    "the file was modified or corrupted, re-download it", path)
        return data

    def read_state(self, leaf: int) -> bytes:
        """State bytes of leaf `leaf`, checked against its committed state hash."""
        self._check_leaf(leaf)
        return self._read_checked(self.state_path(leaf), self.records[leaf].state_hash,
                                  f"state hash committed in leaf {leaf}")

    @property
    def has_logs(self) -> bool:
        """False for resolution "exact": such a run has no rounding logs (its leaves commit a zero hash)."""
        return self.spec.resolution != "exact"

    def read_log_bytes(self, t: int) -> bytes:
        """Log bytes of step t, checked against the log hash committed for it."""
        if not self.has_logs:
            raise RunError(f"{self.path}: resolution 'exact' runs have no rounding logs (step {t})")
        if not 1 <= t <= self.steps:
            raise RunError(f"{self.path}: step {t} is outside the run (steps 1..{self.steps})")
        what = (f"log hash committed in leaf {t}" if self.intervals.k == 1 else
                f"log hash of step {t} ({STEPS_FILE}, covered by leaf {self.intervals.leaf_of(t)})")
        return self._read_checked(self.log_path(t), self.step_hashes[t - 1][0], what)

    def verify_files(self, leaf: int) -> None:
        """Check leaf `leaf`'s state and its steps' logs; a tampered file is named."""
        self.read_state(leaf)
        for t in self.intervals.steps_of(leaf) if self.has_logs else ():
            self.read_log_bytes(t)

    def metrics(self) -> list[dict]:
        path = self.path / "metrics.jsonl"
        if not path.is_file():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def _check_leaf(self, leaf: int) -> None:
        if not 0 <= leaf < self.size:
            raise RunError(f"{self.path}: leaf {leaf} is outside the run (leaves 0..{self.size - 1})")


def _step_hashes(path: Path, intervals: Intervals, records: list[LeafRecord]) -> list[tuple[bytes, bytes]]:
    """Per-step (log hash, batch hash) of the steps the leaves cover, each interval checked against its leaf."""
    if intervals.k == 1:
        return [(r.log_hash, r.batch_hash) for r in records[1:]]
    steps_file = path / STEPS_FILE
    if not steps_file.is_file():
        raise RunError(f"{steps_file}: missing; a run with checkpoint_interval > 1 lists its steps' hashes there, "
                       "re-download it")
    hashes = decode_step_hashes(steps_file.read_bytes(), str(steps_file))
    covered = intervals.last_step(len(records) - 1)
    if len(hashes) < covered:   # more is fine: a crash after steps.bin and before leaves.bin
        raise RunError(f"{steps_file}: lists {len(hashes)} steps, the leaves cover {covered}; re-download it")
    for r in records[1:]:
        steps = intervals.steps_of(r.step)
        part = hashes[steps[0] - 1:steps[-1]]
        combined = interval_record(r.step, r.state_hash, [h[0] for h in part], [h[1] for h in part], intervals.k)
        if combined.leaf != r.leaf:
            raise TamperedFileError(f"{steps_file}: the hashes of {intervals.describe(r.step)} do not combine to "
                                    f"what leaf {r.step} commits to; the file was modified, re-download it",
                                    steps_file)
    return hashes[:covered]


def _metrics_step(line: str) -> int:
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return 1 << 62  # a torn last line: drop it


class RunWriter:
    """Appends steps and leaves to a run directory; reopening one resumes after its last complete leaf.

    Per step the trainer calls write_log (the log and the metrics line); after the last step of an
    interval it calls write_leaf with the state, which commits the interval's steps in one leaf.
    """

    def __init__(self, path: str | Path, spec: Spec, spec_toml: str) -> None:
        self.path = Path(path)
        self.spec = spec
        self.intervals = Intervals(spec.steps, spec.checkpoint_interval)
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
        self.step_hashes = self._committed_step_hashes()
        self._pending: list[tuple[bytes, bytes]] = []   # (log hash, batch hash) of this interval's steps so far
        self._trim_metrics()

    @property
    def last_leaf(self) -> int:
        """The last complete leaf, or -1 when not even the initial state was written."""
        return len(self.records) - 1

    @property
    def last_step(self) -> int:
        """The last step a complete leaf covers, or -1 when not even the initial state was written."""
        return self.intervals.last_step(self.last_leaf) if self.records else -1

    def write_log(self, t: int, log: bytes, batch_hash: bytes, metrics: dict | None) -> None:
        """Write step t's log and metrics line; the step is committed by its interval's write_leaf."""
        if t != self.last_step + 1 + len(self._pending):
            raise RunError(f"{self.path}: step {t} written out of order "
                           f"(next is {self.last_step + 1 + len(self._pending)})")
        if log:   # resolution "exact" has no log: no file, and a zero log hash
            atomic_write(self.path / "logs" / f"{t:06d}.vlog", log)
        if metrics is not None:
            with open(self.path / "metrics.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": t, **metrics}, sort_keys=True) + "\n")
        self._pending.append((keccak256(log) if log else ZERO_HASH, batch_hash))

    def write_leaf(self, state: bytes) -> LeafRecord:
        """Commit the next leaf: the state after its interval's last step and the steps logged since."""
        leaf = len(self.records)
        steps = self.intervals.steps_of(leaf)
        if len(self._pending) != len(steps):
            raise RunError(f"{self.path}: leaf {leaf} covers {len(steps)} steps, {len(self._pending)} were written")
        if leaf == 0:
            record = LeafRecord(0, keccak256(state), ZERO_HASH, ZERO_HASH)
        else:
            record = interval_record(leaf, keccak256(state), [h[0] for h in self._pending],
                                     [h[1] for h in self._pending], self.intervals.k)
        atomic_write(self.path / "states" / f"{self.intervals.last_step(leaf):06d}.vst", state)
        if self.intervals.k > 1:
            self.step_hashes += self._pending
            atomic_write(self.path / STEPS_FILE, encode_step_hashes(self.step_hashes))
        self._pending = []
        self.records.append(record)
        atomic_write(self.path / "leaves.bin", encode_leaves(self.records))
        return record

    def finish(self) -> dict:
        return write_commitment(self.path / "commitment.json", self.records, self.spec)

    def _committed_step_hashes(self) -> list[tuple[bytes, bytes]]:
        # steps.bin may also list a partial interval's steps (written before leaves.bin): they are redone
        if self.intervals.k == 1 or self.last_step <= 0:
            return []
        steps_file = self.path / STEPS_FILE
        if not steps_file.is_file():
            raise RunError(f"{steps_file}: missing, so the run cannot resume; delete {self.path} and train again")
        return decode_step_hashes(steps_file.read_bytes(), str(steps_file))[:self.last_step]

    def _trim_metrics(self) -> None:
        # a crash between a metrics line and its leaf leaves lines for steps that will be redone
        path = self.path / "metrics.jsonl"
        if path.exists():
            lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if _metrics_step(ln) <= self.last_step]
            atomic_write(path, "".join(ln + "\n" for ln in lines).encode())
