"""Bad input gets one clear message and exit 2, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from snapshot.conftest import site_packages

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "h200-snapshot.json"
REPO = Path(__file__).resolve().parent.parent.parent


def fails_cleanly(result: Any, *needles: str) -> None:
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert any(line.startswith("error: ") for line in result.stderr.splitlines())
    for needle in needles:
        assert needle in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["diff", "verify"])
def test_a_truncated_manifest(cli: Any, tmp_path: Path, command: str) -> None:
    bad = tmp_path / "cut.json"
    bad.write_text(FIXTURE.read_text()[:5000])
    args = [bad, FIXTURE] if command == "diff" else [bad]
    fails_cleanly(cli(command, *args), "cut.json:", "not valid JSON", "truncated")


def test_a_hand_edited_manifest(cli: Any, tmp_path: Path) -> None:
    data = json.loads(FIXTURE.read_text())
    data["gpu"]["gpus"][0]["memory_total_bytes"] = "lots"
    data["host"]["favourite_colour"] = "blue"
    bad = tmp_path / "edited.json"
    bad.write_text(json.dumps(data))
    result = cli("diff", FIXTURE, bad)
    fails_cleanly(
        result,
        "invalid snapshot",
        "gpu.gpus.0.memory_total_bytes",
        "host.favourite_colour: Extra inputs are not permitted",
    )
    assert "written by envbuild, not by hand" in result.stderr


def test_a_manifest_from_a_newer_schema(cli: Any, tmp_path: Path) -> None:
    data = json.loads(FIXTURE.read_text())
    data["schema_version"] = 2
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps(data))
    fails_cleanly(cli("verify", newer), "schema version 2 is newer", "upgrade envbuild")


@pytest.mark.parametrize(
    "content", ["", "[1, 2]", '{"kind": "something.else", "schema_version": 1}']
)
def test_not_a_snapshot(cli: Any, tmp_path: Path, content: str) -> None:
    bad = tmp_path / "x.json"
    bad.write_text(content)
    fails_cleanly(cli("verify", bad), "x.json")


def test_a_missing_manifest(cli: Any, tmp_path: Path) -> None:
    fails_cleanly(cli("diff", tmp_path / "nope.json", FIXTURE), "nope.json: no such file")


@pytest.mark.parametrize("kind", ["text", "script", "missing", "directory"])
def test_a_python_that_is_not_a_python(cli: Any, tmp_path: Path, kind: str) -> None:
    target = tmp_path / "python"
    if kind == "text":
        target.write_text("not a program\n")
    elif kind == "script":
        target.write_text("#!/bin/sh\necho hello\n")
        target.chmod(0o755)
    elif kind == "directory":
        target.mkdir()
    result = cli("snapshot", "--python", target, "--no-docker", "--no-systemd", "--no-models")
    fails_cleanly(result, str(target))
    assert result.stdout == ""


def test_a_fifo_in_a_venv_is_unreadable_not_a_hang(cli: Any, venv: Path) -> None:
    """A path RECORD lists that is a FIFO: opening it for reading would block forever."""
    model = site_packages(venv) / "alpha" / "models" / "llama.py"
    model.unlink()
    os.mkfifo(model)
    result = cli("snapshot", "--python", venv, "--no-docker", "--no-systemd", "--no-models")
    fails_cleanly(result, "cannot check every file", "llama.py (alpha): not a regular file")


def test_a_dangling_symlink_in_a_venv(cli: Any, venv: Path) -> None:
    model = site_packages(venv) / "alpha" / "models" / "llama.py"
    model.unlink()
    model.symlink_to(venv / "gone.py")
    for quick in ((), ("--quick",)):
        result = cli("snapshot", "--python", venv, *quick, "--no-docker", "--no-systemd",
                     "--no-models")  # fmt: skip
        fails_cleanly(result, "llama.py (alpha): broken symbolic link")


@pytest.fixture
def world_readable_venv(base_venv: Path) -> Iterator[Path]:
    """A copy of the venv where an unprivileged user can reach it (pytest's tmp is 0700)."""
    top = Path(tempfile.mkdtemp(prefix="envbuild-unreadable-"))
    top.chmod(0o755)
    venv = top / "venv"
    shutil.copytree(base_venv, venv, symlinks=True)
    try:
        yield venv
    finally:
        shutil.rmtree(top)


@pytest.mark.skipif(os.geteuid() != 0, reason="drops privileges: needs to start as root")
def test_a_file_the_user_cannot_read(world_readable_venv: Path) -> None:
    """chmod 000 means nothing to root, so the CLI runs as nobody, in a subprocess."""
    model = site_packages(world_readable_venv) / "alpha" / "models" / "llama.py"
    model.chmod(0o000)
    nobody = 65534
    env = {"PATH": os.environ["PATH"], "HOME": "/nonexistent", "PYTHONPATH": str(REPO)}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "envbuild", "snapshot", "--python", str(world_readable_venv),
             "--no-docker", "--no-systemd", "--no-models"],
            user=nobody, group=nobody, extra_groups=[], env=env, cwd="/",
        capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    except PermissionError as exc:
        pytest.skip(f"nobody cannot run this Python ({exc})")
    if "Permission denied" in done.stderr and "llama.py" not in done.stderr:
        pytest.skip(f"nobody cannot run this Python here: {done.stderr.strip()[:200]}")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "llama.py (alpha): Permission denied" in done.stderr
