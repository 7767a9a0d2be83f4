"""``tools/renames.py`` (issue #27's one name per idea): no old name is left in the tree, and
the rewriter renames tokens, import paths and patch strings without touching longer names, data
strings or lines marked to keep."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("renames", ROOT / "tools" / "renames.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["renames"] = module
    spec.loader.exec_module(module)
    return module


renames = _tool()


def test_no_old_name_remains() -> None:
    argv = [sys.executable, "tools/renames.py", "--check"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr


def test_imports_and_patch_strings() -> None:
    source = (
        "from envbuild.apply.statelock import state_lock\n"
        "import envbuild.sourcebuild.realise as r\n"
        "from envbuild.apply import statelock\n"
        "statelock.state_lock(p)\n"
        'mock.patch("envbuild.apply.statelock.state_lock", f)\n'
        'monkeypatch.setattr("envbuild.store.blobs.Flock", g)\n'
    )
    assert renames.rewrite_python(source, "tests/test_x.py") == (
        "from envbuild.apply.stateguard import state_guard\n"
        "import envbuild.sourcebuild.realize as r\n"
        "from envbuild.apply import stateguard\n"
        "stateguard.state_guard(p)\n"
        'mock.patch("envbuild.apply.stateguard.state_guard", f)\n'
        'monkeypatch.setattr("envbuild.store.blobs.FileGuard", g)\n'
    )


def test_names_not_substrings_and_data_kept() -> None:
    source = (
        "Flocking = my_state_lock + state_lock_x\n"
        "envbuild.apply.statelocks = 1\n"
        'path = root / "locks" / "gc.lock"  # the files on disk keep their names\n'
    )
    assert renames.rewrite_python(source, "envbuild/x.py") == source


def test_method_of_one_class_only() -> None:
    source = (
        "got = store.build('k', {}, make)\n"
        "base = debian.build(store, spec, lock)\n"
        "def build(self): ...\n"
    )
    assert renames.rewrite_python(source, "envbuild/build/x.py") == (
        "got = store.realize('k', {}, make)\n"
        "base = debian.build(store, spec, lock)\n"
        "def build(self): ...\n"
    )
    defs = renames.rewrite_python("    def build(self): ...\n", "envbuild/store/core.py")
    assert defs == "    def realize(self): ...\n"


def test_scope_keyword_and_fstring() -> None:
    source = (
        "def layout(python): ...\n"
        "self.layout = layout(py)\n"
        "trees.create(key, layout=self.layout)\n"
        'msg = f"cannot open {paths.lock}: {Flock}"\n'
    )
    assert renames.rewrite_python(source, "envbuild/apply/assemble.py") == (
        "def install_recipe(python): ...\n"
        "self.recipe = install_recipe(py)\n"
        "trees.create(key, layout=self.recipe)\n"
        'msg = f"cannot open {paths.lock}: {FileGuard}"\n'
    )
    # the same `layout` out of the rule's scope is an OCI layout: it stays
    assert renames.rewrite_python(source, "envbuild/oci/x.py") == source.replace(
        "{Flock}", "{FileGuard}"
    )


def test_prose_and_keep_mark() -> None:
    text = (
        "Realising a generation, realised here.\n"
        "from envbuild.apply.builder import realise  # renames: keep\n"
    )
    assert renames.rewrite_text(text, "docs/x.md") == (
        "Realizing a generation, realized here.\n"
        "from envbuild.apply.builder import realise  # renames: keep\n"
    )


def test_check_finds_a_planted_old_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    (repo / "envbuild").mkdir(parents=True)
    planted = repo / "envbuild" / "x.py"
    planted.write_text("from envbuild.store.blobs import Flock\n\nGUARD = Flock\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    monkeypatch.setattr(renames, "ROOT", repo)
    assert renames.main(["--check"]) == 1
    assert renames.main([]) == 0
    assert planted.read_text() == (
        "from envbuild.store.blobs import FileGuard\n\nGUARD = FileGuard\n"
    )
    assert renames.main(["--check"]) == 0
