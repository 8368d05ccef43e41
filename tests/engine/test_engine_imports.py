"""The library never imports the protocol side or click (DESIGN.md, style.md)."""

from __future__ import annotations

import ast
from pathlib import Path

VTRAIN = Path(__file__).resolve().parents[2] / "vtrain"
FORBIDDEN = ("protocol", "click")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_vtrain_imports_neither_protocol_nor_click():
    files = sorted(VTRAIN.rglob("*.py"))
    assert len(files) >= 10
    bad = [f"{f.relative_to(VTRAIN.parent)}: {m}" for f in files for m in _imports(f)
           if m.split(".")[0] in FORBIDDEN]
    assert bad == []


def test_the_check_sees_a_forbidden_import(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from protocol.cli import main\n    import click.testing\n")
    assert [m.split(".")[0] for m in _imports(f)] == ["protocol", "click"]
