"""Patches in `envbuild snapshot` and `envbuild diff`: a wheel patched by `envbuild build` (real
GNU patch, real uv install) shows as a "patches" group naming the patch files and their sha256, in
build manifests and in snapshots of a venv holding the patched wheel."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.project import write_project
from support.wheels import make_wheel, ref

from envbuild.fsio import sha256_bytes
from envbuild.pipeline.core import build
from envbuild.proc import core as proc
from envbuild.spec import load_spec
from envbuild.store.core import Store

Cli = Any

PATCH = """\
--- a/tinypatch/__init__.py
+++ b/tinypatch/__init__.py
@@ -1,2 +1,2 @@
-GREETING = "as released"
+GREETING = "{greeting}"
 VERSION = 1
"""
PATCH_PATH = "specs/patches/tinypatch.patch"


class Project:
    """A tiny rootfs-based project: helper 1.0 and tinypatch 1.0, patched or not."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        wheels = repo / "wheels"
        self.wheels = [
            ref(make_wheel(wheels, "helper", "1.0", {"helper.py": "HELP = 1\n"})),
            ref(
                make_wheel(
                    wheels,
                    "tinypatch",
                    "1.0",
                    {"tinypatch/__init__.py": 'GREETING = "as released"\nVERSION = 1\n'},
                )
            ),
        ]
        (repo / "specs" / "patches").mkdir(parents=True, exist_ok=True)

    def build(self, label: str, greeting: str | None) -> Path:
        """Build with the patch saying ``greeting`` (None: no [patches]); the manifest's copy."""
        extra = ""
        if greeting is not None:
            (self.repo / PATCH_PATH).write_text(PATCH.format(greeting=greeting))
            extra = '[patches]\ntinypatch = ["patches/tinypatch.patch"]\n'
        spec = write_project(self.repo, "patched", self.wheels, extra)
        out = self.repo / "out"
        build(load_spec(spec), store=Store(self.repo / "store"), output=out, docker_archive=False)
        kept = self.repo / f"{label}.json"
        shutil.copyfile(out / "build-manifest.json", kept)
        return kept


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three builds of one project: unpatched, patched, patched differently (module scope: the
    builds share a store, so the second and third pack only the patched layer)."""
    repo = tmp_path_factory.mktemp("patchrepo")
    (repo / ".git").mkdir()
    (repo / "specs").mkdir()
    project = Project(repo)
    return {
        "repo": repo,
        "plain": project.build("plain", None),
        "patched": project.build("patched", "patched by envbuild"),
        "repatched": project.build("repatched", "patched again"),
    }


def _group(result: dict[str, Any], title_start: str) -> list[dict[str, Any]]:
    groups = [g for g in result["groups"] if g["title"].startswith(title_start)]
    assert len(groups) <= 1, groups
    return groups[0]["changes"] if groups else []


def _sha(repo_built: dict[str, Any], label: str) -> str:
    manifest = json.loads(repo_built[label].read_text())
    (rec,) = manifest["patches"]
    (patch,) = rec["patches"]
    assert patch["path"] == PATCH_PATH
    return str(patch["sha256"])


def test_diff_of_build_manifests_names_the_patches(cli: Cli, built: dict[str, Any]) -> None:
    sha1, sha2 = _sha(built, "patched"), _sha(built, "repatched")
    assert sha1 != sha2
    assert sha1 == sha256_bytes(PATCH.format(greeting="patched by envbuild").encode())

    gained = cli("diff", "--json", built["plain"], built["patched"])
    assert gained.exit_code == 1, gained.stderr
    (change,) = _group(gained.json(), "patches")
    assert change["subject"] == "tinypatch"
    assert change["before"] is None
    assert change["after"] == f"{PATCH_PATH} (sha256 {sha1[:16]})"
    # the version moved too, as before
    (version,) = [c for c in _group(gained.json(), "packages") if c["subject"] == "tinypatch"]
    assert version["before"] == "1.0" and version["after"].startswith("1.0+envbuild.")

    changed = cli("diff", built["patched"], built["repatched"])
    assert changed.exit_code == 1
    assert "patches (build manifest):" in changed.stdout
    assert (
        f"  tinypatch: {PATCH_PATH} (sha256 {sha1[:16]}) → {PATCH_PATH} (sha256 {sha2[:16]})"
        in changed.stdout.splitlines()
    )

    lost = cli("diff", "--json", built["repatched"], built["plain"])
    (change,) = _group(lost.json(), "patches")
    assert (change["before"], change["after"]) == (f"{PATCH_PATH} (sha256 {sha2[:16]})", None)

    same = cli("diff", "--json", built["patched"], built["patched"])
    assert same.exit_code == 0 and _group(same.json(), "patches") == []


def _venv_with(tmp: Path, wheel: Path) -> Path:
    """A real venv with ``wheel`` installed by uv."""
    env = proc.child_env({"UV_PYTHON_DOWNLOADS": "never"})
    venv = tmp / "venv"
    uv = proc.find_uv()
    subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env)
    subprocess.run(
        [uv, "pip", "install", "-q", "--offline", "--no-deps", "--python",
         str(venv / "bin" / "python"), str(wheel)],
        check=True, env=env, capture_output=True,
    )  # fmt: skip
    return venv


def _patched_wheel(built: dict[str, Any], label: str, tmp: Path) -> Path:
    """The patched wheel the build made, taken out of the store under its file name."""
    (rec,) = json.loads(built[label].read_text())["patches"]
    blob = Store(built["repo"] / "store").root / "blobs" / "sha256" / rec["wheel_sha256"]
    tmp.mkdir(parents=True, exist_ok=True)
    wheel = tmp / rec["wheel"]
    shutil.copyfile(blob, wheel)
    return wheel


def _snapshot(cli: Cli, venv: Path, out: Path) -> Path:
    got = cli("snapshot", "--python", venv, "--no-models", "--no-docker", "--no-systemd",
              "-o", out)  # fmt: skip
    assert got.exit_code == 0, got.stderr
    return out


def test_a_snapshot_records_the_patches_of_an_installed_wheel(
    cli: Cli, built: dict[str, Any], tmp_path: Path
) -> None:
    venv = _venv_with(tmp_path / "p", _patched_wheel(built, "patched", tmp_path / "w"))
    snap = json.loads(_snapshot(cli, venv, tmp_path / "patched.json").read_text())
    (env,) = snap["pythons"]
    sha1 = _sha(built, "patched")
    assert env["patches"] == {
        "tinypatch": {"version": "1.0", "patches": [{"path": PATCH_PATH, "sha256": sha1}]}
    }
    plain_venv = _venv_with(
        tmp_path / "u", built["repo"] / "wheels" / "tinypatch-1.0-py3-none-any.whl"
    )
    plain = _snapshot(cli, plain_venv, tmp_path / "plain.json")
    assert json.loads(plain.read_text())["pythons"][0]["patches"] == {}

    # snapshot against the manifest it was installed from: the same patches, nothing to show
    same = cli("diff", "--json", tmp_path / "patched.json", built["patched"])
    assert _group(same.json(), "patches") == []
    # … against the build with the other patch: the patch changed
    other = cli("diff", "--json", tmp_path / "patched.json", built["repatched"])
    (change,) = _group(other.json(), "patches")
    assert change["subject"] == "tinypatch"
    assert change["before"] == f"{PATCH_PATH} (sha256 {sha1[:16]})"
    assert change["after"] == f"{PATCH_PATH} (sha256 {_sha(built, 'repatched')[:16]})"
    # two snapshots: the plain venv gained the patch
    gained = cli("diff", plain, tmp_path / "patched.json")
    assert gained.exit_code == 1
    lines = gained.stdout.splitlines()
    at = lines.index(f"patches ({plain_venv}):")  # the environments pair; a's name is shown
    assert lines[at + 1] == f"  tinypatch: ∅ → {PATCH_PATH} (sha256 {sha1[:16]})"


def test_a_snapshot_from_before_patch_records_is_not_compared(
    cli: Cli, built: dict[str, Any], tmp_path: Path
) -> None:
    """An older snapshot has no patch record at all: unknown, not "no patches"."""
    venv = _venv_with(tmp_path / "p", _patched_wheel(built, "patched", tmp_path / "w"))
    new = _snapshot(cli, venv, tmp_path / "new.json")
    data = json.loads(new.read_text())
    del data["pythons"][0]["patches"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    result = cli("diff", "--json", old, new)
    assert result.exit_code == 0, result.stdout
    assert _group(result.json(), "patches") == []
    assert any(
        n.startswith("patches (") and f"not recorded in {old}" in n
        for n in result.json()["not_compared"]
    )


def test_a_malformed_patch_record_is_logged_not_fatal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    from envbuild.snapshot.patchinfo import read_patch_record

    info = tmp_path / "x-1.0.dist-info"
    info.mkdir()
    assert read_patch_record(str(info)) is None  # no record: not patched
    logger = logging.getLogger("envbuild.snapshot")  # the CLI stops propagation to the root
    logger.addHandler(caplog.handler)
    try:
        (info / "envbuild-patches.json").write_text('{"dist": "x", "patches": [{"path": "p"}]}')
        assert read_patch_record(str(info)) is None
        assert "not an envbuild patch record" in caplog.text
        (info / "envbuild-patches.json").write_text("{truncated")
        assert read_patch_record(str(info)) is None
        assert "cannot read the patch record" in caplog.text
    finally:
        logger.removeHandler(caplog.handler)
