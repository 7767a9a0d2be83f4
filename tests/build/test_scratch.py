"""Scratch folders in memory: where they go, when they do not, and that they are removed."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envbuild import scratch
from envbuild.errors import UsageError


@pytest.fixture
def shm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stand-in for /dev/shm with a known amount of room."""
    monkeypatch.delenv(scratch.ENV, raising=False)
    folder = tmp_path / "shm"
    folder.mkdir()
    monkeypatch.setattr(scratch, "SHM", folder)
    monkeypatch.setattr(scratch, "RESERVE", 0)
    monkeypatch.setattr(scratch, "_room", lambda parent: 100 if parent == folder else 0)
    return folder


def test_a_folder_goes_to_shm_when_it_fits_and_is_removed(shm: Path) -> None:
    with scratch.folder("stage-", 60) as got:
        assert got is not None and got.parent == shm and got.name.startswith("envbuild-stage-")
        (got / "file").write_text("x")
    assert list(shm.iterdir()) == []


def test_folders_held_at_once_count_against_the_room(shm: Path) -> None:
    with scratch.folder("a-", 60) as first:
        assert first is not None
        with scratch.folder("b-", 60) as second:
            assert second is None  # 60 + 60 > 100: the caller uses the store
        with scratch.folder("c-", 40) as third:
            assert third is not None
    with scratch.folder("d-", 100) as again:  # all given back
        assert again is not None


def test_no_usable_shm_means_none(shm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scratch, "SHM", shm / "absent")
    with scratch.folder("stage-", 1) as got:
        assert got is None


def test_the_real_room_check_measures_a_folder_and_gives_nothing_for_a_missing_one(
    tmp_path: Path,
) -> None:
    assert scratch._room(tmp_path / "absent") == 0
    room = scratch._room(tmp_path)  # a plain writable folder: its free space, capped by memory
    assert 0 < room <= scratch._mem_available()


def test_the_setting_picks_the_folder_or_the_store(
    tmp_path: Path, shm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = tmp_path / "chosen"
    chosen.mkdir()
    monkeypatch.setenv(scratch.ENV, str(chosen))
    with scratch.folder("stage-", 1 << 60) as got:  # a chosen folder is not measured
        assert got is not None and got.parent == chosen
    monkeypatch.setenv(scratch.ENV, "store")
    with scratch.folder("stage-", 1) as got:
        assert got is None
    monkeypatch.setenv(scratch.ENV, str(tmp_path / "no" / "such"))
    with pytest.raises(UsageError, match=scratch.ENV), scratch.folder("stage-", 1):
        pass


def test_a_killed_builds_folder_is_swept_a_live_one_is_not(shm: Path) -> None:
    import fcntl
    import os

    old = 10 * scratch.STALE_AFTER
    stale, live, fresh, other = (
        shm / n for n in ("envbuild-stage-a", "envbuild-stage-b", "envbuild-c", "theirs")
    )
    for d in (stale, live, fresh, other):
        (d / "sub").mkdir(parents=True)
        (d / "sub" / "f").write_text("x")
    for d in (stale, live, other):
        os.utime(d, (os.stat(d).st_atime - old, os.stat(d).st_mtime - old))
    holder = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # as a running build holds its folder
    try:
        with scratch.folder("stage-", 1) as got:
            assert got is not None
            # the folder in use is locked against another process's sweep
            probe = os.open(got, os.O_RDONLY | os.O_DIRECTORY)
            with pytest.raises(BlockingIOError):
                fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.close(probe)
        assert not stale.exists()
        assert live.exists() and fresh.exists() and other.exists()
    finally:
        os.close(holder)


# --- temporary folders of every kind: what a killed run left goes, a running one's stays -----

_HOLDER = """
import os, sys, time
from envbuild import scratch
kind, root = sys.argv[1], sys.argv[2]
if scratch.TEMP_KINDS[kind]:
    scratch.TEMP_KINDS[kind] = root
with scratch.temp_dir(kind) as path:
    (path / "ro").mkdir()
    (path / "ro" / "f").write_text("x")
    os.chmod(path / "ro", 0o500)  # as an unpacked wheel may have (binds when not root)
    print(path, flush=True)
    time.sleep(600)
"""


@pytest.fixture
def temp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The system's temporary directory (and every fixed folder of a kind) in the test's."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(root))
    monkeypatch.setenv("TMPDIR", str(root))
    monkeypatch.setenv(scratch.ENV, str(tmp_path / "shm"))
    (tmp_path / "shm").mkdir()
    for kind, fixed in scratch.TEMP_KINDS.items():
        if fixed:
            monkeypatch.setitem(scratch.TEMP_KINDS, kind, str(root))
    return root


def _holder(kind: str, root: Path) -> tuple[subprocess.Popen[str], Path]:
    """A child process inside ``temp_dir(kind)``, and its folder."""
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, kind, str(root)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    assert line, f"the holder of {kind} exited with {child.wait()}"
    return child, Path(line)


def _killed(kind: str, root: Path, *, age: float) -> Path:
    child, path = _holder(kind, root)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert child.stdout is not None
    child.stdout.close()
    _age(path, age)
    return path


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


@pytest.mark.parametrize("kind", sorted(scratch.TEMP_KINDS))
@pytest.mark.parametrize("by", ["next run", "gc"])
def test_a_killed_runs_temp_folder_goes_a_live_or_fresh_one_stays(
    kind: str, by: str, temp_root: Path
) -> None:
    old = 10 * scratch.STALE_AFTER
    live_child, live = _holder(kind, temp_root)
    try:
        _age(live, old)  # a long run: old, but locked by a process that is alive
        # (each holder's own temp_dir swept the folder of its kind: the next run of the kind)
        fresh = _killed(kind, temp_root, age=scratch.STALE_AFTER / 2)  # maybe not locked yet
        killed = _killed(kind, temp_root, age=old)
        assert killed.name.startswith(f"envbuild-{kind}") and killed.parent == temp_root
        assert killed.exists() and (killed / "ro" / "f").exists()
        if by == "gc":
            assert scratch.sweep() == 1
        else:
            with scratch.temp_dir(kind) as mine:
                assert mine.is_dir()
            assert not mine.exists()
        assert not killed.exists()
        assert fresh.exists() and live.exists() and (live / "ro" / "f").exists()
        assert live_child.poll() is None
    finally:
        live_child.kill()
        live_child.wait()
        assert live_child.stdout is not None
        live_child.stdout.close()


def test_the_next_run_sweeps_its_own_kind_only(temp_root: Path) -> None:
    """A run of one kind leaves the others' leftovers to their own next run (and to gc); the
    folders of other programs, even with our prefix, are never touched."""
    old = 10 * scratch.STALE_AFTER
    auth = _killed("auth-", temp_root, age=old)
    theirs = temp_root / "envbuild-dockerd-x"  # not a kind of ours (tests/support/dockerd.py)
    theirs.mkdir()
    _age(theirs, old)
    with scratch.temp_dir("lock-"):
        pass
    assert auth.exists()
    assert scratch.sweep() == 1
    assert not auth.exists() and theirs.exists()
    with pytest.raises(ValueError, match="not a known"):
        scratch.temp_dir("dockerd-").__enter__()


def test_every_temporary_folder_of_envbuild_is_made_by_scratch() -> None:
    """Only envbuild/scratch.py (and store/blobs.py, whose tmp/ gc empties under its lock) makes
    temporary folders: one made elsewhere would be left behind by a killed run."""
    import envbuild

    package = Path(envbuild.__file__).parent
    allowed = {package / "scratch.py", package / "store" / "blobs.py"}
    makers = re.compile(r"\b(?:TemporaryDirectory|mkdtemp)\(")
    found = [
        str(p.relative_to(package))
        for p in sorted(package.rglob("*.py"))
        if p not in allowed and makers.search(p.read_text())
    ]
    assert found == []


_BESIDE = """
import sys, time
from pathlib import Path
from envbuild import scratch
with scratch.beside(Path(sys.argv[1]), "pull-") as path:
    print(path, flush=True)
    time.sleep(600)
"""


def test_a_killed_pulls_folder_beside_its_destination_goes_with_the_next_pull(
    tmp_path: Path,
) -> None:
    dest, other = tmp_path / "image", tmp_path / "other"
    children = []

    def hold(target: Path) -> Path:
        child = subprocess.Popen(
            [sys.executable, "-c", _BESIDE, str(target)], stdout=subprocess.PIPE, text=True
        )
        children.append(child)
        assert child.stdout is not None
        return Path(child.stdout.readline().strip())

    try:
        live = hold(dest)
        _age(live, 10 * scratch.STALE_AFTER)
        killed, theirs = hold(dest), hold(other)
        for child in children[1:]:
            child.kill()
            child.wait()
        _age(killed, 10 * scratch.STALE_AFTER)
        _age(theirs, 10 * scratch.STALE_AFTER)
        assert killed.name.startswith(".image.pull-") and killed.parent == tmp_path
        with scratch.beside(dest, "pull-") as mine:
            assert mine.parent == tmp_path
        assert not killed.exists() and not mine.exists()
        assert live.exists() and theirs.exists()  # alive; another destination's
    finally:
        for child in children:
            child.kill()
            child.wait()
            assert child.stdout is not None
            child.stdout.close()


def test_mmdebstraps_ca_folder_is_locked_while_it_runs_and_gone_after(
    temp_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one folder at a fixed place (/tmp: the same path inside the chroot): mmdebstrap sees
    a locked ``envbuild-ca-*`` folder with the bundle, which goes when it ends (here: fails)."""
    import fcntl
    from types import SimpleNamespace

    from envbuild.build.base import debian
    from envbuild.proc import core as proc

    bundle = tmp_path / "bundle.crt"
    bundle.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    seen: list[Path] = []

    def mmdebstrap(argv: list[str], **_: object) -> None:
        setup = next(a for a in argv if a.startswith("--setup-hook=")).split("=", 1)[1]
        words = Path(setup).read_text().split()
        ca = next(Path(w.strip('"')).parent for w in words if w.endswith('/ca.crt"'))
        seen.append(ca)
        assert ca.parent == temp_root and ca.name.startswith("envbuild-ca-")
        assert (ca / "ca.crt").read_text() == bundle.read_text()
        probe = os.open(ca, os.O_RDONLY | os.O_DIRECTORY)
        with pytest.raises(BlockingIOError):
            fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.close(probe)
        raise RuntimeError("mmdebstrap failed")

    monkeypatch.setattr(proc, "run", mmdebstrap)
    work = tmp_path / "work"
    work.mkdir()
    base = SimpleNamespace(
        mirror="https://deb.debian.org/debian", variant="essential", packages=[], suite="bookworm"
    )
    with pytest.raises(RuntimeError, match="mmdebstrap failed"):
        debian._mmdebstrap(work, base, None, 0)
    assert len(seen) == 1 and not seen[0].exists()
