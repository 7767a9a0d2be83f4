"""``tools/moves.py`` moves modules and rewrites every reference, and a second run changes
nothing (the lead re-runs it over a merged tree). The modules here are made up, so a run of the
real table leaves this file alone."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import moves  # noqa: E402

sys.path.remove(str(ROOT / "tools"))

FILES = {
    "envbuild/__init__.py": "",
    "envbuild/alpha/__init__.py": (
        '"""The lock."""\n\nfrom envbuild.alpha.model import Lock\n\n\ndef read():\n'
        "    return Lock\n"
    ),
    "envbuild/alpha/model.py": "class Lock:\n    pass\n",
    "envbuild/beta/__init__.py": "",
    "envbuild/beta/wheels.py": "from .plan import P\n\n\ndef pick():\n    return P\n",
    "envbuild/beta/plan.py": "P = 1\n",
    "envbuild/beta/user.py": (
        "from envbuild.beta import wheels  # noqa: F401\n"
        "from envbuild.alpha import Lock, model, read\n"
        "from .wheels import pick\n"
    ),
    "tests/test_x.py": (
        "import envbuild.beta.wheels\n"
        "from envbuild import alpha\n\n"
        'TARGET = "envbuild.alpha.read"\n'
        'OTHER = "envbuild.alpha.model.Lock"\n'
        "x = envbuild.beta.wheels.pick\n"
        'WHERE = ["alpha/__init__.py:read", "envbuild/beta/wheels.py", "beta/wheels.pyc"]\n'
    ),
}
TABLE = {
    "envbuild.alpha": "envbuild.alpha.core",
    "envbuild.beta.wheels": "envbuild.gamma.wheels",
    "envbuild.alpha.model": "envbuild.gamma.model",  # a child of a package whose __init__ moves
}


def _imports(text: str) -> set[tuple[str, str]]:
    return {
        (node.module or "", a.name)
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.ImportFrom)
        for a in node.names
    }


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_moves_rewrite_every_reference(tmp_path: Path) -> None:
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    assert moves.main([], root=tmp_path, table=TABLE) == 0
    read = {name: p.read_text() for name in FILES if (p := tmp_path / name).exists()}
    assert read["envbuild/alpha/__init__.py"] == '"""The lock."""\n'
    core = (tmp_path / "envbuild/alpha/core.py").read_text()
    assert "from envbuild.gamma.model import Lock" in core
    moved = (tmp_path / "envbuild/gamma/wheels.py").read_text()
    assert "from envbuild.beta.plan import P" in moved  # the relative import, made absolute
    assert not (tmp_path / "envbuild/beta/wheels.py").exists()
    user = read["envbuild/beta/user.py"]
    assert "wheels,  # noqa: F401" in user  # the comment stays with its import
    assert _imports(user) == {
        ("envbuild.gamma", "wheels"),
        ("envbuild.gamma", "model"),  # a moved child of the package
        ("envbuild.gamma.model", "Lock"),  # a re-export: from where it is defined
        ("envbuild.alpha.core", "read"),
        ("envbuild.gamma.wheels", "pick"),
    }
    test = read["tests/test_x.py"]
    assert "import envbuild.gamma.wheels\n" in test
    assert "from envbuild.alpha import core as alpha" in test
    assert '"envbuild.alpha.core.read"' in test
    assert '"envbuild.gamma.model.Lock"' in test
    assert "x = envbuild.gamma.wheels.pick" in test
    assert '["alpha/core.py:read", "envbuild/gamma/wheels.py", "beta/wheels.pyc"]' in test
    _git(tmp_path, "add", "-A")
    after = {p: p.read_text() for p in tmp_path.rglob("*.py")}
    assert moves.main([], root=tmp_path, table=TABLE) == 0  # a second run changes nothing
    assert {p: p.read_text() for p in tmp_path.rglob("*.py")} == after
