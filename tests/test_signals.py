"""SIGTERM, SIGINT or SIGHUP to envbuild's pid alone stop its children with it (issue 24: a
killed `lock` left mmdebstrap running, orphaned, and its chroot's binds of the host mounted).

Real signals to a real `envbuild lock` or `build`. Its mmdebstrap is a stand-in on PATH that
does what the real one does in root mode, as root: it makes its chroot in $TMPDIR, binds the
"host's /dev/shm" (a folder with files) and mounts a tmpfs there, starts a helper process
(which ignores SIGTERM in the stubborn case: SIGKILL must follow) and waits; or it is the real
mmdebstrap, its apt waiting on a mirror that accepts and never answers."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.debianbase import DEBIAN_SPEC
from support.mmdebstrap import need_mmdebstrap
from support.mounts import Mounts, mounted_under, mounts  # noqa: F401
from support.outside_proc import OUTSIDE_PROC

from envbuild.proc import core as proc

SPEC = DEBIAN_SPEC

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
    "from envbuild.cli.main import main\n"
    "sys.exit(main(sys.argv[1:]))",
]


def _kill_what_is_left(pids: Path) -> None:
    """What envbuild failed to stop (the test fails then) must not outlive the test."""
    for name in ("child", "grandchild"):
        with contextlib.suppress(FileNotFoundError, ValueError, ProcessLookupError):
            os.kill(int((pids / name).read_text()), signal.SIGKILL)


@pytest.mark.parametrize(
    ("command", "signum", "stubborn"),
    [
        ("lock", signal.SIGTERM, True),
        ("lock", signal.SIGINT, False),
        ("lock", signal.SIGHUP, False),
        ("build", signal.SIGTERM, False),  # mmdebstrap in the base's thread, zstd beside it
    ],
    ids=["lock-SIGTERM-stubborn-helper", "lock-SIGINT", "lock-SIGHUP", "build-SIGTERM"],
)
def test_a_signal_to_envbuild_stops_mmdebstrap_and_what_it_started_and_mounted(
    command: str,
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
    if command == "build":  # a lock without the base's package set: the build resolves it
        locked = subprocess.run(
            [*ENVBUILD, "lock", "--python-only", "specs/s.toml"],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert locked.returncode == 0, locked.stderr
    envbuild = subprocess.Popen(
        [*ENVBUILD, "-v", command, "specs/s.toml"],
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


def test_every_child_is_started_by_proc() -> None:
    """A child started elsewhere would not be tracked, nor stopped with envbuild."""
    package = Path(proc.__file__).parent.parent  # envbuild/, proc being envbuild/proc/
    starts = ("subprocess.run(", "subprocess.Popen(", "subprocess.call(", "subprocess.check_",
              "os.system(", "os.fork(", "os.spawn", "os.posix_spawn", "os.exec")  # fmt: skip
    found = sorted(
        f"{path.relative_to(package)}: {word}"
        for path in package.rglob("*.py")
        if path.parent != Path(proc.__file__).parent
        and str(path.relative_to(package)) not in OUTSIDE_PROC
        for word in starts
        if word in path.read_text(encoding="utf-8")
    )
    assert found == []


def _group_of_child(parent: int) -> int | None:
    """The process group of ``parent``'s first child (envbuild's mmdebstrap), or None yet."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()
                if int(fields[1]) == parent:
                    return int(fields[2])
    return None


def _running_in_group(pgid: int) -> list[str]:
    running = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()
                if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
                    running.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
    return running


def test_sigterm_stops_the_real_mmdebstrap_and_its_apt(tmp_path: Path) -> None:
    need_mmdebstrap()
    if os.geteuid() != 0:
        pytest.skip("mmdebstrap's root mode needs root")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    asked = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:  # a mirror that takes the connection and never answers
        with contextlib.suppress(OSError):
            while True:
                held.append(server.accept()[0])
                asked.set()

    threading.Thread(target=accept, daemon=True).start()
    repo, scratch = tmp_path / "repo", tmp_path / "scratch"
    for folder in (repo / ".git", repo / "specs", scratch):
        folder.mkdir(parents=True)
    port = server.getsockname()[1]
    mirror = f'mirror = "http://127.0.0.1:{port}/debian"\npackages = '
    (repo / "specs" / "s.toml").write_text(SPEC.replace("packages = ", mirror))
    env = {**os.environ, "ENVBUILD_SCRATCH": str(scratch), "ENVBUILD_STORE": str(tmp_path / "st")}
    envbuild = subprocess.Popen(
        [*ENVBUILD, "lock", "specs/s.toml"],
        cwd=repo,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its group is its own: what it leaves there is killed after
    )
    group = None
    try:
        assert asked.wait(60), "apt never asked the mirror"
        group = _group_of_child(envbuild.pid)
        assert group is not None and group != os.getpgid(envbuild.pid)
        assert any("apt" in c for c in _running_in_group(group)), _running_in_group(group)
        envbuild.send_signal(signal.SIGTERM)
        _out, err = envbuild.communicate(timeout=proc.STOP_GRACE + 15)
    finally:
        if envbuild.poll() is None:
            envbuild.kill()
            envbuild.communicate()
        for pgid in {envbuild.pid, group} - {None}:  # what a failing envbuild left running
            with contextlib.suppress(ProcessLookupError, TypeError):
                os.killpg(pgid, signal.SIGKILL)  # type: ignore[arg-type]
        server.close()
        for conn in held:
            conn.close()
    assert envbuild.returncode == 143, err
    assert group is not None and _running_in_group(group) == []
    assert list(scratch.iterdir()) == []
    assert mounted_under(tmp_path) == []


def test_a_signal_while_the_snapshots_hashing_threads_work_drops_the_files_not_started() -> None:
    """The main thread runs ``meanwhile`` while the threads hash: a SIGTERM there must not wait
    for every queued file (a model's 500 GB), only for the one under way."""
    from envbuild.errors import Interrupted
    from envbuild.installed.hashing import run_jobs

    ran: list[int] = []

    def work(job: int, _buffer: bytearray | None) -> int:
        ran.append(job)
        time.sleep(0.05)
        return job

    def meanwhile() -> None:
        os.kill(os.getpid(), signal.SIGTERM)  # to this process: its main thread takes it
        time.sleep(5)

    started = time.monotonic()
    with pytest.raises(Interrupted) as stopped, proc.stopping_on_signals():
        run_jobs(list(range(100)), work, workers=1, processes=False, meanwhile=meanwhile)
    assert stopped.value.exit_code == 143
    assert len(ran) <= 3, ran
    assert time.monotonic() - started < 2
