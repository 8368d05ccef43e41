"""numba's compiled-kernel cache, in one folder per version of the package's sources.

numba keys each cached kernel on its own source file alone, but a kernel that calls kernels of other modules
keeps compiled copies of them (vtrain.resolve's of vtrain.exactdot's, vtrain.prefilter's of vtrain.fused's).
After an update that changed only the called module, numba would load the caller's old copy: the package
would then compute with code that is no longer in it, and two machines on the same commit could differ.
Keyed by the contents of every source file instead, the cache of any other version is never read: a changed
package compiles afresh once (about a minute for the test suite).
Inside the folder each compiled signature's file is named by its key (`name_files_by_key`), so that processes
compiling at once cannot leave one signature's index entry naming another's code.

Imported by vtrain/__init__.py before any module that compiles: the folder must be set before numba creates
a kernel's cache. It imports no numba itself (the chain side imports vtrain without it); where numba is
already loaded, its config is set directly. The setting is the process's: numba kernels of other packages
run in it are cached in the same folder.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any

PREFIX = "numba-"
# What the first vtrain import of a process tree chose, for its child processes: the base (a user's
# NUMBA_CACHE_DIR, or empty for the package's own) and the folder it set, so that a NUMBA_CACHE_DIR a child
# inherits is not taken for a user's, while one set for the child alone still is.
_BASE_VAR, _FOLDER_VAR = "VTRAIN_NUMBA_CACHE_BASE", "VTRAIN_NUMBA_CACHE_FOLDER"
# Another version's folder (or numba's own per-file cache) is removed only once nothing has written to it for
# this long: a process of that version may still be running, and numba's save makes the folder again but then
# fails if it vanishes before the file is written.
STALE_SECONDS = 3600.0


def source_digest(package: Path) -> str:
    """A digest of the package's Python sources, names and contents (~0.6 MB read: ~1 ms)."""
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        h.update(path.relative_to(package).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def _base(package: Path, base_text: str) -> tuple[Path, bool] | None:
    """(the writable folder the versions' folders go in, whether it is the package's own, whose old entries are
    ours to remove), or None: `base_text` (a user's NUMBA_CACHE_DIR) if given; else the package's __pycache__;
    else, not writable (a read-only install), the user's cache folder, where numba would otherwise cache each
    kernel by its own file again."""
    own = package / "__pycache__"
    if not base_text and _writable(own):
        return own, True
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    base = Path(base_text).resolve() if base_text else Path(cache_home) / "vtrain-numba"
    return (base, False) if _writable(base) else None


def _writable(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


def _remove_stale(base: Path, keep: Path) -> None:
    """Remove other versions' folders and numba's own per-file cache (`*.nbi`, `*.nbc`, from before this module)
    that nothing has written to for STALE_SECONDS."""
    old = time.time() - STALE_SECONDS
    for entry in base.iterdir():
        try:
            if entry != keep and entry.stat().st_mtime < old:
                if entry.is_dir() and entry.name.startswith(PREFIX):
                    import shutil  # noqa: PLC0415 (~2 ms an import, and most processes find nothing to remove)

                    shutil.rmtree(entry, ignore_errors=True)
                elif entry.suffix in (".nbi", ".nbc"):
                    entry.unlink()
        except OSError:  # (another process removed it first)
            pass


def name_files_by_key() -> None:
    """Have numba name each cached kernel's data file after its key (the signature, the target machine, the code),
    where it takes the lowest number its index does not list yet. Called by every module of vtrain that imports
    numba without importing vtrain.fused first (which calls it), before any of its kernels compiles.

    numba reads and rewrites the index unlocked and loads whatever file an entry names without checking it. Two
    processes compiling two signatures of one kernel at once (pytest's workers, a run's shards) could both take
    number 2; the index could then name, for one signature, the file holding the other's code, and every later
    process loaded that file at each call and ran the wrong compile. Found in session 49: after a test run on two
    workers, `vtrain.omp_kernels._data` ran its 3-d array compile on 2-d arrays, loading it anew at every call (1.8
    ms a call; a kernel that reads its arrays' shapes would have computed with the wrong ones). Named by its key, a
    file holds only its key's code whichever process wrote it, and is written before the index names it; an entry
    that a concurrent rewrite of the index drops only costs a compile in a later process."""
    from numba.core import caching  # noqa: PLC0415 (the caller has imported numba)

    global _numbas_save
    cls = caching.IndexDataCacheFile
    if cls.save is not _save_keyed:
        _numbas_save, cls.save = cls.save, _save_keyed


_numbas_save: Any = None  # (numba's own, replaced: the tests show what it does)


def _save_keyed(self: Any, key: Any, data: Any) -> None:
    """numba's IndexDataCacheFile.save, the data file named by the key's digest (`name_files_by_key`)."""
    digest = hashlib.sha256(repr(key).encode()).hexdigest()[:24]
    name = f"{self._index_name[:-len('.nbi')]}.{digest}.nbc"
    self._save_data(name, data)
    overloads = self._load_index()
    if overloads.get(key) != name:
        overloads[key] = name
        self._save_index(overloads)


def use_source_keyed_cache(package: Path) -> Path | None:
    """Point numba's cache at `<base>/numba-<digest of package's sources>` (see `_base`); the folder, or None
    where no base can be written (numba's own choice then stands)."""
    inherited = os.environ.get("NUMBA_CACHE_DIR", "")
    if inherited and inherited != os.environ.get(_FOLDER_VAR):
        os.environ[_BASE_VAR] = inherited  # (a user's: set for this process or the whole tree)
    found = _base(package, os.environ.setdefault(_BASE_VAR, ""))
    if found is None:
        return None
    base, own = found
    folder = base / f"{PREFIX}{source_digest(package)}"
    if own:
        _remove_stale(base, folder)
    os.environ["NUMBA_CACHE_DIR"] = os.environ[_FOLDER_VAR] = str(folder)
    if "numba" in sys.modules:  # (numba read its environment when it was imported)
        from numba.core import config  # noqa: PLC0415

        config.CACHE_DIR = str(folder)
        reloader = getattr(config, "_env_reloader", None)
        if reloader is not None and isinstance(getattr(reloader, "old_environ", None), dict):
            # numba re-reads every setting from the environment once it sees the environment changed, which
            # would undo whatever a user set in numba.config in code: it is told this change is known
            reloader.old_environ["NUMBA_CACHE_DIR"] = str(folder)
    return folder
