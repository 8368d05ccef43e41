"""vtrain.numba_cache: numba's cache in one folder per version of the sources, so that a kernel never runs a
stale compiled copy of another module's kernel (numba keys each kernel's cache on its own file alone)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from numba.core import caching

from vtrain import numba_cache
from vtrain.numba_cache import PREFIX, STALE_SECONDS, source_digest, use_source_keyed_cache

ROOT = Path(__file__).resolve().parents[2]
CALLEE = "from numba import njit\n\n\n@njit(cache=True)\ndef f(x):\n    return x + {}\n"
CALLER = "from numba import njit\n\nfrom {0} import a\n\n\n@njit(cache=True)\ndef g(x):\n    return a.f(x) * 10\n"
KEYED = "from pathlib import Path\n\nfrom vtrain.numba_cache import use_source_keyed_cache\n\n" \
        "use_source_keyed_cache(Path(__file__).parent)\n"
OURS = ("NUMBA_CACHE_DIR", "VTRAIN_NUMBA_CACHE_BASE", "VTRAIN_NUMBA_CACHE_FOLDER")  # (the variables it sets)


def _package(tmp: Path, name: str, keyed: bool) -> Path:
    pkg = tmp / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text(KEYED if keyed else "")
    (pkg / "a.py").write_text(CALLEE.format(1))
    (pkg / "b.py").write_text(CALLER.format(name))
    return pkg


def _edit_callee(pkg: Path) -> None:
    """Change only a.py, a later modification time as any edit or checkout gives it (numba's own key)."""
    path = pkg / "a.py"
    before = path.stat().st_mtime_ns
    path.write_text(CALLEE.format(2))
    os.utime(path, ns=(before + 10**9, before + 10**9))


def _age(path: Path) -> None:
    """Make path look written to STALE_SECONDS and more ago."""
    then = time.time() - 2 * STALE_SECONDS
    os.utime(path, (then, then))


def _python(tmp: Path, code: str) -> str:
    """code's output in a fresh interpreter, tmp and the repository importable, none of this process's cache
    settings inherited."""
    env = {k: v for k, v in os.environ.items() if k not in OURS}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp), str(ROOT)])
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp, capture_output=True, text=True,
                          timeout=300, check=True)
    return done.stdout.strip()


def _g_of_one(tmp: Path, name: str) -> str:
    return _python(tmp, f"from {name} import b; print(b.g(1))")


def test_a_caller_compiles_afresh_when_only_its_callee_changed(tmp_path: Path) -> None:
    keyed, plain = _package(tmp_path, "keyed", True), _package(tmp_path, "plain", False)
    assert _g_of_one(tmp_path, "keyed") == _g_of_one(tmp_path, "plain") == "20"
    first = keyed / "__pycache__" / f"{PREFIX}{source_digest(keyed)}"
    assert first.is_dir()
    _age(first)  # (a version nothing has run for a while: its folder goes)
    for pkg in (keyed, plain):
        _edit_callee(pkg)
    # numba's own keys: b.py is unchanged, so g's cache, with f's old code compiled into it, is loaded
    assert _g_of_one(tmp_path, "plain") == "20"
    # keyed by every source: g is compiled with the f that is there now
    assert _g_of_one(tmp_path, "keyed") == "30"
    assert sorted(p.name for p in (keyed / "__pycache__").glob(f"{PREFIX}*")) == [f"{PREFIX}{source_digest(keyed)}"]


def test_vtrain_kernels_cache_in_the_versions_folder_and_import_vtrain_loads_no_numba(tmp_path: Path) -> None:
    folder = ROOT / "vtrain" / "__pycache__" / f"{PREFIX}{source_digest(ROOT / 'vtrain')}"
    for first in ("", "import numba; "):  # (numba loaded before vtrain, or by it)
        path = _python(tmp_path, f"{first}import vtrain.fused as f; print(f._round_in_place._cache._cache_path)")
        assert Path(path).parent == folder
    assert _python(tmp_path, "import sys, vtrain; print('numba' in sys.modules)") == "False"


def test_the_digest_follows_every_sources_contents_and_only_sources(tmp_path: Path) -> None:
    pkg = _package(tmp_path, "p", False)
    (pkg / "sub").mkdir()
    path = pkg / "sub" / "c.py"
    path.write_text("x = 1\n")
    first = source_digest(pkg)
    (pkg / "notes.txt").write_text("not a source")
    _age(path)  # (a new time, the same contents)
    assert source_digest(pkg) == first
    path.write_text("x = 2\n")  # (the same size)
    _age(path)
    assert source_digest(pkg) != first


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    from numba.core import config

    for name in OURS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(config, "CACHE_DIR", config.CACHE_DIR)  # (restored after the test)
    monkeypatch.setattr(config._env_reloader, "old_environ", dict(config._env_reloader.old_environ))
    return monkeypatch


def test_the_folder_is_numbas_and_a_childs_and_only_stale_entries_go(tmp_path: Path,
                                                                     clean_env: pytest.MonkeyPatch) -> None:
    from numba.core import config

    pkg = _package(tmp_path, "p", False)
    cache = pkg / "__pycache__"
    stale, recent = cache / f"{PREFIX}0123456789abcdef", cache / f"{PREFIX}fedcba9876543210"
    old_index, new_index, other = cache / "a.f-3.py311.nbi", cache / "b.g-5.py311.nbi", cache / "a.cpython-311.pyc"
    for d in (stale, recent):
        d.mkdir(parents=True)
    for f in (old_index, new_index, other):
        f.write_text("")
    for path in (stale, old_index, other):
        _age(path)
    folder = use_source_keyed_cache(pkg)
    assert folder == cache / f"{PREFIX}{source_digest(pkg)}"
    assert os.environ["NUMBA_CACHE_DIR"] == config.CACHE_DIR == str(folder)
    assert not stale.exists() and not old_index.exists()  # (another version's, numba's own per-file cache)
    assert recent.exists() and new_index.exists() and other.exists()  # (in use lately; not numba's)
    # a child process (the same package) inherits the variables and keeps the folder, not nesting it
    assert use_source_keyed_cache(pkg) == folder
    # one given a NUMBA_CACHE_DIR of its own makes the version's folder there
    clean_env.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    assert use_source_keyed_cache(pkg) == tmp_path / "mine" / folder.name


def test_numbas_settings_made_in_code_outlive_the_change(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # numba re-reads all its settings from the environment when it sees the environment changed
    from numba.core import config

    clean_env.setattr(config, "BOUNDSCHECK", 1)
    use_source_keyed_cache(_package(tmp_path, "p", False))
    config.reload_config()  # (as numba's compiler calls it)
    assert config.BOUNDSCHECK == 1


def test_a_users_cache_folder_holds_the_versions_and_keeps_its_own(tmp_path: Path,
                                                                   clean_env: pytest.MonkeyPatch) -> None:
    pkg = _package(tmp_path, "p", False)
    user = tmp_path / "user-cache"
    other = user / f"{PREFIX}fedcba9876543210"  # (another checkout's, perhaps)
    other.mkdir(parents=True)
    _age(other)
    clean_env.setenv("NUMBA_CACHE_DIR", str(user))
    assert use_source_keyed_cache(pkg) == user / f"{PREFIX}{source_digest(pkg)}"
    assert other.exists()


def test_a_read_only_package_caches_in_the_users_cache_folder(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    pkg = _package(tmp_path, "p", False)
    (pkg / "__pycache__").write_text("")  # (no folder can be made there: as in an install the user cannot write)
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    assert use_source_keyed_cache(pkg) == tmp_path / "home-cache" / "vtrain-numba" / f"{PREFIX}{source_digest(pkg)}"


def test_an_unwritable_base_leaves_numba_its_own_choice(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    pkg = _package(tmp_path, "p", False)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    clean_env.setenv("NUMBA_CACHE_DIR", str(blocker / "cache"))  # (a folder cannot be made under a file)
    assert use_source_keyed_cache(pkg) is None
    assert os.environ["NUMBA_CACHE_DIR"] == str(blocker / "cache")


def _interleaved_saves(tmp_path: Path, save: Any) -> dict:
    """Two processes' cache files over one folder save two signatures of one kernel with `save`: B, whose index
    was read before A wrote anything, saves whole just before A writes its data file. What a reader then finds
    for each key its index lists."""
    tmp_path.mkdir()
    a, b = (caching.IndexDataCacheFile(str(tmp_path), "m.f-1.py311", ("stamp", 1)) for _ in range(2))
    ka, kb = (("(float64 2d,)", "machine"), "code"), (("(float64 3d,)", "machine"), "code")
    b._load_index = lambda: {}  # (read before A saved)
    write = a._save_data

    def racing(name: str, data: Any) -> None:
        a._save_data = write
        save(b, kb, "b's code")
        write(name, data)

    a._save_data = racing
    save(a, ka, "a's code")
    reader = caching.IndexDataCacheFile(str(tmp_path), "m.f-1.py311", ("stamp", 1))
    return {key: reader.load(key) for key in reader._load_index()}


def test_cache_files_are_named_by_key_so_concurrent_saves_never_mix_signatures(tmp_path: Path) -> None:
    """numba numbers a kernel's data files from an index it reads and rewrites unlocked, and loads what an entry
    names unchecked: in this interleaving its own save leaves one signature's entry naming the other's code (a
    later process then ran that code on the wrong arrays). Named by key, every entry loads its own key's code."""
    import vtrain.fused  # noqa: F401, PLC0415 (imports numba and names its files by key)

    assert caching.IndexDataCacheFile.save is numba_cache._save_keyed
    theirs = _interleaved_saves(tmp_path / "numba", numba_cache._numbas_save)
    assert theirs == {(("(float64 3d,)", "machine"), "code"): "a's code"}  # (b's entry, a's code)
    ours = _interleaved_saves(tmp_path / "keyed", numba_cache._save_keyed)
    assert ours == {(("(float64 2d,)", "machine"), "code"): "a's code",
                    (("(float64 3d,)", "machine"), "code"): "b's code"}


def test_every_vtrain_module_that_imports_numba_names_its_files_by_key() -> None:
    """Each module of vtrain that compiles kernels, imported alone in a fresh interpreter, has numba's cache name
    its files by key before any kernel compiles."""
    modules = sorted(p.stem for p in (ROOT / "vtrain").glob("*.py") if re.search("^from numba", p.read_text(), re.M))
    assert {"fused", "exactdot", "state", "prefilter"} <= set(modules)
    check = "from numba.core import caching; import vtrain.{}; from vtrain import numba_cache; " \
            "print(caching.IndexDataCacheFile.save is numba_cache._save_keyed)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runs = {m: subprocess.Popen([sys.executable, "-c", check.format(m)], env=env, stdout=subprocess.PIPE, text=True)
            for m in modules}
    assert {m: run.communicate(timeout=300)[0].strip() for m, run in runs.items()} == {m: "True" for m in modules}
