"""Bad input gets one clear message and exit 2, never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
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


def _as_plain_user(argv: list[str]) -> list[str]:
    """``argv`` run so that permission bits bind: as is for a plain user; for root through
    ``setpriv`` with CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH gone from the bounding and
    inheritable sets, so the program it executes (and that program's children) never has them."""
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    assert setpriv, "setpriv (util-linux) is needed to drop root's file-access capabilities"
    caps = "-dac_override,-dac_read_search"
    return [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}", *argv]


def test_a_file_the_user_cannot_read(venv: Path) -> None:
    """A recorded file the snapshot cannot read stops it with exit 2 naming the file. chmod 000
    means nothing to root, so the CLI runs in a subprocess without root's file-access powers."""
    model = site_packages(venv) / "alpha" / "models" / "llama.py"
    model.chmod(0o000)
    env = {"PATH": os.environ["PATH"], "HOME": str(venv.parent), "PYTHONPATH": str(REPO)}
    try:
        # the subprocess really cannot read it (else this test would prove nothing) …
        probe = subprocess.run(
            _as_plain_user([sys.executable, "-c", f"open({str(model)!r}).read()"]),
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert probe.returncode == 1 and "PermissionError" in probe.stderr, probe.stderr
        # … and the snapshot says so, cleanly
        done = subprocess.run(
            _as_plain_user(
                [sys.executable, "-m", "envbuild", "snapshot", "--python", str(venv),
                 "--no-docker", "--no-systemd", "--no-models"]
            ),
            env=env, cwd=venv.parent, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        model.chmod(0o644)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert any(line.startswith("error: ") for line in done.stderr.splitlines()), done.stderr
    assert "cannot check every file" in done.stderr
    assert "llama.py (alpha): Permission denied" in done.stderr
