"""What apply is asked to make real: a spec and its lock, or the spec and lock a snapshot names.

Everything is read and checked here, before anything on the machine changes: the spec loads, the
lock exists, reads, and was locked from this very spec (its spec hash matches).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from envbuild.apply.generations import Generation, list_generations
from envbuild.apply.paths import Paths
from envbuild.errors import EnvbuildError, InputFileError, ManifestError, UserError
from envbuild.fsio import sha256_bytes
from envbuild.lock.core import find_lock
from envbuild.lock.io import loads as parse_lock
from envbuild.lock.model import Lock
from envbuild.spec.load import LoadedSpec, load_spec
from envbuild.spec.model import Spec


@dataclass(frozen=True)
class ApplyInput:
    """A spec and the lock to build it from, checked to belong together."""

    spec: Spec
    spec_hash: str
    lock: Lock
    lock_text: str
    #: The spec file and its lock, relative to their repository (as a snapshot records them).
    spec_path: str
    lock_path: str
    #: What the user named: the spec, or the snapshot.
    origin: str
    #: The loaded spec file, when there is one (source builds and patches need its files).
    loaded: LoadedSpec | None = None
    #: The generation a snapshot was found in (its copies of spec and lock were read).
    generation: Generation | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def lock_sha256(self) -> str:
        return sha256_bytes(self.lock_text.encode())


def from_spec(path: Path | str, *, lock: Path | None = None) -> ApplyInput:
    loaded = load_spec(path)
    lock_file = lock or find_lock(loaded)
    shown = loaded.display(lock_file)
    text = _read_lock_text(lock_file, shown, loaded.display(loaded.path))
    parsed = parse_lock(text, shown)
    spec_hash = loaded.spec_hash()
    if parsed.envbuild.spec_hash != spec_hash:
        raise UserError(
            f"{shown} is stale: it was locked from another version of "
            f"{loaded.display(loaded.path)} (spec hash {parsed.envbuild.spec_hash[:12]}…, "
            f"the spec is now {spec_hash[:12]}…)",
            hint=f"run `envbuild lock {loaded.display(loaded.path)}` and commit the lock",
        )
    return ApplyInput(
        spec=loaded.spec,
        spec_hash=spec_hash,
        lock=parsed,
        lock_text=text,
        spec_path=loaded.repo_path(loaded.path),
        lock_path=loaded.repo_path(lock_file),
        origin=loaded.display(loaded.path),
        loaded=loaded,
    )


def from_generation(gen: Generation, origin: str) -> ApplyInput:
    """The spec and lock a generation keeps (``spec.json``, ``pylock.toml``)."""
    try:
        spec = Spec.model_validate_json((gen.path / "spec.json").read_bytes())
        text = (gen.path / "pylock.toml").read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{gen.path}: cannot read the spec and lock kept here: {exc}") from exc
    return ApplyInput(
        spec=spec,
        spec_hash=gen.meta.spec_hash,
        lock=parse_lock(text, str(gen.path / "pylock.toml")),
        lock_text=text,
        spec_path=gen.meta.spec_path,
        lock_path=gen.meta.lock_path,
        origin=origin,
        generation=gen,
    )


def _read_lock_text(path: Path, shown: str, spec_shown: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputFileError(
            shown,
            "no such lock",
            hint=f"run `envbuild lock {spec_shown}` first; apply builds only from a lock",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputFileError(shown, f"cannot be read: {exc}") from None


def from_snapshot(path: Path, paths: Paths) -> ApplyInput:
    """The spec and lock a snapshot names, found by their digests: first among this machine's
    generations (which keep copies), then at the paths the snapshot records (relative to the
    current directory, where the repository is)."""
    from envbuild.snapshot.model.core import load_snapshot

    snap = load_snapshot(path)
    ref = snap.spec
    if ref is None or ref.lock_sha256 is None or ref.lock_path is None:
        raise ManifestError(
            f"{path}: the snapshot names no spec and lock, so there is nothing to recreate",
            hint="use a snapshot written by `envbuild apply` or `envbuild snapshot --spec SPEC`",
        )
    kept = next(
        (
            gen
            for gen in reversed(list_generations(paths))
            if gen.meta.lock_sha256 == ref.lock_sha256 and gen.meta.spec_hash == ref.spec_hash
        ),
        None,
    )
    if kept is not None:
        # the generation's copies decide; the repository's spec file, when it is the same,
        # comes along for source builds and patches (a modified generation is rebuilt)
        return replace(from_generation(kept, str(path)), loaded=_same_spec(ref.path, ref.spec_hash))
    spec_file = Path(ref.path)
    if not spec_file.is_file():
        raise InputFileError(
            ref.path,
            f"the spec {path} names is not here, and no generation keeps a copy",
            hint="run this from the repository (at the commit the snapshot was taken from)",
        )
    loaded = load_spec(spec_file)
    lock_file = Path(ref.lock_path)
    lock_sha = sha256_bytes(lock_file.read_bytes()) if lock_file.is_file() else "missing"
    if loaded.spec_hash() != ref.spec_hash or lock_sha != ref.lock_sha256:
        raise UserError(
            f"{ref.path} or {ref.lock_path} changed since {path} was taken "
            f"(spec {loaded.spec_hash()[:12]}… vs {ref.spec_hash[:12]}…, lock "
            f"{lock_sha[:12]}… vs {ref.lock_sha256[:12]}…)",
            hint="check out the commit the snapshot was taken from, then apply it again",
        )
    return replace(from_spec(spec_file, lock=lock_file), origin=str(path))


def _same_spec(path: str, spec_hash: str) -> LoadedSpec | None:
    """The spec file at ``path`` if it is there, loads, and has ``spec_hash``; else None."""
    if not Path(path).is_file():
        return None
    try:
        loaded = load_spec(path)
    except EnvbuildError:
        return None
    return loaded if loaded.spec_hash() == spec_hash else None


def load_input(path: Path, paths: Paths) -> ApplyInput:
    """A spec (TOML) or a snapshot (JSON)."""
    return from_snapshot(path, paths) if is_snapshot(path) else from_spec(path)


def is_snapshot(path: Path) -> bool:
    """Snapshots are JSON; specs are TOML."""
    return path.suffix == ".json"
