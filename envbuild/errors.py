"""envbuild's one error tree.

Every error the core raises is an :class:`EnvbuildError`. The CLI maps each branch to an exit code
and a rendering; the core never prints and never exits.

* :class:`UserError` (exit 2): the input is wrong (a spec, an argument, a manifest). The message
  names the place and says how to fix it.
* :class:`EnvironmentFailure` (exit 3): the input may be fine but the world is not: a tool is
  missing, a command failed, the network or the engine did not answer, the disk is full.

Exit 1 is not an error: it means a command found a difference (a stale lock, a drift, a diff).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol


class ExitCode:
    OK = 0
    DIFFERENT = 1
    USER_ERROR = 2
    ENVIRONMENT = 3
    INTERNAL = 4
    INTERRUPTED = 130


class Interrupted(KeyboardInterrupt):
    """A signal (SIGINT, SIGTERM, SIGHUP) stopped envbuild: its children were stopped with it
    (:func:`envbuild.proc.core.stopping_on_signals`) and it exits with 128 + the signal's number
    (130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP), as a shell reports a process the signal
    killed. A KeyboardInterrupt, so that what undoes a half-done step on Ctrl-C runs for each."""

    def __init__(self, signum: int, name: str) -> None:
        super().__init__(name)
        self.signum = signum
        self.name = name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class Severity(StrEnum):
    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True, order=True)
class Problem:
    """One located problem with an input file.

    ``key`` is the dotted path of the offending key (``serve.tensor_parallel_size``), ``line``
    its 1-based line in ``file`` when known.
    """

    file: str
    line: int | None
    key: str
    message: str
    hint: str | None = None
    severity: Severity = Severity.ERROR

    def render(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        key = f" {self.key}:" if self.key else ""
        text = f"{where}:{key} {self.severity.value}: {self.message}"
        if self.hint:
            text += f" (fix: {self.hint})"
        return text

    def as_dict(self) -> dict[str, object]:
        return {
            "file": self.file,
            "line": self.line,
            "key": self.key,
            "message": self.message,
            "hint": self.hint,
            "severity": self.severity.value,
        }


class EnvbuildError(Exception):
    """Base of every error envbuild raises on purpose."""

    exit_code: int = ExitCode.ENVIRONMENT

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def lines(self) -> list[str]:
        """The message as the CLI shows it, one item per line."""
        out = [self.message]
        if self.hint:
            out.append(f"hint: {self.hint}")
        return out


class UserError(EnvbuildError):
    """The input is wrong: fix the spec, the arguments or the file named."""

    exit_code = ExitCode.USER_ERROR


class AnswerTooLarge(UserError):
    """A server sent more than envbuild reads of one answer (a registry's manifest, index, token
    or referrer): refused at the limit, named by its URL. What it sent is bad input, not a
    failure of the network."""

    def __init__(self, url: str, limit: int) -> None:
        super().__init__(
            f"{url} answered with more than {limit} bytes, the most envbuild reads of one "
            "registry answer",
            hint="a manifest, an index or an SBOM is far smaller: check the registry (or a "
            "proxy before it) at that URL",
        )
        self.url = url
        self.limit = limit


class UsageError(UserError):
    """Bad command-line arguments."""


class InputFileError(UserError):
    """A file named on the command line is missing, unreadable, empty or not what it should be."""

    def __init__(self, path: Path | str, message: str, *, hint: str | None = None) -> None:
        super().__init__(f"{path}: {message}", hint=hint)
        self.path = str(path)


class SpecError(UserError):
    """A spec has one or more errors. Carries every problem found, not only the first."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.file, p.line or 0, p.key, p.message))
        errors = [p for p in self.problems if p.severity is Severity.ERROR]
        first = errors[0] if errors else (self.problems[0] if self.problems else None)
        summary = first.render() if first else "invalid spec"
        if len(errors) > 1:
            summary += f" (and {len(errors) - 1} more)"
        super().__init__(summary)

    def lines(self) -> list[str]:
        return [p.render() for p in self.problems]


class ManifestError(UserError):
    """A lockfile, snapshot or build manifest cannot be read or is of an unknown format."""


class NewerFormat(ManifestError):
    """A file was written by a newer envbuild in a format this one cannot read (upgrade)."""


class OutputError(UserError):
    """An output path cannot be written (missing parent, permissions, read-only file system)."""


class ResolutionFailed(UserError):
    """The resolver proved the spec's requirements cannot be satisfied together (an impossible
    pin, a cutoff that hides a version). Carries the resolver's own explanation."""

    def __init__(self, message: str, explanation: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.explanation = explanation

    def lines(self) -> list[str]:
        out = [self.message]
        out.extend("  " + line for line in self.explanation.rstrip().splitlines())
        if self.hint:
            out.append(f"hint: {self.hint}")
        return out


class EnvironmentFailure(EnvbuildError):
    """The world is not as needed: a missing tool, a failed command, no network, no engine."""

    exit_code = ExitCode.ENVIRONMENT


class ToolNotFound(EnvironmentFailure):
    def __init__(self, tool: str, *, hint: str | None = None) -> None:
        super().__init__(f"{tool} was not found", hint=hint)
        self.tool = tool


class ToolFailed(EnvironmentFailure):
    """An external command exited non-zero. Carries the redacted argv and the output's tail."""

    def __init__(
        self,
        tool: str,
        argv: Sequence[str],
        returncode: int,
        output_tail: str,
        *,
        hint: str | None = None,
        summary: str | None = None,
    ) -> None:
        head = summary or f"{tool} failed with exit code {returncode}"
        super().__init__(head, hint=hint)
        self.tool = tool
        self.argv = list(argv)
        self.returncode = returncode
        self.output_tail = output_tail

    def lines(self) -> list[str]:
        out = [self.message, f"command: {' '.join(self.argv)}"]
        if self.output_tail.strip():
            out.append(f"{self.tool} said:")
            out.extend("  " + line for line in self.output_tail.rstrip().splitlines())
        if self.hint:
            out.append(f"hint: {self.hint}")
        return out


class RemovalRefused(EnvironmentFailure):
    """envbuild would have removed a folder with another file system mounted in it (a bind of
    the host's /dev/shm in a chroot a killed build left): nothing across the mount is touched.
    ``path`` is the folder, ``mount`` the mount point (or other device) found in it."""

    def __init__(self, message: str, *, hint: str | None, path: str, mount: str) -> None:
        super().__init__(message, hint=hint)
        self.path = path
        self.mount = mount


#: What a failed command's own last lines say, and what that suggests (first match wins). A
#: failure's hint follows from the failure, never from the tool's name: "install mmdebstrap"
#: is for a mmdebstrap that is not there (ToolNotFound), not for one that ran and failed.


class NoSpace(EnvironmentFailure):
    """A file system is full (or a quota reached): names the folder, the room left there and,
    when known, the room needed (bytes; None: unknown)."""

    def __init__(
        self,
        message: str,
        *,
        folder: str,
        available: int | None,
        needed: int | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.folder = folder
        self.available = available
        self.needed = needed


class IntegrityError(EnvironmentFailure):
    """Bytes did not match the digest they were promised under (download, blob, registry)."""


class StoreError(EnvironmentFailure):
    """The content-addressed store cannot be used (locked, corrupt, out of space)."""


class RegistryError(EnvironmentFailure):
    """An OCI registry could not be reached, refused the credentials or the TLS handshake, or
    answered with an error. ``status`` is the HTTP status when there was one."""

    def __init__(self, message: str, *, hint: str | None = None, status: int | None = None) -> None:
        super().__init__(message, hint=hint)
        self.status = status


class RegistryUnreachable(RegistryError):
    """No answer at all from the registry (connection refused, no route, a time-out): unlike a
    refusal or a TLS mismatch, nothing about the request was wrong."""


class EngineError(EnvironmentFailure):
    """A container engine refused an operation or failed during it. ``host`` names the engine."""

    def __init__(self, message: str, *, host: str, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.host = host


class EngineUnreachable(EngineError):
    """No container engine answers at ``host`` (no socket, no permission, no daemon)."""

    def __init__(self, host: str, reason: str) -> None:
        super().__init__(
            f"no Docker engine answers at {host}: {reason}",
            host=host,
            hint="start dockerd, or set DOCKER_HOST to an engine's socket",
        )
        self.reason = reason


class ContainerStartFailed(EngineError):
    """The engine created a container of ``image`` but could not start it; ``detail`` is the
    engine's own explanation (a missing entrypoint, a bad mount)."""

    def __init__(self, host: str, image: str, detail: str) -> None:
        super().__init__(f"the engine cannot start a container of {image}: {detail}", host=host)
        self.image = image
        self.detail = detail


class Busy(EnvironmentFailure):
    """Another envbuild process holds the lock on what this one wants to change."""


class ServiceFailed(EnvironmentFailure):
    """A service did not start or did not become healthy. Carries its last log lines and what
    was done to put the machine back as it was."""

    def __init__(
        self,
        message: str,
        *,
        log_tail: str = "",
        restored: Sequence[str] = (),
        hint: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.log_tail = log_tail
        self.restored = list(restored)

    def lines(self) -> list[str]:
        out = [self.message]
        if self.log_tail.strip():
            out.append("last log lines:")
            out.extend("  " + line for line in self.log_tail.rstrip().splitlines())
        out.extend(f"restored: {r}" for r in self.restored)
        if self.hint:
            out.append(f"hint: {self.hint}")
        return out


class LinkFindings(UserError):
    """Files of an environment will not load (envbuild.linkcheck): libraries or torch symbols
    they need are missing. Carries one line per finding; a spec accepts a finding by its id in
    ``[image.link_findings]``, with a reason."""

    def __init__(self, where: str, findings: Sequence[str], ids: Sequence[str]) -> None:
        count = len(findings)
        super().__init__(
            f"{where}: {count} file{'s' if count != 1 else ''} will not load",
            hint="fix the distributions named (a build for this torch and CUDA), or accept "
            "each by its id in [image.link_findings] with the reason: "
            + ", ".join(f'"{i}"' for i in sorted(set(ids))[:5]),
        )
        self.findings = list(findings)
        self.ids = list(ids)

    def lines(self) -> list[str]:
        out = [self.message]
        out.extend("  " + line for line in self.findings)
        if self.hint:
            out.append(f"hint: {self.hint}")
        return out


class CacheDamaged(EnvironmentFailure):
    """A cache entry broke between its check and its use (read it again: remove the folder)."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(
            f"{path}: damaged link-check cache entry ({why})", hint=f"remove {path.parent}"
        )


PATCH_HINT = (
    "regenerate the patch against the locked version of the distribution (paths relative to "
    "site-packages, `diff -u a/... b/...`, applied with -p1)"
)


class PatchFailed(UserError):
    """A patch does not apply. Names the patch file and, when ``patch`` said it, the hunk."""

    def __init__(
        self, patch: str, message: str, *, hunks: Sequence[str] = (), output: str = ""
    ) -> None:
        super().__init__(f"{patch}: {message}", hint=PATCH_HINT)
        self.patch = patch
        self.hunks = list(hunks)
        self.output = output

    def lines(self) -> list[str]:
        out = [self.message, *("  " + h for h in self.hunks)]
        if self.output.strip():
            out.append("patch said:")
            out.extend("  " + line for line in self.output.rstrip().splitlines()[-20:])
        if self.hint:
            out.append(f"hint: {self.hint}")
        return out


class BuildFailed(ToolFailed):
    """A source build failed; carries the log's tail. ``killed``: it ran out of memory."""


class ArchMissing(UserError):
    """The built wheel holds no code for a target GPU's compute capability."""


class UnreadableFiles(UserError):
    """Files of an environment that exist but cannot be read: the check cannot be complete."""


class LayerError(UserError):
    """A layer's content cannot be written as asked (a bad path, a device file, a duplicate)."""


class _Pair(Protocol):
    """What :class:`OverlapError` reads of an overlap (``envbuild.build.overlaps.Overlap``)."""

    @property
    def first(self) -> str: ...
    @property
    def second(self) -> str: ...
    @property
    def paths(self) -> Sequence[str]: ...


class OverlapError(UserError):
    """Two distributions write the same path and the spec does not say which one wins."""

    def __init__(self, overlaps: Sequence[_Pair]) -> None:
        first = overlaps[0]
        more = f" (and {len(overlaps) - 1} more pairs)" if len(overlaps) > 1 else ""
        super().__init__(
            f"{first.first} and {first.second} both install {len(first.paths)} path(s), "
            f"e.g. {first.paths[0]}{more}; install order would decide which one the image gets",
            hint=f'say which one wins in the spec: [image.overlaps] "{first.first}" = '
            f'"{first.second}" (or the other way round)',
        )
        self.overlaps = list(overlaps)

    def lines(self) -> list[str]:
        """The error and every pair with (up to 40 of) its paths, for the CLI."""
        out = [self.message]
        for ov in self.overlaps:
            out.append(f"  {ov.first} <-> {ov.second}: {len(ov.paths)} path(s)")
            out.extend(f"    {p}" for p in ov.paths[:40])
            if len(ov.paths) > 40:
                out.append(f"    … {len(ov.paths) - 40} more")
        if self.hint:
            out.append(f"hint: {self.hint}")
        return out


class UnsafeArchive(InputFileError):
    """A base tarball tries to write outside its target, or holds what a layer cannot."""


class StageError(EnvbuildError):
    """One stage of the build failed: its message is the stage's name and the cause's (the
    ``__cause__``: an envbuild error or an OSError), and the cause decides the exit code, the
    hint, the problems and the kind ``--json`` names (an OSError: an environment failure)."""

    def __init__(self, name: str, cause: EnvbuildError | OSError) -> None:
        if isinstance(cause, EnvbuildError):
            text, hint, code = cause.message, cause.hint, cause.exit_code
        else:
            text = f"{cause.strerror or cause} ({cause.filename or ''})"
            hint, code = None, ExitCode.ENVIRONMENT
        super().__init__(f"{name}: {text}", hint=hint)
        self.stage, self.cause, self.exit_code = name, cause, code
        if (problems := getattr(cause, "problems", None)) is not None:
            self.problems = problems

    @property
    def kind(self) -> str:
        """The cause's class name, as ``--json`` shows it (an OSError's: this one's)."""
        return type(self.cause if isinstance(self.cause, EnvbuildError) else self).__name__

    def lines(self) -> list[str]:
        if not isinstance(self.cause, EnvbuildError):
            return super().lines()
        shown = self.cause.lines()
        if shown and shown[0] == self.cause.message and not hasattr(self, "problems"):
            return [self.message, *shown[1:]]
        return shown  # located problems (a spec's) say where they are themselves
