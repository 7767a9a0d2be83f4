"""SIGTERM, SIGINT or SIGHUP to envbuild's pid alone stop its children with it (issue 24: a
killed `lock` left mmdebstrap running, orphaned, and its chroot's binds of the host mounted).

Real signals to a real `envbuild lock` whose mmdebstrap is a stand-in on PATH that does what
the real one does first in root mode, as root: it makes its chroot in $TMPDIR, binds the
"host's /dev/shm" (a folder with files) and mounts a tmpfs there, starts a helper process
(which ignores SIGTERM in the stubborn case: SIGKILL must follow) and waits."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.mounts import Mounts, mounted_under, mounts  # noqa: F401

from envbuild import proc

SPEC = """\
name = "s"
[base]
kind = "debian"
suite = "bookworm"
packages = ["python3-minimal"]
[python]
version = "3.11"
[resolution]
exclude_newer = 2026-01-01T00:00:00Z
"""

MMDEBSTRAP = """\
#!/bin/sh
if [ "$1" = "--version" ]; then echo "mmdebstrap 1.3.5"; exit 0; fi
root=$(mktemp -d "$TMPDIR/mmdebstrap.XXXXXXXXXX")
mkdir -p "$root/dev/shm" "$root/proc"
mount --bind "$HOST_SHM" "$root/dev/shm" || exit 99
mount -t tmpfs -o size=1m tmpfs "$root/proc" || exit 99
(if [ -n "$STUBBORN" ]; then trap '' TERM; fi; exec sleep 600) &
echo $! > "$PIDS/grandchild"
echo $$ > "$PIDS/child"
: > "$PIDS/ready"
wait
"""


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for init, which may be slow)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in (b"Z", b"X")


#: `python -m envbuild`, with the stop signals at their defaults first: a test run started in the
#: background of a script has SIGINT ignored, and an ignored signal stays ignored across exec
#: (envbuild then leaves it so, as nohup asks for SIGHUP)
ENVBUILD = [
    sys.executable,
    "-c",
    "import signal, sys\n"
    "for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP): signal.signal(s, signal.SIG_DFL)\n"
    "from envbuild.cli import main\n"
    "sys.exit(main(sys.argv[1:]))",
]


def _kill_what_is_left(pids: Path) -> None:
    """What envbuild failed to stop (the test fails then) must not outlive the test."""
    for name in ("child", "grandchild"):
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int((pids / name).read_text()), signal.SIGKILL)


@pytest.mark.parametrize(
    ("signum", "stubborn"),
    [(signal.SIGTERM, True), (signal.SIGINT, False), (signal.SIGHUP, False)],
    ids=["SIGTERM-stubborn-helper", "SIGINT", "SIGHUP"],
)
def test_a_signal_to_envbuild_stops_mmdebstrap_and_what_it_started_and_mounted(
    signum: int,
    stubborn: bool,
    tmp_path: Path,
    mounts: Mounts,  # noqa: F811  (root and mount(8), else a skip; the undo of what is left)
) -> None:
    repo, fake, pids, host_shm, scratch = (
        tmp_path / n for n in ("repo", "bin", "pids", "host-shm", "scratch")
    )
    for folder in (repo / ".git", repo / "specs", fake, pids, host_shm, scratch):
        folder.mkdir(parents=True)
    (repo / "specs" / "s.toml").write_text(SPEC)
    (fake / "mmdebstrap").write_text(MMDEBSTRAP)
    (fake / "mmdebstrap").chmod(0o755)
    (host_shm / "sem.held").write_text("in use\n")
    host_shm.chmod(0o1777)
    env = {
        **os.environ,
        "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}",
        "ENVBUILD_SCRATCH": str(scratch),
        "ENVBUILD_STORE": str(tmp_path / "store"),
        "HOST_SHM": str(host_shm),
        "PIDS": str(pids),
        "STUBBORN": "1" if stubborn else "",
    }
    mounts.also_under(tmp_path)
    envbuild = subprocess.Popen(
        [*ENVBUILD, "-v", "lock", "specs/s.toml"],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (pids / "ready").exists():
            assert envbuild.poll() is None, envbuild.communicate()
            assert time.monotonic() < deadline, "the stand-in mmdebstrap never started"
            time.sleep(0.05)
        child, helper = (int((pids / n).read_text()) for n in ("child", "grandchild"))
        assert len(mounted_under(scratch)) == 2  # what a killed lock used to leave mounted
        assert os.getpgid(child) == child != os.getpgid(envbuild.pid)  # a group of its own

        sent = time.monotonic()
        envbuild.send_signal(signum)  # to envbuild's pid only, not to its group
        _out, err = envbuild.communicate(timeout=proc.STOP_GRACE + 15)
        took = time.monotonic() - sent
    finally:
        if envbuild.poll() is None:
            envbuild.kill()
            envbuild.communicate()
        _kill_what_is_left(pids)

    assert envbuild.returncode == 128 + signum, err
    assert f"interrupted ({signal.Signals(signum).name})" in err
    assert took < proc.STOP_GRACE + 5 if stubborn else took < 5, err
    assert not _running(child) and not _running(helper)
    assert mounted_under(tmp_path) == []  # the chroot's mounts detached, the chroot removed
    assert list(scratch.iterdir()) == []
    assert (host_shm / "sem.held").read_text() == "in use\n"
    assert stat.S_IMODE(host_shm.stat().st_mode) == 0o1777


#: Modules that may start a process without envbuild.proc: the probe runs inside a builder
#: container (envbuild is not installed there); snapshot's hashing forks workers of its own,
#: which it kills when interrupted (a signal raises in the parent's main thread).
OUTSIDE_PROC = {"sourcebuild/container_probe.py", "snapshot/hashing.py"}


def test_every_child_is_started_by_proc() -> None:
    """A child started elsewhere would not be tracked, nor stopped with envbuild."""
    package = Path(proc.__file__).parent
    starts = ("subprocess.run(", "subprocess.Popen(", "subprocess.call(", "subprocess.check_",
              "os.system(", "os.fork(", "os.spawn", "os.posix_spawn", "os.exec")  # fmt: skip
    found = sorted(
        f"{path.relative_to(package)}: {word}"
        for path in package.rglob("*.py")
        if path != Path(proc.__file__) and str(path.relative_to(package)) not in OUTSIDE_PROC
        for word in starts
        if word in path.read_text(encoding="utf-8")
    )
    assert found == []
