"""The link check in `snapshot`, `diff` and `verify`: a group of its own per environment."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from snapshot.conftest import site_packages

Cli = Any
SCOPE = ("--no-docker", "--no-systemd", "--no-models")

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def broken_extension(venv: Path, tmp_path: Path) -> Path:
    """An extension module in alpha's folder that needs a library nobody has."""
    stub = tmp_path / "stub" / "libgone.so.1"
    stub.parent.mkdir()
    src = tmp_path / "x.c"
    src.write_text("int gone(void) { return 1; }\n")
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-soname,libgone.so.1", "-o", str(stub), str(src)],
        check=True,
    )
    src.write_text("int gone(void); int PyInit_fast(void) { return gone(); }\n")
    ext = site_packages(venv) / "alpha" / "fast.cpython-311-x86_64-linux-gnu.so"
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-o",
            str(ext),
            str(src),
            f"-L{stub.parent}",
            "-l:libgone.so.1",
        ],
        check=True,
    )
    shutil.rmtree(stub.parent)
    return ext


def test_snapshot_records_findings_and_verify_reports_them(
    cli: Cli, venv: Path, tmp_path: Path
) -> None:
    before = tmp_path / "before.json"
    assert cli("snapshot", "--python", venv, *SCOPE, "-o", before).exit_code == 0
    assert json.loads(before.read_text())["pythons"][0]["links"] == []

    ext = broken_extension(venv, tmp_path)
    after = tmp_path / "after.json"
    shown = cli("snapshot", "--python", venv, *SCOPE, "-o", after)
    assert shown.exit_code == 0
    assert f"  will not load: {ext} (no distribution) needs libgone.so.1 (" in shown.stdout
    [finding] = json.loads(after.read_text())["pythons"][0]["links"]
    assert finding["file"] == str(ext) and finding["missing"] == ["libgone.so.1"]
    assert finding["kind"] == "library" and finding["loaded"] is True

    verify = cli("verify", before, "--json").json()
    [group] = [g for g in verify["groups"] if g["key"].startswith("links ")]
    assert group["title"] == f"files that will not load ({venv})"
    [change] = group["changes"]
    assert change["subject"].startswith("lib/python")
    assert "needs libgone.so.1" in change["after"]
    text = cli("verify", before)
    assert text.exit_code == 1
    assert f"files that will not load ({venv}):" in text.stdout.splitlines()
    assert cli("verify", after).exit_code == 0  # recorded: no drift
