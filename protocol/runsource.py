"""Where an auditor or referee gets a trainer's run: a local directory or a plain HTTP(S) URL.

A URL is any static file server exposing the run directory's layout (`python -m http.server` in
the run's parent is enough). Files are fetched into a local cache directory on demand, so the
referee downloads only what the leaf it replays needs: the state of the leaf before it and the logs
of the leaf's steps (one step, or an interval of k steps). Nothing fetched is trusted: every
state and log file is checked against the hash its step's leaf commits to, the leaves against the
root committed on-chain (`check_commitment`), and a mismatch names the file and where it came from.
"""

from __future__ import annotations

import hashlib
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable, Iterable

from vtrain.errors import VtrainError
from vtrain.run import Run, RunError, TamperedFileError, atomic_write, index_files
from vtrain.spec import spec_from_json

HTTP_TIMEOUT_S = 30.0
HTTP_TRIES = 3


class RunSourceError(VtrainError):
    """The trainer's run cannot be fetched, or what was fetched does not match its commitment."""


class TamperedRunError(RunSourceError):
    """A fetched file does not hash to what the committed leaves say; `.file` names it."""

    def __init__(self, message: str, file: str) -> None:
        super().__init__(message)
        self.file = file


def is_url(location: str) -> bool:
    return location.startswith(("http://", "https://"))


class RunSource:
    """A trainer's run at `location` (directory or URL), readable as a checked `vtrain.run.Run`."""

    def __init__(self, location: str | Path, cache: Path | None = None) -> None:
        self.location = str(location)
        if is_url(self.location):
            self.base = self.location.rstrip("/") + "/"
            digest = hashlib.sha256(self.base.encode()).hexdigest()[:16]
            self.local = Path(cache) if cache else Path(tempfile.gettempdir()) / "vtrain-runs" / digest
        else:
            self.base = None
            self.local = Path(self.location)
            if not self.local.is_dir():
                raise RunSourceError(f"run directory {self.local} does not exist: give the trainer's run directory or URL")
        self._run: Run | None = None

    def describe(self, rel: str) -> str:
        """Where file `rel` of the run comes from, for messages."""
        return self.base + rel if self.base else str(self.local / rel)

    def open(self) -> Run:
        """Fetch the spec and leaves (always fresh for a URL) and open the run."""
        if self._run is None:
            if self.base:
                self._download("spec.json")
                try:   # which index files there are depends on the spec (its checkpoint interval)
                    spec = spec_from_json((self.local / "spec.json").read_text(encoding="utf-8"),
                                          self.describe("spec.json"))
                except VtrainError as e:
                    raise RunSourceError(f"run at {self.location} is unusable: {e}") from None
                for rel in index_files(spec)[1:]:
                    self._download(rel)
            try:
                self._run = Run.open(self.local)
            except TamperedFileError as e:
                rel = e.path.name if e.path is not None else "leaves.bin"
                raise TamperedRunError(f"{self.describe(rel)}: {e}", rel) from None
            except RunError as e:
                raise RunSourceError(f"run at {self.location} is unusable: {e}") from None
        return self._run

    def fetch_leaves(self, leaves: Iterable[int], states: bool = True, logs: bool = True) -> Run:
        """Make the state files of `leaves` and/or the logs of their steps local, each checked."""
        run = self.open()
        for i in leaves:
            if states:
                self._fetch_checked(run, i, run.state_path(i), lambda: run.read_state(i))
            if logs and run.has_logs:
                for t in run.intervals.steps_of(i):
                    # with an interval, the leaf covers the step through steps.bin: name the step too
                    self._fetch_checked(run, i, run.log_path(t), lambda: run.read_log_bytes(t),
                                        detail=f" (step {t})" if run.intervals.k > 1 else "")
        return run

    def fetch_for_audit(self) -> Run:
        """What an auditor replays from: the spec, the leaves and every step's log."""
        run = self.open()
        return self.fetch_leaves(range(1, run.size), states=False, logs=True)

    def fetch_for_replay(self, leaf: int) -> Run:
        """What a referee replays one leaf from: the state of the leaf before it and its steps' logs."""
        self.fetch_leaves([leaf - 1], states=True, logs=False)
        return self.fetch_leaves([leaf], states=False, logs=True)

    def _fetch_checked(self, run: Run, leaf: int, path: Path, read: Callable[[], bytes], detail: str = "") -> None:
        rel = path.relative_to(run.path).as_posix()
        if self.base:
            self._download(rel)  # always fresh: a cached copy may be from an earlier run at this URL
        try:
            read()
        except TamperedFileError:
            if self.base:
                path.unlink(missing_ok=True)  # never keep a bad copy around as if it were the run
            raise TamperedRunError(f"{self.describe(rel)}: does not hash to what leaf {leaf} commits to{detail}; the "
                                   f"trainer's file was modified or corrupted", rel) from None
        except RunError:
            raise RunSourceError(f"{self.describe(rel)}: missing from the trainer's run") from None

    def _download(self, rel: str) -> None:
        url = self.base + rel
        last: Exception | None = None
        for attempt in range(HTTP_TRIES):
            try:
                with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as resp:
                    data = resp.read()
                break
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    raise RunSourceError(f"{url}: not found (HTTP 404); the trainer's server does not serve this file") from None
                last = e
            except (urllib.error.URLError, OSError) as e:
                last = e
            time.sleep(0.2 * 2**attempt)
        else:
            raise RunSourceError(f"{url}: cannot be fetched after {HTTP_TRIES} tries ({last})")
        target = self.local / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(target, data)


def check_commitment(run: Run, root: bytes, size: int, spec_hash: bytes | None = None, where: str = "") -> None:
    """The run is the one committed on-chain: same root and size (and spec, if given)."""
    label = where or str(run.path)
    if spec_hash is not None and run.spec_hash != spec_hash:
        raise RunSourceError(f"{label}: the run's spec hash 0x{run.spec_hash.hex()} is not the job's 0x{spec_hash.hex()}")
    if run.size != size or run.root != root:
        raise TamperedRunError(f"{label}/leaves.bin: its Merkle root 0x{run.root.hex()} (size {run.size}) is not the "
                               f"committed 0x{root.hex()} (size {size}); the leaves were modified or belong to another run",
                               "leaves.bin")
