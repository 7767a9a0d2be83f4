"""The lock stage: a spec in, ``lockfiles/pylock.<spec-name>.toml`` out (PEP 751's file name).

The lock pins everything the spec leaves to a resolver: every Python distribution with the URL,
size and sha256 of each of its files (PEP 751), and in ``[tool.envbuild]`` what envbuild itself
needs: the spec's hash, the target, the source builds (as sdists, with their flags), the patches
with their digests, and the base. Later stages (build, apply, registry) read it with
:func:`read_lock`.

What it offers:

* :func:`lock_path` — where a spec's lock lives (and is written);
* :func:`find_lock` — the lock to read: :func:`lock_path`, or for one release the old name
  ``lockfiles/<spec-name>.pylock.toml`` with a warning that says how to rename it;
* :func:`read_lock` — parse and check a lock (:class:`~envbuild.errors.ManifestError` if bad,
  :class:`~envbuild.errors.NewerFormat` if written by a newer envbuild);
* :func:`lock_spec` — resolve with uv and write the lock atomically (the base's entry through a
  :class:`BasePinner`: when a Debian base's package set is resolved with mmdebstrap, reused from
  the previous lock, or left unpinned — see :mod:`envbuild.lock.pin`);
* :func:`check_lock` — does the lock still match the spec, and if not, what changed.
"""

from __future__ import annotations

import logging
import os
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from envbuild.errors import ManifestError, NewerFormat, OutputError
from envbuild.fsio import sha256_bytes, write_atomic
from envbuild.lock.base import lock_base
from envbuild.lock.check import Change, LockCheck, base_notes, compare, patch_records
from envbuild.lock.io import dumps, loads, read_lock
from envbuild.lock.model import (
    LOCK_FORMAT,
    BaseLock,
    DebianBaseLock,
    EnvbuildLock,
    Lock,
    LockedBuild,
    LockedFile,
    LockedPackage,
    ToolTable,
)
from envbuild.lock.pin import BaseMode, BasePinner, PinnedBase
from envbuild.lock.resolve import resolve
from envbuild.lock.resolvetarget import ResolveTarget, requirements_of, resolve_target_of
from envbuild.spec import knowledge as kb
from envbuild.spec.load import LoadedSpec

if TYPE_CHECKING:
    from envbuild.lock.wheels import WheelRef

log = logging.getLogger(__name__)

LOCK_DIR = "lockfiles"
PREFIX = "pylock."  # PEP 751: ``pylock.toml`` or ``pylock.<name>.toml``
SUFFIX = ".toml"
LEGACY_SUFFIX = ".pylock.toml"  # envbuild 0.1 named locks <spec>.pylock.toml: read until 0.2


@dataclass(frozen=True)
class LockResult:
    spec: str  # the spec file, relative to the repository
    path: Path  # the lock file written (or left as it was)
    lock: Lock
    changed: bool  # False when the file already had exactly these bytes
    sha256: str  # of the lock file's bytes
    base: str = "spec"  # spec | given | reused | resolved | unpinned (PinnedBase.source)
    warnings: list[str] = field(default_factory=list)  # what the lock holds that may not work

    def as_dict(self, shown_path: str) -> dict[str, object]:
        return {
            "spec": self.spec,
            "name": self.lock.envbuild.spec,
            "lock": shown_path,
            "changed": self.changed,
            "sha256": self.sha256,
            "packages": len(self.lock.packages),
            "builds": [b.name for b in self.lock.envbuild.builds],
            "base": self.base_summary(),
            "warnings": self.warnings,
        }

    def base_summary(self) -> dict[str, object]:
        """The base's kind and, for a Debian base, how many packages it pins and where the set
        came from (reused from the previous lock, resolved now, or left unpinned)."""
        base = self.lock.envbuild.base
        out: dict[str, object] = {"kind": base.kind if base else None, "source": self.base}
        if isinstance(base, DebianBaseLock):
            out["packages"] = len(base.packages)
        return out


def lock_path(loaded: LoadedSpec) -> Path:
    """``<repo>/lockfiles/pylock.<spec-name>.toml``, the name PEP 751 gives a named lock (so
    ``uv pip install -r`` and ``packaging.pylock`` accept it)."""
    return loaded.root / LOCK_DIR / f"{PREFIX}{loaded.name}{SUFFIX}"


def legacy_lock_path(loaded: LoadedSpec) -> Path:
    """``<repo>/lockfiles/<spec-name>.pylock.toml``: the name envbuild 0.1 used (not PEP 751's)."""
    return loaded.root / LOCK_DIR / f"{loaded.name}{LEGACY_SUFFIX}"


def rename_hint(loaded: LoadedSpec) -> str:
    """The command that moves a lock from its old name to PEP 751's (history follows), as it
    runs from where the user is: ``git -C <repository>`` unless that is here."""
    old, new = loaded.repo_path(legacy_lock_path(loaded)), loaded.repo_path(lock_path(loaded))
    here = Path.cwd().resolve() == Path(loaded.root).resolve()
    git = "git" if here else f"git -C {shlex.quote(str(loaded.root))}"
    return f"{git} mv {old} {new}"


def find_lock(loaded: LoadedSpec) -> Path:
    """The spec's lock to read: :func:`lock_path`; when only the old name exists (one release
    of grace), that one, with a warning saying how to rename it. Neither: :func:`lock_path`,
    so a "no such lock" message names the file to create."""
    path = lock_path(loaded)
    legacy = legacy_lock_path(loaded)
    if not path.exists() and legacy.is_file():
        log.warning(
            "%s has the old name: PEP 751 names locks pylock.<name>.toml (uv refuses the old "
            "one); rename it: %s", loaded.display(legacy), rename_hint(loaded),
        )  # fmt: skip
        return legacy
    return path


def build_lock(
    loaded: LoadedSpec, target: ResolveTarget | None = None, *, base: BaseLock | None = None
) -> Lock:
    """Resolve ``loaded`` and assemble its :class:`Lock` (nothing is written). ``base`` replaces
    the base's entry taken from the spec (a Debian base with its resolved package set)."""
    target = target or resolve_target_of(loaded)
    resolution = resolve(loaded, target)
    envbuild = EnvbuildLock(
        format=LOCK_FORMAT,
        spec=loaded.name,
        spec_hash=loaded.spec_hash(),
        python=target.python,
        platform=target.platform,
        exclude_newer=target.exclude_newer,
        indexes=target.indexes,
        requirements=requirements_of(loaded),
        builds=resolution.builds,
        patches=patch_records(loaded),
        base=base or lock_base(loaded),
    )
    lock = Lock(
        environments=[target.environment_marker()],
        requires_python=f"=={target.python}.*",
        packages=resolution.packages,
        tool=ToolTable(envbuild=envbuild),
    )
    if not envbuild.builds:
        return lock
    requires = closure_requires(loaded, lock)
    return lock.model_copy(
        update={"tool": ToolTable(envbuild=envbuild.model_copy(update={"requires": requires}))}
    )


def closure_requires(loaded: LoadedSpec, lock: Lock) -> dict[str, list[str]]:
    """The Requires-Dist of every locked wheel the source builds' closures read, by sha256."""
    from envbuild.lock.closure import closures, wheel_requires

    seen: dict[str, list[str]] = {}

    def record(wheel: WheelRef) -> list[str]:
        seen[wheel.sha256] = wheel_requires(wheel)
        return list(seen[wheel.sha256])

    closures(lock, loaded.spec.builds, record)
    return dict(sorted(seen.items()))


def lock_spec(
    loaded: LoadedSpec,
    *,
    output: Path | None = None,
    base: BaseLock | None = None,
    pinner: BasePinner | None = None,
) -> LockResult:
    """Resolve ``loaded`` with uv and write its lock to ``output`` (default :func:`lock_path`).

    The base's entry is ``base`` when given; otherwise ``pinner`` decides it (default
    ``BasePinner()``, mode ``keep``: never runs mmdebstrap, keeps the Debian package set the
    previous lock pinned while the spec's [base] is unchanged). The previous locks are the one
    at ``output`` and, when ``output`` is another path, the spec's own (:func:`lock_path`). The
    base is settled before uv runs, so a missing mmdebstrap fails fast
    (:class:`~envbuild.errors.ToolNotFound`).

    The file is written through a temporary file and a rename, and only when its bytes change;
    an unwritable destination is an :class:`OutputError` raised before uv runs when it can be
    seen then. A lock written by a newer envbuild is never overwritten (:class:`NewerFormat`).
    """
    path = Path(output) if output is not None else lock_path(loaded)
    _check_writable(path)
    old, previous = _existing(path)
    target = resolve_target_of(loaded)
    if base is not None:
        pinned = PinnedBase(base, "given")
    else:
        candidates = [previous] if previous is not None else []
        if path.resolve() != lock_path(loaded).resolve():
            candidates += [lk for lk in [_readable(lock_path(loaded))] if lk is not None]
        legacy = legacy_lock_path(loaded)
        if output is None and legacy.is_file():
            candidates += [lk for lk in [_readable(legacy)] if lk is not None]
        pinner = pinner if pinner is not None else BasePinner()
        pinned = pinner.pin(loaded, target.exclude_newer, candidates)
    lock = build_lock(loaded, target, base=pinned.base)
    text = dumps(lock, spec_file=loaded.repo_path(loaded.path))
    data = text.encode("utf-8")
    changed = old != data
    if changed:
        write_atomic(path, data)
        log.info("wrote %s (%d packages)", loaded.display(path), len(lock.packages))
    else:
        log.info("%s is up to date (%d packages)", loaded.display(path), len(lock.packages))
    warnings = driver_warnings(loaded, lock)
    if output is None and legacy_lock_path(loaded).is_file():
        warnings.append(
            f"{loaded.display(legacy_lock_path(loaded))} is the lock's old name and is no longer "
            f"read now that {loaded.display(path)} exists: remove it (`git rm`), or next time "
            f"rename before locking so history follows: {rename_hint(loaded)}"
        )
    for warning in warnings:
        log.warning("%s: %s", loaded.display(path), warning)
    return LockResult(
        loaded.display(loaded.path), path, lock, changed, sha256_bytes(data), pinned.source,
        warnings,
    )  # fmt: skip


def driver_warnings(loaded: LoadedSpec, lock: Lock) -> list[str]:
    """Locked run-time compilers from a CUDA newer than ``host.driver`` runs: the driver
    cannot load the PTX they emit. (``apply`` warns again, against the real driver.)"""
    host = loaded.spec.host
    if host is None:
        return []
    out = []
    packages = [(p.name, p.version) for p in lock.packages if kb.is_run_time_compiler(p.name)]
    for major in sorted({int(m) for _, v in packages if (m := v.split(".")[0]).isdigit()}):
        runs = kb.newest_cuda_for(host.driver, major)
        newer = kb.newer_run_time_compilers(runs, packages) if runs else []
        if newer:
            out.append(
                f"run-time compilers {', '.join(newer)} are newer than CUDA {runs}, the newest "
                f"driver {host.driver} runs: it cannot load the PTX they emit (SASS loads); "
                f"pin them to {runs}.* in [packages], or raise host.driver"
            )
    return out


def check_lock(loaded: LoadedSpec, *, path: Path | None = None) -> LockCheck:
    """Compare ``loaded`` with its lock without resolving. A missing, unreadable or newer-format
    lock is reported as a change, like a changed pin."""
    path = Path(path) if path is not None else find_lock(loaded)
    result = LockCheck(spec=loaded.display(loaded.path), lock=loaded.display(path))
    hint = f"run `envbuild lock {loaded.display(loaded.path)}`"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        result.changes.append(Change("missing", f"{result.lock} does not exist; {hint}"))
        return result
    except OSError as exc:
        result.changes.append(Change("unreadable", f"{result.lock}: {exc.strerror or exc}"))
        return result
    try:
        lock = loads(data.decode("utf-8", errors="replace"), result.lock)
    except NewerFormat as exc:
        result.changes.append(Change("format", f"{exc.message}; {exc.hint}"))
        return result
    except ManifestError as exc:
        result.changes.append(Change("unreadable", f"{exc.message}; {hint}"))
        return result
    result.changes.extend(compare(loaded, lock, resolve_target_of(loaded)))
    if not result.changes and dumps(lock, spec_file=loaded.repo_path(loaded.path)).encode() != data:
        written = _format_of(data)
        if written is not None and written < LOCK_FORMAT:
            message = (
                f"{result.lock} is in lock format {written}, this envbuild writes {LOCK_FORMAT}"
            )
            result.changes.append(Change("format", f"{message}; {hint}"))
        else:
            message = f"{result.lock} is not as envbuild writes it (edited by hand?)"
            result.changes.append(Change("edited", f"{message}; {hint}"))
    if result.ok:
        result.notes.extend(base_notes(lock.envbuild))
    return result


def _format_of(data: bytes) -> int | None:
    """``tool.envbuild.format`` as written in the file (before any conversion)."""
    try:
        fmt = tomllib.loads(data.decode("utf-8"))["tool"]["envbuild"]["format"]
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, KeyError, TypeError):
        return None
    return fmt if isinstance(fmt, int) else None


def _check_writable(path: Path) -> None:
    parent = path.parent
    probe = parent
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        raise OutputError(
            f"cannot write {path}: {probe} is not a writable directory",
            hint="make it writable, or choose another path with --output",
        )
    if path.is_dir():
        raise OutputError(f"cannot write {path}: it is a directory")


def _existing(path: Path) -> tuple[bytes | None, Lock | None]:
    """The current lock's bytes and, when it reads, the lock; refuses to go on over a lock from
    a newer envbuild."""
    try:
        data = path.read_bytes()
    except OSError:
        return None, None
    try:
        return data, loads(data.decode("utf-8", errors="replace"), str(path))
    except NewerFormat:
        raise
    except ManifestError as exc:
        log.warning("%s; it will be replaced", exc.message)
    return data, None


def _readable(path: Path) -> Lock | None:
    """The lock at ``path`` if there is a readable one (a source of a pinned base to reuse)."""
    try:
        return read_lock(path)
    except ManifestError:  # NewerFormat included: not ours to read
        return None


__all__ = [
    "LOCK_FORMAT",
    "BaseMode",
    "BasePinner",
    "Change",
    "Lock",
    "LockCheck",
    "LockResult",
    "LockedBuild",
    "LockedFile",
    "LockedPackage",
    "build_lock",
    "check_lock",
    "dumps",
    "find_lock",
    "legacy_lock_path",
    "loads",
    "lock_path",
    "lock_spec",
    "read_lock",
]
