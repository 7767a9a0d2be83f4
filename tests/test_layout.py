"""The package keeps its shape (issue #18's rules, checked by ``tools/layout_check.py``): at most
ten modules at the root of ``envbuild/``, none over 500 lines, no import cycle, also through
imports inside functions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_package_keeps_its_shape() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "layout_check.py"), "--lazy"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_check_finds_a_cycle(tmp_path: Path) -> None:
    """The checker itself can fail: two modules importing each other inside functions."""
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        import layout_check
    finally:
        sys.path.remove(str(ROOT / "tools"))
    pkg = tmp_path / "envbuild"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from envbuild import b\n")
    (pkg / "b.py").write_text("import envbuild.a\n")
    modules = {"envbuild", "envbuild.a", "envbuild.b"}
    graph = {
        "envbuild.a": layout_check.imports(pkg / "a.py", modules, lazy=True, root=tmp_path),
        "envbuild.b": layout_check.imports(pkg / "b.py", modules, lazy=True, root=tmp_path),
    }
    assert layout_check.cycles(graph) == [["envbuild.a", "envbuild.b"]]
    graph["envbuild.a"] = layout_check.imports(pkg / "a.py", modules, lazy=False, root=tmp_path)
    assert layout_check.cycles(graph) == []
