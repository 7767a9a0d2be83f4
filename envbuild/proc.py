"""The one way envbuild runs an external command.

Every subprocess (uv, mmdebstrap, skopeo, nvcc, systemctl …) goes through :func:`run`. It logs the
argv with secrets redacted, captures output (or streams it to the log when asked), and raises
:class:`~envbuild.errors.ToolFailed` quoting the tool's own words when the command fails. A child's
environment is :func:`child_env` (the caller's, without what redirects Python) or, for uv,
:func:`uv_env` (cleaned: only what uv needs, and what may change a result given explicitly).

No child outlives envbuild: each starts in a process group of its own (what it starts, apt
under mmdebstrap, stays in it) and is tracked while it runs. The CLI runs a command inside
:func:`stopping_on_signals`: SIGTERM, SIGINT or SIGHUP then stops every child's group
(SIGTERM, SIGKILL after :data:`STOP_GRACE`), refuses new ones, and raises
:class:`~envbuild.errors.Interrupted` in the main thread, so that the ``finally`` blocks remove
what the children left (a chroot's mounts included: :func:`envbuild.fsio.rmtree`).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO, Any

from envbuild.errors import Interrupted, ToolFailed, ToolNotFound, failure_hint

log = logging.getLogger(__name__)

TAIL_LINES = 40

#: Variables that make a child Python or installer behave differently from what we asked.
_POLLUTING = (
    "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV", "CONDA_PREFIX",
    "PIP_REQUIRE_VIRTUALENV", "__PYVENV_LAUNCHER__",
)  # fmt: skip


class Secret:
    """A value that must never be written to a log, an error, a lock, an image or a manifest.

    ``str()`` and ``repr()`` are redacted; :meth:`reveal` gives the value to the one place that
    needs it (the child process).
    """

    __slots__ = ("_value",)
    REDACTED = "***"

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __str__(self) -> str:
        return self.REDACTED

    def __repr__(self) -> str:
        return f"Secret({self.REDACTED!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))


Arg = str | os.PathLike[str] | Secret


@dataclass(frozen=True)
class Completed:
    argv: tuple[str, ...]  # redacted
    returncode: int
    stdout: str
    stderr: str


def _reveal(arg: Arg) -> str:
    if isinstance(arg, Secret):
        return arg.reveal()
    return os.fspath(arg)


def _redact(arg: Arg) -> str:
    return str(arg) if isinstance(arg, Secret) else os.fspath(arg)


def child_env(
    overrides: Mapping[str, str | Secret] | None = None,
    *,
    base: Mapping[str, str] | None = None,
    drop: Sequence[str] = (),
) -> dict[str, str]:
    """A clean environment for a child: the caller's, without variables that redirect Python,
    with a fixed locale and time zone, plus ``overrides``."""
    env = dict(os.environ if base is None else base)
    for name in (*_POLLUTING, *drop):
        env.pop(name, None)
    env["LC_ALL"] = "C.UTF-8"
    env["TZ"] = "UTC"
    for key, value in (overrides or {}).items():
        env[key] = _reveal(value)
    return env


#: What a uv child keeps of the caller's environment: where it runs (PATH, HOME, the XDG folders,
#: the temporary folder, the loader's path for the interpreters it asks) and how it reaches the
#: network (proxies in either case, CA bundles, netrc).
_UV_PASSED = (
    "PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "XDG_CACHE_HOME", "XDG_DATA_HOME",
    "LD_LIBRARY_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR", "NETRC",
    *(v for n in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY") for v in (n, n.lower())),
)  # fmt: skip
#: The ``UV_*`` variables a uv child keeps: they change how uv reaches the network or caches, not
#: what it resolves or installs. Every other ``UV_*`` (an index, a constraint, a resolution
#: strategy, bytecode compilation) is the caller's shell steering the result: the lock decides.
UV_NETWORK = frozenset({
    "UV_CACHE_DIR", "UV_NO_CACHE", "UV_OFFLINE", "UV_NATIVE_TLS", "UV_SYSTEM_CERTS",
    "UV_HTTP_TIMEOUT", "UV_REQUEST_TIMEOUT", "UV_HTTP_RETRIES", "UV_CONCURRENT_DOWNLOADS",
    "UV_INSECURE_HOST", "UV_KEYRING_PROVIDER",
})  # fmt: skip
#: What every uv child is told: no configuration files, no Python downloads, no progress bars or
#: colours in the output envbuild reads.
UV_FIXED = {
    "UV_NO_CONFIG": "1", "UV_PYTHON_DOWNLOADS": "never", "UV_NO_PROGRESS": "1", "NO_COLOR": "1",
    "LC_ALL": "C.UTF-8", "TZ": "UTC",
}  # fmt: skip


def uv_env(
    overrides: Mapping[str, str | Secret] | None = None,
    *,
    base: Mapping[str, str] | None = None,
    source_date_epoch: int | None = None,
    docker_host: str | None = None,
) -> dict[str, str]:
    """The environment of a uv child (lock, install, apply): cleaned, not inherited.

    Only :data:`_UV_PASSED` and :data:`UV_NETWORK` come from ``base`` (default: this process's
    environment), then :data:`UV_FIXED`. What may change a result is an explicit input:
    ``source_date_epoch`` and ``docker_host`` reach the child only when given, a secret only as a
    :class:`Secret` value in ``overrides`` (revealed here, and nowhere logged).
    """
    source = os.environ if base is None else base
    env = {k: source[k] for k in (*_UV_PASSED, *sorted(UV_NETWORK)) if source.get(k)}
    env.update(UV_FIXED)
    inputs = {"SOURCE_DATE_EPOCH": source_date_epoch, "DOCKER_HOST": docker_host}
    env.update({k: str(v) for k, v in inputs.items() if v is not None})
    for key, value in (overrides or {}).items():
        env[key] = _reveal(value)
    return env


def run(
    argv: Sequence[Arg],
    *,
    tool: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    stream: bool = False,
    check: bool = True,
    timeout: float | None = None,
    hint: str | None = None,
    on_failure: str | None = None,
    on_line: Callable[[str], None] | None = None,
) -> Completed:
    """Run ``argv`` and return its output.

    ``hint`` says how to get the tool when it is not there (:class:`ToolNotFound`). A failure's
    hint follows from the failure (:func:`~envbuild.errors.failure_hint`: its exit status and
    last lines), else ``on_failure`` (what the caller knows a failure of this call means).

    ``stream=True`` sends each output line to the ``envbuild.proc`` logger at DEBUG level as it
    comes (stderr merged into stdout), for long commands whose progress a verbose user wants to see.
    With ``check`` (the default) a non-zero exit raises :class:`ToolFailed` carrying the last lines
    of output.
    """
    real = [_reveal(a) for a in argv]
    shown = tuple(_redact(a) for a in argv)
    name = tool or Path(shown[0]).name
    log.debug("running: %s", " ".join(shown))
    popen: dict[str, Any] = {
        "cwd": cwd,
        "env": dict(env) if env is not None else None,
        "stdin": subprocess.PIPE if input is not None else subprocess.DEVNULL,
        "stdout": subprocess.PIPE,
        "stderr": subprocess.STDOUT if stream else subprocess.PIPE,
        "text": True,
        "errors": "replace",
    }
    spawned = False
    try:
        with started(real, **popen) as child:
            spawned = True
            if stream:
                tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
                chunks: list[str] = []
                if input is not None:
                    assert child.stdin is not None
                    child.stdin.write(input)
                    child.stdin.close()
                assert child.stdout is not None
                for line in child.stdout:
                    chunks.append(line)
                    tail.append(line)
                    log.debug("%s: %s", name, line.rstrip("\n"))
                    if on_line is not None:  # a streamed line, e.g. for a progress report
                        on_line(line)
                returncode = child.wait(timeout=timeout)
                stdout, stderr = "".join(chunks), ""
                tail_text = "".join(tail)
            else:
                stdout, stderr = child.communicate(input, timeout=timeout)
                returncode = child.returncode
                tail_text = _tail(stderr if stderr.strip() else stdout)
    except FileNotFoundError as exc:
        if not spawned and exc.filename in (real[0], None):
            raise ToolNotFound(name, hint=hint) from exc
        raise
    except subprocess.TimeoutExpired as exc:
        raise ToolFailed(
            name, shown, -1, "", summary=f"{name} did not finish within {timeout:.0f} s"
        ) from exc
    if check and returncode != 0:
        why = failure_hint(returncode, tail_text) or on_failure
        raise ToolFailed(name, shown, returncode, tail_text, hint=why)
    return Completed(shown, returncode, stdout, stderr)


#: How long a stopped child's process group has to exit after SIGTERM before SIGKILL.
STOP_GRACE = 3.0
#: The signals that stop envbuild and its children (:func:`stopping_on_signals`).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class _Children:
    """The children this process started and has not waited for yet, and whether a signal is
    stopping it (then no new child starts)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # a signal's handler runs in the main thread, maybe inside
        self.live: dict[int, subprocess.Popen[Any]] = {}
        self.stopping: Interrupted | None = None
        self.owner = os.getpid()  # a forked worker inherits the table, not the children


_children = _Children()


@contextlib.contextmanager
def started(argv: Sequence[str], **popen: Any) -> Iterator[subprocess.Popen[Any]]:
    """Start ``argv`` (``popen``: :class:`subprocess.Popen`'s arguments) in a process group of
    its own, tracked until it has been waited for; an exception in the block stops its group
    (SIGTERM, then SIGKILL) before it is waited for. Raises the stopping signal's
    :class:`Interrupted` instead of starting anything once a signal is stopping envbuild."""
    with _children.lock:
        if _children.stopping is not None:
            raise _children.stopping
        child = subprocess.Popen(argv, process_group=0, **popen)
        _children.live[child.pid] = child
    try:
        with child:  # closes its pipes and waits for it
            try:
                yield child
            except BaseException:
                if child.poll() is None or _group_alive(child.pid):  # or what it started
                    _stop([child])
                raise
    finally:
        with _children.lock:
            _children.live.pop(child.pid, None)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _running_groups(groups: Sequence[int]) -> set[int]:
    """Which of the process groups ``groups`` still have a member that is not a zombie (an
    orphan's zombie waits for init to reap it, which may take a while in a container)."""
    wanted, running = set(groups), set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) in wanted and fields[0] not in (b"Z", b"X"):
            running.add(int(fields[2]))
    return running


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _stop(children: Sequence[subprocess.Popen[Any]], grace: float = STOP_GRACE) -> None:
    """SIGTERM to each child's process group, SIGKILL to what is left of them after ``grace``
    seconds; returns once nothing of them runs (the children reaped here or by their owner)."""
    groups = [c.pid for c in children]  # each child leads its own group (started)
    for pgid in groups:
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while True:
        for child in children:
            child.poll()  # reaps a leader that exited
        left = _running_groups(groups)
        if not left:
            break
        if time.monotonic() >= deadline:
            for pgid in sorted(left):
                log.warning("process group %d did not stop within %.0f s: killed", pgid, grace)
                _signal_group(pgid, signal.SIGKILL)
            break
        time.sleep(0.02)
    for child in children:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=grace)


def stop_children(reason: Interrupted) -> None:
    """Stop every child this process started (and refuse new ones with ``reason``)."""
    with _children.lock:
        if _children.stopping is None:
            _children.stopping = reason
        children = list(_children.live.values())
    if children:
        log.info("stopping %d child process(es): %s", len(children), reason.name)
        _stop(children)


def _on_signal(signum: int, frame: FrameType | None) -> None:
    reason = Interrupted(signum, signal.Signals(signum).name)
    if os.getpid() != _children.owner:  # a forked worker (snapshot's hashing): its parent stops it
        raise reason
    first = _children.stopping is None
    stop_children(reason)
    if first:  # a second signal while envbuild cleans up only stops what started since
        raise reason


@contextlib.contextmanager
def thread_pool(max_workers: int, **options: Any) -> Iterator[ThreadPoolExecutor]:
    """A :class:`ThreadPoolExecutor` (``options``: its other arguments) that, left by an
    exception (a signal's :class:`Interrupted` in the main thread), drops the work still
    queued and waits only for the tasks under way: a ``with ThreadPoolExecutor()`` block runs
    every queued task first (hashing 500 GB of model files after a SIGTERM)."""
    pool = ThreadPoolExecutor(max_workers=max_workers, **options)
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


@contextlib.contextmanager
def stopping_on_signals() -> Iterator[None]:
    """While the block runs, SIGTERM, SIGINT and SIGHUP stop every child (:func:`stop_children`)
    and raise :class:`Interrupted` in the main thread (the CLI exits with 128 + the signal).
    A signal ignored when envbuild started (``nohup``, a background job's SIGINT) stays ignored;
    outside the main thread nothing is installed (Python delivers signals to it alone)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    for signum in STOP_SIGNALS:
        old = signal.getsignal(signum)
        if old is not signal.SIG_IGN:
            previous[signum] = old
            signal.signal(signum, _on_signal)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
        with _children.lock:
            _children.stopping = None


def _tail(text: str, lines: int = TAIL_LINES) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def which(tool: str, *, hint: str | None = None, env_var: str | None = None) -> str:
    """Find ``tool``: ``$ENV_VAR`` first when given, then PATH. Raises :class:`ToolNotFound`."""
    if env_var and (value := os.environ.get(env_var)):
        return value
    found = shutil.which(tool)
    if found is None:
        raise ToolNotFound(tool, hint=hint)
    return found


def find_uv() -> str:
    """The uv binary: the ``uv`` package's own, then ``$UV``, then PATH."""
    try:
        from uv import find_uv_bin

        return str(find_uv_bin())
    except (ImportError, FileNotFoundError):
        pass
    return which("uv", env_var="UV", hint="install it with `pip install uv` or set $UV")


FILTER_CHUNK = 1 << 20


@contextlib.contextmanager
def _piped(
    argv: Sequence[Arg],
    *,
    tool: str | None,
    env: Mapping[str, str] | None,
    hint: str | None,
    stdin: int,
    bufsize: int = -1,
) -> Iterator[tuple[subprocess.Popen[bytes], Callable[[int], None]]]:
    """Start ``argv`` with stdout a pipe and stderr kept in a temporary file; yields the child
    and ``check(returncode)``, which raises :class:`ToolFailed` with the stderr's tail for a
    non-zero status."""
    real = [_reveal(a) for a in argv]
    shown = tuple(_redact(a) for a in argv)
    name = tool or Path(shown[0]).name
    log.debug("running: %s", " ".join(shown))
    with tempfile.TemporaryFile() as errfile:
        spawned = False
        try:
            with started(
                real,
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=errfile,
                env=dict(env) if env is not None else None,
                bufsize=bufsize,
            ) as child:
                spawned = True

                def check(returncode: int) -> None:
                    if returncode != 0:
                        errfile.seek(0)
                        tail = _tail(errfile.read().decode(errors="replace"))
                        why = failure_hint(returncode, tail)
                        raise ToolFailed(name, shown, returncode, tail, hint=why)

                yield child, check
        except FileNotFoundError as exc:
            if not spawned and exc.filename in (real[0], None):
                raise ToolNotFound(name, hint=hint) from exc
            raise


@contextlib.contextmanager
def filter_bytes(
    argv: Sequence[Arg],
    sink: Callable[[bytes], None],
    *,
    tool: str | None = None,
    env: Mapping[str, str] | None = None,
    hint: str | None = None,
) -> Iterator[Callable[[bytes | bytearray | memoryview], None]]:
    """Run ``argv`` as a byte filter (a compressor, a decompressor) through small buffers.

    Yields a ``write(bytes)`` function feeding the command's stdin; a thread hands its stdout to
    ``sink`` in chunks of at most 1 MiB as it comes. When the block ends stdin is closed and the
    command waited for: a non-zero exit raises :class:`ToolFailed` with its stderr, an exception
    from ``sink`` is raised here, and an exception inside the block kills the command.
    """
    name = tool or Path(_redact(argv[0])).name
    with _piped(argv, tool=tool, env=env, hint=hint, stdin=subprocess.PIPE, bufsize=0) as (
        child,
        check,
    ):
        assert child.stdin is not None and child.stdout is not None
        stdin_fd, stdout_fd = child.stdin.fileno(), child.stdout.fileno()
        for fd in (stdin_fd, stdout_fd):
            with contextlib.suppress(OSError, AttributeError):  # a larger pipe: fewer switches
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, FILTER_CHUNK)
        failures: list[BaseException] = []

        def pump() -> None:
            try:
                while data := os.read(stdout_fd, FILTER_CHUNK):
                    sink(data)
            except BaseException as exc:
                failures.append(exc)
                child.kill()

        reader = threading.Thread(target=pump, name=f"{name}-stdout", daemon=True)
        reader.start()

        def finish() -> None:
            reader.join()
            child.stdout.close()  # type: ignore[union-attr]
            returncode = child.wait()
            if failures:
                raise failures[0]
            check(returncode)

        def write(data: bytes | bytearray | memoryview) -> None:
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(stdin_fd, view) :]
            except BrokenPipeError:
                finish()  # the command died: say why
                raise

        try:
            yield write
        except BaseException:
            child.kill()
            with contextlib.suppress(OSError):
                child.stdin.close()
            reader.join()
            child.stdout.close()
            child.wait()
            raise
        child.stdin.close()
        finish()


@contextlib.contextmanager
def reading(
    argv: Sequence[Arg],
    *,
    tool: str | None = None,
    env: Mapping[str, str] | None = None,
    hint: str | None = None,
) -> Iterator[IO[bytes]]:
    """Run ``argv`` and yield its stdout as a binary stream to read (a decompressor's output).

    When the block ends the command is waited for (killed if the block did not read to the end
    or raised); a non-zero exit of a command read to its end raises :class:`ToolFailed`.
    """
    with _piped(argv, tool=tool, env=env, hint=hint, stdin=subprocess.DEVNULL) as (child, check):
        assert child.stdout is not None
        try:
            yield child.stdout
        except BaseException:
            child.kill()
            child.stdout.close()
            child.wait()
            raise
        at_end = child.stdout.read(1) == b""
        if not at_end:
            child.kill()
        child.stdout.close()
        returncode = child.wait()
        if at_end:
            check(returncode)
