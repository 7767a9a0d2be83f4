"""The lock stage: a spec in, ``lockfiles/<spec-name>.pylock.toml`` out.

The lock pins everything the spec leaves to a resolver: every Python distribution with the URL,
size and sha256 of each of its files (PEP 751), and in ``[tool.envbuild]`` what envbuild itself
needs: the spec's hash, the target, the source builds (as sdists, with their flags), the patches
with their digests, and the base. Later stages (build, apply, registry) read it with
:func:`read_lock`.

Public API:

* :func:`lock_path` — where a spec's lock lives;
* :func:`read_lock` — parse and check a lock (:class:`~envbuild.errors.ManifestError` if bad,
  :class:`~envbuild.errors.NewerFormat` if written by a newer envbuild);
* :func:`lock_spec` — resolve with uv and write the lock atomically;
* :func:`check_lock` — does the lock still match the spec, and if not, what changed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from envbuild.errors import ManifestError, NewerFormat, OutputError
from envbuild.fsio import sha256_bytes, write_atomic
from envbuild.lock.base import lock_base
from envbuild.lock.check import Change, LockCheck, compare, patch_records
from envbuild.lock.io import dumps, loads, read_lock
from envbuild.lock.model import (
    LOCK_FORMAT,
    BaseLock,
    EnvbuildLock,
    Lock,
    LockedBuild,
    LockedFile,
    LockedPackage,
    ToolTable,
)
from envbuild.lock.resolve import resolve
from envbuild.lock.target import Target, requirements_of, target_of
from envbuild.spec.load import LoadedSpec

log = logging.getLogger("envbuild.lock")

LOCK_DIR = "lockfiles"
SUFFIX = ".pylock.toml"


@dataclass(frozen=True)
class LockResult:
    spec: str  # the spec file, relative to the repository
    path: Path  # the lock file written (or left as it was)
    lock: Lock
    changed: bool  # False when the file already had exactly these bytes
    sha256: str  # of the lock file's bytes

    def as_dict(self, shown_path: str) -> dict[str, object]:
        return {
            "spec": self.spec,
            "name": self.lock.envbuild.spec,
            "lock": shown_path,
            "changed": self.changed,
            "sha256": self.sha256,
            "packages": len(self.lock.packages),
            "builds": [b.name for b in self.lock.envbuild.builds],
        }


def lock_path(loaded: LoadedSpec) -> Path:
    """``<repo>/lockfiles/<spec-name>.pylock.toml``."""
    return loaded.root / LOCK_DIR / f"{loaded.name}{SUFFIX}"


def build_lock(
    loaded: LoadedSpec, target: Target | None = None, *, base: BaseLock | None = None
) -> Lock:
    """Resolve ``loaded`` and assemble its :class:`Lock` (nothing is written). ``base`` replaces
    the base's entry taken from the spec (a Debian base with its resolved package set)."""
    target = target or target_of(loaded)
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
    return Lock(
        environments=[target.environment_marker()],
        requires_python=f"=={target.python}.*",
        packages=resolution.packages,
        tool=ToolTable(envbuild=envbuild),
    )


def lock_spec(
    loaded: LoadedSpec, *, output: Path | None = None, base: BaseLock | None = None
) -> LockResult:
    """Resolve ``loaded`` with uv and write its lock to ``output`` (default :func:`lock_path`).

    The base's entry comes from the spec (:func:`envbuild.lock.base.lock_base`: a Debian base
    without its package set) unless ``base`` is given, e.g. the base stage's resolved
    :class:`~envbuild.lock.model.DebianBaseLock`.

    The file is written through a temporary file and a rename, and only when its bytes change;
    an unwritable destination is an :class:`OutputError` raised before uv runs when it can be
    seen then. A lock written by a newer envbuild is never overwritten (:class:`NewerFormat`).
    """
    path = Path(output) if output is not None else lock_path(loaded)
    _check_writable(path)
    old = _existing(path)
    target = target_of(loaded)
    lock = build_lock(loaded, target, base=base)
    text = dumps(lock, spec_file=loaded.display(loaded.path))
    data = text.encode("utf-8")
    changed = old != data
    if changed:
        write_atomic(path, data)
        log.info("wrote %s (%d packages)", loaded.display(path), len(lock.packages))
    else:
        log.info("%s is up to date (%d packages)", loaded.display(path), len(lock.packages))
    return LockResult(loaded.display(loaded.path), path, lock, changed, sha256_bytes(data))


def check_lock(loaded: LoadedSpec, *, path: Path | None = None) -> LockCheck:
    """Compare ``loaded`` with its lock without resolving. A missing, unreadable or newer-format
    lock is reported as a change, like a changed pin."""
    path = Path(path) if path is not None else lock_path(loaded)
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
    result.changes.extend(compare(loaded, lock, target_of(loaded)))
    if not result.changes and dumps(lock, spec_file=loaded.display(loaded.path)).encode() != data:
        result.changes.append(
            Change(
                "edited", f"{result.lock} is not as envbuild writes it (edited by hand?); {hint}"
            )
        )
    return result


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


def _existing(path: Path) -> bytes | None:
    """The current lock's bytes; refuses to go on over a lock from a newer envbuild."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        loads(data.decode("utf-8", errors="replace"), str(path))
    except NewerFormat:
        raise
    except ManifestError as exc:
        log.warning("%s; it will be replaced", exc.message)
    return data


__all__ = [
    "LOCK_FORMAT",
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
    "loads",
    "lock_path",
    "lock_spec",
    "read_lock",
]
