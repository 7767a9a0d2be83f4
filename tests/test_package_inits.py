"""A package's ``__init__.py`` says what the package is and may name what it offers (imports
and ``__all__``); its code lives in modules named for their job (issue #27). The package's
version string is the one exception."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _logic(path: Path, root: Path = REPO) -> list[str]:
    """The statements of ``path`` that are neither its docstring, an import nor ``__all__``."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] in (
            ["__all__"],
            ["__version__"],
        ):
            continue
        found.append(f"{path.relative_to(root)}:{node.lineno} {type(node).__name__}")
    return found


def test_no_package_init_holds_code() -> None:
    inits = sorted((REPO / "envbuild").rglob("__init__.py"))
    assert len(inits) > 10
    assert [line for init in inits for line in _logic(init)] == []


def test_the_rule_sees_code(tmp_path: Path) -> None:
    planted = REPO / "envbuild" / "__init__.py"
    text = planted.read_text()
    assert _logic(planted) == []
    copy = tmp_path / "envbuild" / "__init__.py"
    copy.parent.mkdir()
    copy.write_text(text + "\n\ndef helper() -> int:\n    return 1\n")
    assert _logic(copy, tmp_path) == [
        f"envbuild/__init__.py:{len(text.splitlines()) + 3} FunctionDef"
    ]
