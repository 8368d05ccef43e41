"""Only the CLI talks to the user: the protocol library never imports click, prints or exits (style.md)."""

from __future__ import annotations

import ast
from pathlib import Path

from protokit import REPO

PROTOCOL = REPO / "protocol"


def _offences(path: Path, root: Path = REPO) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [f"imports {a.name}" for a in node.names if a.name.split(".")[0] == "click"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "click":
            found.append(f"imports {node.module}")
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f"{getattr(f.value, 'id', '?')}.{f.attr}" if isinstance(
                f, ast.Attribute) else ""
            if name in ("print", "input", "exit", "quit", "sys.exit", "os._exit"):
                found.append(f"calls {name}()")
    return [f"{path.relative_to(root)}:{o}" for o in found]


def test_the_library_neither_imports_click_nor_prints_nor_exits() -> None:
    files = [p for p in PROTOCOL.rglob("*.py") if "cli" not in p.relative_to(PROTOCOL).parts]
    assert len(files) >= 15
    assert [o for f in files for o in _offences(f)] == []


def test_the_check_sees_an_offence(tmp_path: Path) -> None:
    f = tmp_path / "x.py"
    f.write_text("import click\nimport sys\ndef f():\n    print('x')\n    sys.exit(1)\n")
    assert _offences(f, tmp_path) == ["x.py:imports click", "x.py:calls print()", "x.py:calls sys.exit()"]
