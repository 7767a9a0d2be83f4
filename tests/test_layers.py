"""Packages import in one direction (issue #27): ``tools/layout_check.py --packages --lazy``
checks every import between ``envbuild``'s packages against the layers in ``tools/layers.toml``."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import layout_check  # noqa: E402

sys.path.remove(str(ROOT / "tools"))


def test_the_packages_import_downward_only() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "layout_check.py"), "--packages", "--lazy"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        f = tmp_path / "envbuild" / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return tmp_path / "envbuild"


LAYERS = 'layers = [["errors"], ["middle"], ["build"]]\nallowed = []\n'


def test_the_check_finds_a_planted_upward_import(tmp_path: Path) -> None:
    """A middle module reaching up into build inside a function is found, with its file and line;
    at module level only the upward import inside the function is not counted."""
    pkg = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "errors.py": "",
            "middle/__init__.py": '"""Docstring only."""\n',
            "middle/core.py": (
                "from envbuild.errors import x\n\n\ndef f():\n    from envbuild.build import y\n"
            ),
            "build/__init__.py": "",
            "build/y.py": "from envbuild.middle.core import f\n",
        },
    )
    (tmp_path / "layers.toml").write_text(LAYERS)
    rank, allowed = layout_check.load_layers(tmp_path / "layers.toml")
    lazy = layout_check.package_edges(pkg, lazy=True, root=tmp_path)
    bad, missing = layout_check.upward(lazy, rank, allowed)
    assert [(e.source, e.target, e.file, e.line, e.lazy) for e in bad] == [
        ("middle", "build", "envbuild/middle/core.py", 5, True)
    ]
    assert missing == []
    eager = layout_check.package_edges(pkg, lazy=False, root=tmp_path)
    assert layout_check.upward(eager, rank, allowed) == ([], [])
    # an allowed exception silences it; a package in no layer is reported
    assert layout_check.upward(lazy, rank, {("middle", "build")}) == ([], [])
    assert layout_check.upward(lazy, {"middle": 0, "build": 1}, set())[1] == ["errors"]


def test_the_command_prints_the_upward_import(tmp_path: Path) -> None:
    """The real tree against layers with ``spec`` moved to the bottom: the command fails and
    prints spec's imports of higher packages with file and line."""
    layers = tmp_path / "layers.toml"
    text = (ROOT / "tools" / "layers.toml").read_text()
    assert '["scratch", "spec"]' in text
    text = text.replace('["scratch", "spec"]', '["scratch"]').replace(
        '["__init__",', '["spec", "__init__",'
    )
    layers.write_text(text)
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "layout_check.py"), "--packages", "--layers", layers],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1, done.stdout
    assert re.search(r"^envbuild/spec/\S+\.py:\d+: spec \(layer 0\) imports ", done.stdout, re.M)
