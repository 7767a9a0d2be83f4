"""The one way envbuild runs an external command.

Every subprocess (uv, mmdebstrap, skopeo, nvcc, systemctl …) goes through :func:`run`. It logs the
argv with secrets redacted, captures output (or streams it to the log when asked), and raises
:class:`~envbuild.errors.ToolFailed` quoting the tool's own words when the command fails. A child's
environment is :func:`child_env` (the caller's, without what redirects Python) or, for uv,
:func:`uv_env` (cleaned: only what uv needs, and what may change a result given explicitly).

No child outlives envbuild: each starts through :func:`~envbuild.proc.children.started`, in
a process group of its own, and SIGTERM, SIGINT or SIGHUP stop them all with envbuild
(:mod:`envbuild.proc.children`).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from envbuild.errors import ToolFailed, ToolNotFound
from envbuild.hints import failure_hint
from envbuild.proc.children import (
    STOP_GRACE,
    STOP_SIGNALS,
    started,
    stop_children,
    stopping_on_signals,
    thread_pool,
)

__all__ = [
    "STOP_GRACE",
    "STOP_SIGNALS",
    "started",
    "stop_children",
    "stopping_on_signals",
    "thread_pool",
]

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


def run(  # noqa: PLR0913
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
    hint follows from the failure (:func:`~envbuild.hints.failure_hint`: its exit status and
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


def uv_version() -> str:
    """What ``uv --version`` says (``uv 0.13.9``): part of the key of whatever uv installs."""
    return run([find_uv(), "--version"], tool="uv", env=uv_env()).stdout.strip()


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


def option(flag: str, value: str | Secret) -> list[str | Secret]:
    """``flag`` with its value as one argument, ``--flag=value``, which no tool reads as an
    option of its own whatever the value holds; a :class:`Secret` stays a separate, redacted
    argument after its flag (its grammar makes sure it cannot start with ``-``)."""
    if isinstance(value, Secret):
        return [flag, value]
    return [f"{flag}={value}"]
