"""vtrain.numba_cache: numba's cache in one folder per version of the sources, so that a kernel never runs a
stale compiled copy of another module's kernel (numba keys each kernel's cache on its own file alone)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vtrain.numba_cache import PREFIX, source_digest, use_source_keyed_cache

ROOT = Path(__file__).resolve().parents[2]
CALLEE = "from numba import njit\n\n\n@njit(cache=True)\ndef f(x):\n    return x + {}\n"
CALLER = "from numba import njit\n\nfrom {0} import a\n\n\n@njit(cache=True)\ndef g(x):\n    return a.f(x) * 10\n"
KEYED = "from pathlib import Path\n\nfrom vtrain.numba_cache import use_source_keyed_cache\n\n" \
        "use_source_keyed_cache(Path(__file__).parent)\n"


def _package(tmp: Path, name: str, keyed: bool) -> Path:
    pkg = tmp / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(KEYED if keyed else "")
    (pkg / "a.py").write_text(CALLEE.format(1))
    (pkg / "b.py").write_text(CALLER.format(name))
    return pkg


def _edit_callee(pkg: Path) -> None:
    """Change only a.py (a later modification time, as any edit or checkout gives it)."""
    path = pkg / "a.py"
    before = path.stat().st_mtime_ns
    path.write_text(CALLEE.format(2))
    os.utime(path, ns=(before + 10**9, before + 10**9))


def _g_of_one(tmp: Path, name: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "VTRAIN_NUMBA_CACHE_BASE")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp), str(ROOT)])
    done = subprocess.run([sys.executable, "-c", f"from {name} import b; print(b.g(1))"], env=env, cwd=tmp,
                          capture_output=True, text=True, timeout=300, check=True)
    return done.stdout.strip()


def test_a_caller_compiles_afresh_when_only_its_callee_changed(tmp_path: Path) -> None:
    keyed, plain = _package(tmp_path, "keyed", True), _package(tmp_path, "plain", False)
    assert _g_of_one(tmp_path, "keyed") == _g_of_one(tmp_path, "plain") == "20"
    for pkg in (keyed, plain):
        _edit_callee(pkg)
    # numba's own keys: b.py is unchanged, so g's cache, with f's old code compiled into it, is loaded
    assert _g_of_one(tmp_path, "plain") == "20"
    # keyed by every source: g is compiled with the f that is there now
    assert _g_of_one(tmp_path, "keyed") == "30"
    folders = sorted(p.name for p in (keyed / "__pycache__").glob(f"{PREFIX}*"))
    assert folders == [f"{PREFIX}{source_digest(keyed)}"]  # (the first version's folder removed)


def test_the_digest_follows_every_source_and_only_sources(tmp_path: Path) -> None:
    pkg = _package(tmp_path, "p", False)
    (pkg / "sub").mkdir()
    (pkg / "sub" / "c.py").write_text("x = 1\n")
    first = source_digest(pkg)
    (pkg / "notes.txt").write_text("not a source")
    assert source_digest(pkg) == first
    path = pkg / "sub" / "c.py"
    path.write_text("x = 2\n")  # (the same size)
    os.utime(path, ns=(path.stat().st_mtime_ns + 10**9,) * 2)
    assert source_digest(pkg) != first


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("NUMBA_CACHE_DIR", "VTRAIN_NUMBA_CACHE_BASE"):
        monkeypatch.delenv(name, raising=False)
    from numba.core import config

    monkeypatch.setattr(config, "CACHE_DIR", config.CACHE_DIR)  # (restored after the test)
    return monkeypatch


def test_the_folder_is_set_for_numba_and_for_child_processes(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    from numba.core import config

    pkg = _package(tmp_path, "p", False)
    stale = pkg / "__pycache__" / f"{PREFIX}0123456789abcdef"
    stale.mkdir(parents=True)
    folder = use_source_keyed_cache(pkg)
    assert folder == pkg / "__pycache__" / f"{PREFIX}{source_digest(pkg)}"
    assert os.environ["NUMBA_CACHE_DIR"] == config.CACHE_DIR == str(folder)
    assert not stale.exists()
    # a child process (the same package) inherits both variables and keeps the folder, not nesting it
    assert use_source_keyed_cache(pkg) == folder


def test_a_users_cache_folder_holds_the_versions_and_keeps_its_own(tmp_path: Path,
                                                                   clean_env: pytest.MonkeyPatch) -> None:
    pkg = _package(tmp_path, "p", False)
    user = tmp_path / "user-cache"
    other = user / f"{PREFIX}fedcba9876543210"  # (another checkout's, perhaps)
    other.mkdir(parents=True)
    clean_env.setenv("NUMBA_CACHE_DIR", str(user))
    assert use_source_keyed_cache(pkg) == user / f"{PREFIX}{source_digest(pkg)}"
    assert other.exists()


def test_an_unwritable_base_leaves_numba_its_own_choice(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    pkg = _package(tmp_path, "p", False)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    clean_env.setenv("NUMBA_CACHE_DIR", str(blocker / "cache"))  # (a folder cannot be made under a file)
    assert use_source_keyed_cache(pkg) is None
    assert os.environ["NUMBA_CACHE_DIR"] == str(blocker / "cache")
