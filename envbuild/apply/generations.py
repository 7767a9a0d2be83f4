"""Generations: immutable environments under the state dir, and the ``current`` symlink.

Layout (under :attr:`Paths.state`)::

    generations/<n>-<hash>/            one generation, read-only once complete
        generation.json                what it is (spec, hashes, date, unit); written last
        spec.json  pylock.toml  pylock.install.toml  <unit>.service  venv/
    generations/<n>-<hash>.snapshot.json   the snapshot of the machine after it was applied
    generations/.tmp-*                 a generation being built (removed when found later)
    current -> generations/<n>-<hash>  switched atomically (new symlink, then rename)
    lock                               flock(2) held by apply, rollback and gc

``<hash>`` is the generation's content hash (lock, spec hash, envbuild's generation format and
the store wheels it installs), so an identical request finds its generation again. ``<n>`` counts
up; a generation that had to be rebuilt (its files were edited) gets a new ``n``.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envbuild.apply.paths import Paths
from envbuild.errors import ManifestError, OutputError, UserError
from envbuild.fsio import compact_json, fsync_dir, rmtree, sha256_bytes

log = logging.getLogger(__name__)

#: Bump when what a generation holds, or how it is built, changes: old ones are then rebuilt.
GENERATION_FORMAT = 2
META = "generation.json"
HASH_LEN = 32
_NAME = re.compile(rf"^(\d+)-([0-9a-f]{{{HASH_LEN}}})$")


class Interpreter(BaseModel):
    """The Python the venv runs, as it was when the generation was built."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="where venv/bin/python leads (its symlinks resolved)")
    version: str = Field(description="sys.version_info as MAJOR.MINOR.MICRO")
    sha256: str = Field(description="of that binary")


class GenerationMeta(BaseModel):
    """``generation.json``: what a generation is. Written once, when it is complete."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int = GENERATION_FORMAT
    number: int
    content_hash: str
    spec_name: str
    spec_hash: str
    lock_sha256: str
    created: datetime = Field(description="when it was built (state-dir metadata, UTC)")
    python: str
    origin: str = Field(description="what apply was given: the spec or a snapshot")
    spec_path: str = Field(description="the spec file, relative to its repository")
    lock_path: str = Field(description="the lock file, relative to its repository")
    unit: str | None = Field(None, description="the systemd unit it serves with, if any")
    packages: dict[str, str] = Field(description="distribution -> version the venv must hold")
    files: dict[str, str] = Field(description="its own files (not the venv) -> sha256")
    interpreter: Interpreter | None = Field(
        None, description="the venv's interpreter at build time (absent in older generations)"
    )
    record_exceptions: dict[str, str] = Field(
        default_factory=dict,
        description="'<dist>/<path>' of files whose bytes differed from their wheel's own RECORD "
        "right after install (a wheel published so) -> the sha256 they had then",
    )
    trees: dict[str, str] = Field(
        default_factory=dict,
        description="distribution -> the store's install tree its venv files are linked from",
    )
    link_mode: str | None = Field(
        None, description="how tree files were put in the venv: hardlink, reflink or copy"
    )
    overlaps: dict[str, str] = Field(
        default_factory=dict,
        description="venv-relative path -> the distribution whose file it is, where two "
        "install it with other bytes (as the spec's [image.overlaps] says)",
    )
    image: str | None = Field(
        None,
        description="REGISTRY/REPO@sha256:… of the image whose /opt/venv this venv is, file for "
        "file (`apply --image`); absent for a venv installed from wheels",
    )
    venv_files: dict[str, str] = Field(
        default_factory=dict,
        description="the venv's own files (uv venv's: pyvenv.cfg, bin/python …), venv-relative "
        "-> 'sha256:<hex>', or 'link:<target>' for a symlink",
    )


@dataclass(frozen=True)
class Generation:
    number: int
    path: Path
    meta: GenerationMeta

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def venv(self) -> Path:
        return self.path / "venv"

    @property
    def snapshot_file(self) -> Path:
        """The snapshot taken when the generation was made: kept as it is."""
        return self.path.with_name(self.path.name + ".snapshot.json")

    def snapshot_files(self) -> list[Path]:
        """Every snapshot of it, the first (from when it was made) first, then one per later
        apply that found it (``<name>.snapshot.<k>.json``, k = 2, 3 …)."""
        later = []
        for entry in self.path.parent.glob(self.path.name + ".snapshot.*.json"):
            k = entry.name[len(self.path.name + ".snapshot.") : -len(".json")]
            if k.isdigit():
                later.append((int(k), entry))
        first = [self.snapshot_file] if self.snapshot_file.exists() else []
        return first + [e for _k, e in sorted(later)]

    def next_snapshot_file(self) -> Path:
        """Where the next snapshot goes: the first one's name, else the next number."""
        have = self.snapshot_files()
        if not have:
            return self.snapshot_file
        last = have[-1].name[len(self.path.name + ".snapshot.") : -len(".json")]
        k = int(last) + 1 if last.isdigit() else 2
        return self.path.with_name(f"{self.path.name}.snapshot.{k}.json")

    def unit_file(self) -> Path | None:
        return self.path / self.meta.unit if self.meta.unit else None


def content_hash(
    *,
    lock_text: str,
    spec_hash: str,
    store_wheels: dict[str, str],
    machine: dict[str, str],
    image: str | None = None,
) -> str:
    """What names a generation: everything that decides its bytes (``machine``: the paths on
    this machine its unit names; ``image``: the digest of the image its venv was taken from)."""
    payload: dict[str, object] = {
        "format": GENERATION_FORMAT,
        "lock_sha256": sha256_bytes(lock_text.encode()),
        "spec_hash": spec_hash,
        "store_wheels": dict(sorted(store_wheels.items())),
        "machine": dict(sorted(machine.items())),
    }
    if image is not None:
        payload["image"] = image
    return sha256_bytes(compact_json(payload))[:HASH_LEN]


def dir_name(number: int, chash: str) -> str:
    return f"{number}-{chash[:HASH_LEN]}"


def read_meta(path: Path) -> GenerationMeta:
    try:
        return GenerationMeta.model_validate_json((path / META).read_bytes())
    except OSError as exc:
        raise ManifestError(f"{path / META}: cannot read: {exc.strerror or exc}") from exc
    except ValidationError as exc:
        raise ManifestError(
            f"{path / META}: not a generation record ({exc.error_count()} errors)"
        ) from exc


def list_generations(paths: Paths) -> list[Generation]:
    """Complete generations, oldest first. Half-built ones (no ``generation.json``) are skipped."""
    out: list[Generation] = []
    if not paths.generations.is_dir():
        return out
    for entry in paths.generations.iterdir():
        m = _NAME.match(entry.name)
        if not m or not entry.is_dir() or not (entry / META).is_file():
            continue
        try:
            meta = read_meta(entry)
        except ManifestError as exc:
            log.warning("skipping %s: %s", entry.name, exc.message)
            continue
        out.append(Generation(int(m.group(1)), entry, meta))
    return sorted(out, key=lambda g: g.number)


def next_number(paths: Paths) -> int:
    numbers = [0]
    if paths.generations.is_dir():
        for entry in paths.generations.iterdir():
            if m := _NAME.match(entry.name):
                numbers.append(int(m.group(1)))
    return max(numbers) + 1


def current(paths: Paths) -> Generation | None:
    """The generation ``current`` points to, or None before the first apply."""
    try:
        target = os.readlink(paths.current)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ManifestError(f"{paths.current}: not a symlink ({exc.strerror})") from exc
    name = Path(target).name
    for gen in list_generations(paths):
        if gen.name == name:
            return gen
    raise ManifestError(
        f"{paths.current} points to {target}, which is not a complete generation",
        hint="switch to a good one with `envbuild rollback --to N`",
    )


def find(paths: Paths, number: int) -> Generation:
    for gen in list_generations(paths):
        if gen.number == number:
            return gen
    known = ", ".join(str(g.number) for g in list_generations(paths)) or "none"
    raise UserError(f"there is no generation {number}", hint=f"generations here: {known}")


def set_current(paths: Paths, gen: Generation | None) -> None:
    """Point ``current`` at ``gen`` atomically (a new symlink renamed over the old one);
    ``None`` removes it (back to before the first apply)."""
    if gen is None:
        paths.current.unlink(missing_ok=True)
        fsync_dir(paths.state)
        return
    tmp = paths.state / f".current.{os.getpid()}"
    tmp.unlink(missing_ok=True)
    try:
        os.symlink(Path("generations") / gen.name, tmp)
        os.replace(tmp, paths.current)
        fsync_dir(paths.state)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot switch {paths.current}: {exc.strerror or exc}") from exc
    log.info("current -> generation %d (%s)", gen.number, gen.name)


def freeze(path: Path) -> None:
    """Make a tree read-only (files and folders lose their write bits), so a hand edit has to
    undo this first. Symlinks are left alone."""
    for top, dirs, files in os.walk(path, topdown=False):
        for name in files:
            _drop_write(Path(top) / name)
        for name in dirs:
            _drop_write(Path(top) / name)
    _drop_write(path)


def _drop_write(p: Path) -> None:
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode) or not st.st_mode & 0o222:
        return  # a link, or read-only already (a shared tree's file: its inode is not ours)
    os.chmod(p, stat.S_IMODE(st.st_mode) & ~0o222)


def remove_tree(path: Path) -> None:
    """Delete a (frozen) generation or a half-built one (never across a mount in it)."""
    rmtree(path)


def remove_leftovers(paths: Paths) -> list[str]:
    """Half-built generations a killed apply left behind (call with the state lock held)."""
    removed = []
    if paths.generations.is_dir():
        for entry in sorted(paths.generations.iterdir()):
            if entry.name.startswith(".tmp-"):
                remove_tree(entry)
                removed.append(entry.name)
    for entry in sorted(paths.state.glob(".current.*")) if paths.state.is_dir() else []:
        entry.unlink(missing_ok=True)
    if removed:
        log.info("removed %d half-built generation(s): %s", len(removed), ", ".join(removed))
    return removed
