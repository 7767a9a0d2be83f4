"""A full disk is the environment's failure (exit 3) naming the folder and its room, never an
internal error (issue 24: "No usable temporary directory", exit 4). Real small tmpfs mounts,
filled: as the store's tmp folder, and (in a mount namespace of its own) as every temporary
folder tempfile would try."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import CliResult
from support.debianbase import DEBIAN_SPEC
from support.mounts import Mounts, mounts  # noqa: F401
from support.mounts import _cannot as cannot_mount

SPEC = DEBIAN_SPEC


def _fill(folder: Path) -> None:
    fd = os.open(folder / "fill", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:  # full
        pass
    finally:
        os.close(fd)


def test_a_full_store_tmp_is_exit_3_naming_it_and_its_room(
    repo: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    mounts: Mounts,  # noqa: F811
    cli: Callable[..., CliResult],
) -> None:
    store = tmp_path / "store"
    (store / "tmp").mkdir(parents=True)
    mounts.tmpfs(store / "tmp", "1m")
    _fill(store / "tmp")
    (repo / "specs" / "s.toml").write_text(SPEC)
    monkeypatch.chdir(repo)
    monkeypatch.setenv("ENVBUILD_STORE", str(store))
    monkeypatch.setenv("ENVBUILD_SCRATCH", str(tmp_path))

    got = cli("lock", "specs/s.toml")

    assert got.exit_code == 3, got.stderr
    assert f"no space left in {store / 'tmp'} while" in got.stderr
    assert "(0 B free of 1.0 MiB)" in got.stderr
    assert "internal error" not in got.stderr


NAMESPACE = """\
set -e
spec=$1 python=$2
shift 2
mount --make-rprivate /
mount -t tmpfs -o size=256k tmpfs /mnt
mkdir -p /mnt/repo/.git /mnt/repo/specs /mnt/oldtmp
cp "$spec" /mnt/repo/specs/s.toml
mount --rbind /tmp /mnt/oldtmp
for d in /tmp /var/tmp; do mount -t tmpfs -o size=256k tmpfs "$d"; done
# what this Python runs from, where it lies under /tmp (a checkout there), is bound back in
for keep in "$@"; do mkdir -p "$keep"; mount --rbind "/mnt/oldtmp/${keep#/tmp/}" "$keep"; done
for d in /tmp /var/tmp /mnt; do dd if=/dev/zero of="$d/fill" bs=4k 2>/dev/null || true; done
cd /mnt/repo
unset TMPDIR
exec "$python" -m envbuild lock --python-only specs/s.toml
"""


def _under_tmp() -> list[str]:
    """The folders this test's Python and envbuild's source come from that lie under /tmp
    (a clone there, as CI may make): the namespace covers /tmp, and binds these back."""
    import envbuild

    found = {sys.prefix, sys.base_prefix, str(Path(envbuild.__file__).resolve().parents[1])}
    return sorted(p for p in found if p.startswith("/tmp/"))


def test_no_usable_temporary_folder_is_exit_3_naming_tmp_and_its_room(
    tmp_path: Path,
    mounts: Mounts,  # noqa: F811  (root, else a skip)
) -> None:
    """/tmp, /var/tmp and the current folder all full, in a mount namespace of its own (the
    host's /tmp is not touched): tempfile finds no usable folder."""
    if shutil.which("unshare") is None:
        cannot_mount("unshare(1) is not installed")
    spec = tmp_path / "s.toml"
    spec.write_text(SPEC)
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", NAMESPACE, "sh", str(spec), sys.executable, *_under_tmp()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if "unshare failed" in done.stderr or "Operation not permitted" in done.stderr:
        cannot_mount(done.stderr.strip())
    assert done.returncode == 3, done.stderr
    assert "no space left in /tmp while making a temporary folder" in done.stderr
    assert "(0 B free of 256.0 KiB)" in done.stderr
    assert "No usable temporary directory" not in done.stderr
