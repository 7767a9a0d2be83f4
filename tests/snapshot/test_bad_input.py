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
    data["schema_version"] = 3
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps(data))
    fails_cleanly(cli("verify", newer), "schema version 3 is newer", "upgrade envbuild")


def test_a_manifest_from_before_any_known_schema(cli: Any, tmp_path: Path) -> None:
    data = json.loads(FIXTURE.read_text())
    data["schema_version"] = 0
    older = tmp_path / "older.json"
    older.write_text(json.dumps(data))
    fails_cleanly(cli("verify", older), "snapshot schema version 0 is not known")


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


def _snapshot_as_plain_user(
    venv: Path, unreadable: Path, *, mode: int = 0o000
) -> subprocess.CompletedProcess[str]:
    """``envbuild snapshot --python VENV`` in a subprocess that cannot read ``unreadable`` (chmod
    ``mode``, which means nothing to root: see :func:`_as_plain_user`). Checks first that such a
    process really cannot read it, else the test would prove nothing."""
    before = unreadable.stat().st_mode & 0o777
    unreadable.chmod(mode)
    env = {"PATH": os.environ["PATH"], "HOME": str(venv.parent), "PYTHONPATH": str(REPO)}
    try:
        probe = subprocess.run(
            _as_plain_user([sys.executable, "-c", f"import os; p = {str(unreadable)!r}; "
                            "os.listdir(p) if os.path.isdir(p) else open(p).read()"]),
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert probe.returncode == 1 and "PermissionError" in probe.stderr, probe.stderr
        return subprocess.run(
            _as_plain_user(
                [sys.executable, "-m", "envbuild", "snapshot", "--python", str(venv),
                 "--no-docker", "--no-systemd", "--no-models"]
            ),
            env=env, cwd=venv.parent, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        unreadable.chmod(before)


def _failed_cleanly(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr
    assert any(line.startswith("error: ") for line in done.stderr.splitlines()), done.stderr
    for needle in needles:
        assert needle in done.stderr, done.stderr


def test_a_file_the_user_cannot_read(venv: Path) -> None:
    """A recorded file the snapshot cannot read stops it with exit 2 naming the file."""
    model = site_packages(venv) / "alpha" / "models" / "llama.py"
    done = _snapshot_as_plain_user(venv, model)
    _failed_cleanly(done, "cannot check every file", "llama.py (alpha): Permission denied")


def test_a_record_the_user_cannot_read(venv: Path) -> None:
    """Not "no RECORD": alpha would be listed as checked with no files, its files unrecorded."""
    record = site_packages(venv) / "alpha-1.0.dist-info" / "RECORD"
    done = _snapshot_as_plain_user(venv, record)
    _failed_cleanly(done, "cannot check every file", f"{record} (alpha): Permission denied")
    assert done.stderr.count("Permission denied") == 1


def test_site_packages_the_user_cannot_list(venv: Path) -> None:
    sp = site_packages(venv)
    done = _snapshot_as_plain_user(venv, sp, mode=0o311)  # may enter, may not list
    _failed_cleanly(done, f"cannot list its site-packages {sp}: Permission denied")


def test_a_folder_the_user_cannot_list(venv: Path) -> None:
    """Its recorded files can still be checked, but a debug file dropped into it could not be
    seen: the check would be incomplete."""
    models = site_packages(venv) / "alpha" / "models"
    done = _snapshot_as_plain_user(venv, models, mode=0o311)  # may enter, may not list
    _failed_cleanly(done, "cannot check every file", f"{models}: cannot list it: Permission denied")


@pytest.mark.parametrize("name", ["RECORD", "METADATA"])
def test_a_fifo_in_dist_info_is_unreadable_not_a_hang(venv: Path, name: str) -> None:
    """envbuild reads these itself before any file is hashed: opened for reading, a FIFO with
    no writer would block forever (a subprocess, so that a hang fails the test)."""
    fifo = site_packages(venv) / "alpha-1.0.dist-info" / name
    fifo.unlink()
    os.mkfifo(fifo)
    done = subprocess.run(
        [sys.executable, "-m", "envbuild", "snapshot", "--python", str(venv),
         "--no-docker", "--no-systemd", "--no-models"],
        env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    _failed_cleanly(done, f"{fifo} (alpha): not a regular file")
    assert done.stderr.count("not a regular file") == 1  # METADATA: RECORD lists it too


@pytest.mark.parametrize("what", ["file", "/etc/passwd"])
def test_an_hf_cache_that_is_not_a_folder(cli: Any, tmp_path: Path, what: str) -> None:
    path = Path(what)
    if what == "file":
        path = tmp_path / "hub"
        path.write_text("not a cache\n")
    result = cli("snapshot", "--hf-cache", path, "--no-docker", "--no-systemd")
    fails_cleanly(result, f"{path}: is not a folder", "hint: ", "--no-models")
    assert result.stdout == ""


def _built(**changes: Any) -> dict[str, Any]:
    """A build manifest as `envbuild build` writes it, with ``changes`` made by hand."""
    from envbuild.build.manifest import BuildManifest, BuiltLayer

    layer = BuiltLayer(
        name="python", kind="packages", key="k", digest="sha256:" + "a" * 64,
        diff_id="sha256:" + "b" * 64, size=2048, media_type="tar", distributions=["alpha==1.0"],
    )  # fmt: skip
    built = BuildManifest(
        generator="envbuild 0.1.0", spec="exp", spec_hash="c" * 64, lock_hash="d" * 64, base={},
        source_date_epoch=0, layers=[layer], config="sha256:" + "e" * 64,
        image="sha256:" + "1" * 64, outputs={},
    )  # fmt: skip
    return {**built.model_dump(mode="json"), **changes}


def test_a_build_manifest_from_a_newer_format(cli: Any, tmp_path: Path) -> None:
    newer = tmp_path / "images" / "exp" / "build-manifest.json"
    newer.parent.mkdir(parents=True)
    newer.write_text(json.dumps(_built(format=2)))
    needles = (f"{newer}: build manifest format 2 is newer", "upgrade envbuild")
    fails_cleanly(cli("diff", FIXTURE, newer), *needles)
    fails_cleanly(cli("diff", newer, FIXTURE), *needles)
    fails_cleanly(cli("snapshot", "--image", newer.parent, "--no-docker", "--no-systemd",
                      "--no-models"), *needles)  # fmt: skip
    newer.write_text(json.dumps(_built()))  # the same with this envbuild's format
    assert cli("diff", FIXTURE, newer).exit_code == 1


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ({"layers": "xx", "packages": {"alpha": "1.0"}}, "layers: Input should be a valid list"),
        ({"packages": {"alpha": 1.0}}, "packages.alpha: Input should be a valid string"),
        ({"packages": [{"name": "alpha"}]}, "packages.0.version: Field required"),
        ({"python": "3.11", "packages": {"alpha": "1.0"}}, "python: Input should be an object"),
        (
            {"layers": [{"name": "base", "size": 1}]},
            "layers.0: Value error, a layer needs a digest",
        ),
        (_built(layers=[{**_built()["layers"][0], "size": "big"}]), "layers.0.size"),
        (_built(spec=None), "spec: Input should be a valid string"),
        (_built(colour="blue"), "colour: Extra inputs are not permitted"),
    ],
)
def test_a_hand_edited_build_manifest(
    cli: Any, tmp_path: Path, content: dict[str, Any], needle: str
) -> None:
    bad = tmp_path / "hand.json"
    bad.write_text(json.dumps(content))
    fails_cleanly(cli("diff", FIXTURE, bad), f"{bad}: invalid build manifest: ", needle, "hint: ")


def test_a_record_path_with_a_nul_byte(cli: Any, venv: Path) -> None:
    """A RECORD is untrusted: a path no file can have is reported, never a crash (exit 4)."""
    record = site_packages(venv) / "alpha-1.0.dist-info" / "RECORD"
    with record.open("a") as f:
        f.write("alpha/bad\0name.py,sha256=AAAA,5\n")
    for quick in ((), ("--quick",)):
        result = cli("snapshot", "--python", venv, *quick, "--no-docker", "--no-systemd",
                     "--no-models")  # fmt: skip
        assert result.exit_code in (0, 2), result.stderr
        assert "Traceback" not in result.stderr and "internal error" not in result.stderr
        assert "bad" in result.stdout + result.stderr
