"""The Debian base in the lock: `envbuild lock` pins it with mmdebstrap, a relock reuses the
pinned set without mmdebstrap, `--refresh-base` resolves it again, `--check` names a changed
[base], and `envbuild build` builds exactly the pinned set.

The session's one real mmdebstrap resolution is the ``pinned_session`` fixture (conftest.py);
each test works on a copy of its repository. mmdebstrap is counted through a shim on PATH that
records its arguments and runs the real one; "no mmdebstrap" is proved with a PATH without it.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from support.mmdebstrap import builds_in, mmdebstrap_shim

from envbuild.lock.io import dumps, read_lock
from envbuild.lock.model import DebianBaseLock

pytestmark = pytest.mark.slow


def _lock_file(spec: Path) -> Path:
    return spec.parent.parent / "lockfiles" / "pylock.pinned.toml"


def _debian(spec: Path) -> DebianBaseLock:
    base = read_lock(_lock_file(spec)).envbuild.base
    assert isinstance(base, DebianBaseLock)
    return base


def _edit(spec: Path, old: str, new: str) -> None:
    text = spec.read_text()
    assert old in text, f"{old!r} is not in {spec}"
    spec.write_text(text.replace(old, new))


@pytest.fixture
def no_mmdebstrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """PATH holds python3 (uv looks for an interpreter there) and nothing else."""
    folder = tmp_path / "bin-without-mmdebstrap"
    folder.mkdir()
    (folder / "python3").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(folder))


@pytest.fixture
def counted_mmdebstrap(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The real mmdebstrap behind a shim first on PATH; returns the shim's record."""
    folder, record = mmdebstrap_shim(tmp_path / "shim")
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ.get('PATH', '')}")
    return record


def _tampered(spec: Path, package: str) -> bytes:
    """Rewrite the lock (canonically) with a wrong .deb sha256 for ``package``; its bytes."""
    path = _lock_file(spec)
    lock = read_lock(path)
    base = lock.envbuild.base
    assert isinstance(base, DebianBaseLock)
    assert package in {p.name for p in base.packages}
    packages = [
        p.model_copy(update={"sha256": "0" * 64}) if p.name == package else p for p in base.packages
    ]
    envbuild = lock.envbuild.model_copy(
        update={"base": base.model_copy(update={"packages": packages})}
    )
    tool = lock.tool.model_copy(update={"envbuild": envbuild})
    text = dumps(lock.model_copy(update={"tool": tool}), spec_file="specs/pinned.toml")
    path.write_text(text)
    return path.read_bytes()


def test_lock_pins_the_debian_base(cli, pinned_session):
    assert len(pinned_session.mmdebstrap_builds) == 1, pinned_session.mmdebstrap_builds
    base = read_lock(pinned_session.lock_file).envbuild.base
    assert isinstance(base, DebianBaseLock)
    assert (base.suite, base.variant) == ("bookworm", "essential")
    assert base.include == ["python3-minimal"]
    names = [p.name for p in base.packages]
    assert names == sorted(names) and len(set(names)) == len(names)
    # essential alone is ~40 packages; python3-minimal brings python3.11-minimal and friends
    assert {"python3-minimal", "python3.11-minimal", "dpkg", "libc6"} <= set(names)
    for package in base.packages:
        assert re.fullmatch(r"[0-9a-f]{64}", package.sha256), package
        assert package.arch in ("amd64", "all") and package.version
    check = cli("lock", "--check", pinned_session.repo / "specs" / "pinned.toml")
    assert check.exit_code == 0, check.stdout
    assert "note:" not in check.stdout


def test_relock_reuses_the_pinned_base_without_mmdebstrap(
    cli, pinned_repo, no_mmdebstrap, tmp_path
):
    lock_file = _lock_file(pinned_repo)
    first = lock_file.read_bytes()
    again = cli("lock", pinned_repo)
    assert again.exit_code == 0, again.stderr
    assert "Debian base" in again.stdout and "(reused)" in again.stdout
    assert lock_file.read_bytes() == first
    assert cli("lock", "--python-only", pinned_repo).exit_code == 0
    assert lock_file.read_bytes() == first
    # written elsewhere, the spec's own lock still gives the pinned set
    other = tmp_path / "pylock.elsewhere.toml"
    assert cli("lock", pinned_repo, "--output", other).exit_code == 0
    assert other.read_bytes() == first


def test_a_changed_base_needs_mmdebstrap_and_a_missing_one_is_exit_3(
    cli, pinned_repo, no_mmdebstrap
):
    lock_file = _lock_file(pinned_repo)
    before = lock_file.read_bytes()
    _edit(pinned_repo, 'packages = ["python3-minimal"]', 'packages = ["python3-minimal", "tini"]')
    result = cli("lock", pinned_repo)
    assert result.exit_code == 3, result.stderr
    assert "mmdebstrap was not found" in result.stderr
    assert "apt-get install mmdebstrap" in result.stderr
    assert "Traceback" not in result.stderr
    assert lock_file.read_bytes() == before
    # --python-only never runs it: the base is recorded unpinned, and said so
    quick = cli("lock", "--python-only", pinned_repo)
    assert quick.exit_code == 0, quick.stderr
    assert "left unpinned (the spec's [base] changed)" in quick.stderr
    base = _debian(pinned_repo)
    assert base.include == ["python3-minimal", "tini"] and base.packages == []
    check = cli("lock", "--check", pinned_repo)
    assert check.exit_code == 0, check.stdout
    assert "note: the Debian base's package set is not pinned" in check.stdout


def test_a_moved_cutoff_resolves_the_base_again_unless_python_only(cli, pinned_repo, no_mmdebstrap):
    pinned = _debian(pinned_repo)
    _edit(
        pinned_repo, "exclude_newer = 2026-01-01T00:00:00Z", "exclude_newer = 2026-02-01T00:00:00Z"
    )
    result = cli("lock", pinned_repo)
    assert result.exit_code == 3 and "mmdebstrap was not found" in result.stderr
    quick = cli("lock", "--python-only", pinned_repo)
    assert quick.exit_code == 0, quick.stderr
    assert _debian(pinned_repo) == pinned
    assert cli("lock", "--check", pinned_repo).exit_code == 0


def test_check_names_a_changed_base(cli, pinned_repo):
    _edit(pinned_repo, 'packages = ["python3-minimal"]', 'packages = ["python3-minimal", "tini"]')
    result = cli("lock", "--check", pinned_repo)
    assert result.exit_code == 1
    assert (
        "base packages: [python3-minimal, tini] in the spec, [python3-minimal] in the lock"
        in result.stdout
    )


def test_refresh_base_resolves_again(
    cli, pinned_repo, pinned_session, counted_mmdebstrap, tmp_path
):
    tampered = _tampered(pinned_repo, "python3-minimal")
    # the default reuses what the lock pins, whatever it is: nothing in [base] changed
    reused = cli("lock", pinned_repo)
    assert reused.exit_code == 0, reused.stderr
    assert _lock_file(pinned_repo).read_bytes() == tampered
    assert builds_in(counted_mmdebstrap) == []
    refreshed = cli("lock", "--refresh-base", "--store", tmp_path / "store", pinned_repo)
    assert refreshed.exit_code == 0, refreshed.stderr
    assert "(resolved)" in refreshed.stdout
    assert len(builds_in(counted_mmdebstrap)) == 1
    assert _lock_file(pinned_repo).read_bytes() == pinned_session.lock


def test_build_uses_the_pinned_set(cli, pinned_repo, pinned_session, counted_mmdebstrap, tmp_path):
    # The session's store holds the rootfs under the pinned set's key: the build takes it
    # from there and runs no mmdebstrap, and the manifest records exactly the lock's set.
    built = cli(
        "build", pinned_repo, "--store", pinned_session.store,
        "--output", tmp_path / "image", "--no-docker-archive", "--json",
    )  # fmt: skip
    assert built.exit_code == 0, built.stderr
    manifest = built.json()
    locked = _debian(pinned_repo)
    assert manifest["base"]["lock"] == locked.model_dump(mode="json", by_alias=True)
    assert builds_in(counted_mmdebstrap) == []
    written = json.loads((tmp_path / "image" / "build-manifest.json").read_text())
    assert written["base"]["lock"]["packages"] == manifest["base"]["lock"]["packages"]

    # A pinned set the mirror does not give (one .deb's sha256 changed) is built with the
    # pins (apt preferences through mmdebstrap's setup hook), checked, and refused: the
    # build did not resolve the base afresh.
    _tampered(pinned_repo, "python3-minimal")
    refused = cli(
        "build", pinned_repo, "--store", tmp_path / "fresh-store",
        "--output", tmp_path / "image2", "--no-docker-archive",
    )  # fmt: skip
    assert refused.exit_code == 3, refused.stderr
    assert "did not give the locked package set" in refused.stderr
    assert "python3-minimal" in refused.stderr
    (run,) = builds_in(counted_mmdebstrap)
    assert "--setup-hook=" in run
