"""numba's compiled-kernel cache, in one folder per version of the package's sources.

numba keys each cached kernel on its own source file alone, but a kernel that calls kernels of other modules
keeps compiled copies of them (vtrain.resolve's of vtrain.exactdot's, vtrain.prefilter's of vtrain.fused's).
After an update that changed only the called module, numba would load the caller's old copy: the package
would then compute with code that is no longer in it, and two machines on the same commit could differ.
Keyed by every source file instead, the cache of any other version is never read: a changed package compiles
afresh once (about a minute for the test suite), and older folders are removed.

Imported by vtrain/__init__.py before any module that compiles: the folder must be set before numba creates
a kernel's cache. It imports no numba itself (the chain side imports vtrain without it); where numba is
already loaded, its config is set directly.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

PREFIX = "numba-"
# The base the first vtrain import of a process tree found (a user's NUMBA_CACHE_DIR, or empty for the package's
# __pycache__): the NUMBA_CACHE_DIR a child process inherits is its parent's choice, not a user's.
_BASE_VAR = "VTRAIN_NUMBA_CACHE_BASE"


def source_digest(package: Path) -> str:
    """A digest of the package's Python sources: names, sizes and modification times (a changed file, even one
    of the same size, has a new time; the stats spare every process reading 0.6 MB of sources)."""
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        st = path.stat()
        h.update(f"{path.relative_to(package).as_posix()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def use_source_keyed_cache(package: Path) -> Path | None:
    """Point numba's cache at `<base>/numba-<digest of package's sources>`; the folder, or None where the base
    cannot be written (numba's own choice then stands). The base is the package's __pycache__, whose other
    such folders are removed, or a NUMBA_CACHE_DIR the user set, left as it is but for the new folder."""
    base_text = os.environ.get(_BASE_VAR)
    if base_text is None:  # (this process's own choice, not one inherited from a parent's)
        base_text = os.environ.get("NUMBA_CACHE_DIR", "")
        os.environ[_BASE_VAR] = base_text
    base = Path(base_text) if base_text else package / "__pycache__"
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if not os.access(base, os.W_OK):
        return None
    folder = base / f"{PREFIX}{source_digest(package)}"
    if not base_text:  # (a user's folder may serve other checkouts too: theirs are not ours to remove)
        for old in base.glob(f"{PREFIX}*"):
            if old != folder and old.is_dir():
                import shutil  # noqa: PLC0415 (~2 ms an import, and most processes find nothing to remove)

                shutil.rmtree(old, ignore_errors=True)  # (another version's: never read again)
    os.environ["NUMBA_CACHE_DIR"] = str(folder)
    if "numba" in sys.modules:  # (numba read its environment when it was imported)
        from numba.core import config  # noqa: PLC0415

        config.CACHE_DIR = str(folder)
    return folder
