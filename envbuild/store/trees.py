"""Install trees: one distribution installed once, read-only, named by what it was installed from.

A tree is the files one wheel puts into a venv (``lib/python3.X/site-packages/…``, ``bin/…``,
its ``.dist-info`` as the installer wrote it), at the paths they have relative to the venv's
root, kept at ``trees/<key>/files/`` in the store beside a ``manifest.json`` that lists every
file with its sha256, size, mode and mtime. ``<key>`` is a derivation key of the wheel's sha256
and the install layout (:func:`tree_key`): Python version, relocatable venv rules, the
installer's version. Generations are assembled from trees by hard links
(:mod:`envbuild.apply.assemble`), so ten generations that share torch hold its files once.

A tree is made in the store's ``tmp/`` and renamed into ``trees/`` complete (manifest inside),
so ``trees/<key>`` either is whole or absent; files are 0444 or 0555 and folders 0555, so an
edit has to undo that first. :meth:`Trees.quick_check` compares each file's stat with the
manifest (an ordinary write changes size or mtime; making a file writable changes its mode);
:meth:`Trees.verify` hashes every file. Which trees stay through ``gc`` is what the store's roots
name (:attr:`envbuild.store.core.Root.trees`); a tree whose files are still hard-linked from
somewhere is never removed.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from envbuild.errors import StoreError
from envbuild.fsio import compact_json, fsync_dir, sha256_file
from envbuild.store.core import KEY_RE, Store, derivation_key

log = logging.getLogger(__name__)

KIND = "install-tree"
#: Bump when what a tree holds or how it is made changes: old trees are then not found.
TREE_FORMAT = 1
MANIFEST = "manifest.json"
FILES = "files"
#: A manifest bigger than this is not one envbuild wrote (torch's is a few MB).
MAX_MANIFEST = 256 << 20


class TreeFile(BaseModel):
    """One file of a tree as it was made."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str
    size: int
    mode: int = Field(description="permission bits: 0o444, or 0o555 for an executable")
    mtime_ns: int


class TreeManifest(BaseModel):
    """``trees/<key>/manifest.json``: what a tree is and every file in it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int = TREE_FORMAT
    key: str
    dist: str
    version: str
    wheel: str | None = Field(description="sha256 of the wheel it was installed from")
    layout: dict[str, Any]
    files: dict[str, TreeFile] = Field(description="path relative to the venv root -> file")
    as_published: list[str] = Field(
        default_factory=list,
        description="files whose bytes differ from their RECORD line as the wheel was published "
        "(the installer checked the wheel's own sha256, so these are the index's bytes)",
    )
    dirs: list[str] = Field(
        default_factory=list,
        description="folders it makes that hold none of its files (a wheel's empty folders, "
        "which the installer makes from the archive's own entries), relative to the venv root",
    )
    links: dict[str, str] = Field(
        default_factory=dict,
        description="symlinks it makes (path relative to the venv root -> target): an image "
        "layer's (bin/python -> the interpreter); a wheel's tree has none. A generation makes "
        "them and records them as its own files",
    )

    @field_validator("files", "dirs", "links")
    @classmethod
    def _inside(cls, files: Any) -> Any:
        for rel in files:
            parts = rel.split("/")
            if not rel or rel.startswith("/") or any(p in ("", ".", "..") for p in parts):
                raise ValueError(f"{rel!r} is not a path inside a venv")
        return files


def read_manifest(path: Path, key: str) -> TreeManifest | None:
    """The manifest of tree ``key`` at ``path`` (in the store, or a generation's copy); None
    when it is absent, too big, unreadable, of another format or another tree's."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_MANIFEST + 1)
    except OSError:
        return None
    if len(data) > MAX_MANIFEST:
        log.warning("%s: manifest over %d bytes; ignored", path, MAX_MANIFEST)
        return None
    try:
        manifest = TreeManifest.model_validate_json(data)
    except (ValidationError, ValueError):
        log.warning("%s: unreadable manifest; ignored", path)
        return None
    if manifest.key != key or manifest.format != TREE_FORMAT:
        return None
    return manifest


def tree_key(wheel: str | None, layout: Mapping[str, Any], candidates: Iterable[str] = ()) -> str:
    """The key of the tree that installing ``wheel`` (its sha256) with ``layout`` makes. When the
    wheel the installer chose is not known, the candidates it chose from name the tree."""
    inputs: dict[str, Any] = {"format": TREE_FORMAT, "layout": dict(layout), "wheel": wheel}
    if wheel is None:
        inputs["candidates"] = sorted(candidates)
    return derivation_key(KIND, inputs)


def _missing_dirs(base: Path, manifest: TreeManifest) -> list[str]:
    return [rel for rel in manifest.dirs if not stat.S_ISDIR(_lstat_mode(base / rel))]


def _lstat_mode(path: Path) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def _mode(st_mode: int) -> int:
    return 0o555 if st_mode & 0o111 else 0o444


@dataclass(frozen=True)
class TreeOf:
    """What a tree is the install of: a distribution at a version (``wheel``: the file it came
    from, None for an image layer) and the install facts it was made under."""

    dist: str
    version: str
    wheel: str | None
    layout: Mapping[str, Any]


class Trees:
    """The install trees of one store (``<store>/trees``)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.root = store.root / "trees"

    def path(self, key: str) -> Path:
        if not KEY_RE.match(key):
            raise ValueError(f"not a tree key: {key!r}")
        return self.root / key

    def files(self, key: str) -> Path:
        """The folder whose contents are laid over a venv's root."""
        return self.path(key) / FILES

    def all(self) -> list[str]:
        """Every complete tree here, sorted."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if KEY_RE.match(p.name))

    def has(self, key: str) -> bool:
        return (self.path(key) / MANIFEST).is_file()

    def manifest(self, key: str) -> TreeManifest | None:
        """The tree's manifest, or None when the tree is absent or its manifest unreadable."""
        return read_manifest(self.path(key) / MANIFEST, key)

    # -- checking ----------------------------------------------------------------------------

    def quick_check(self, manifest: TreeManifest) -> list[str]:
        """Paths whose stat is not what the manifest says (size, mtime, mode, a regular file):
        cheap, and catches every ordinary edit. A deliberate one that restores the mtime is
        :meth:`verify`'s to find."""
        base = self.files(manifest.key)
        bad = []
        for rel, entry in manifest.files.items():
            try:
                st = os.lstat(base / rel)
            except OSError:
                bad.append(rel)
                continue
            if (
                not stat.S_ISREG(st.st_mode)
                or st.st_size != entry.size
                or st.st_mtime_ns != entry.mtime_ns
                or stat.S_IMODE(st.st_mode) != entry.mode
            ):
                bad.append(rel)
        return sorted(bad + _missing_dirs(base, manifest))

    def verify(self, manifest: TreeManifest) -> list[str]:
        """Paths whose bytes or mode are not what the manifest says (every file hashed)."""
        base = self.files(manifest.key)
        bad = []
        for rel, entry in manifest.files.items():
            path = base / rel
            try:
                st = os.lstat(path)
                ok = (
                    stat.S_ISREG(st.st_mode)
                    and stat.S_IMODE(st.st_mode) == entry.mode
                    and st.st_size == entry.size
                    and sha256_file(path) == entry.sha256
                )
            except OSError:
                ok = False
            if not ok:
                bad.append(rel)
        return sorted(bad + _missing_dirs(base, manifest))

    def in_use(self, key: str) -> bool:
        """Whether any file of the tree is hard-linked from elsewhere (a generation)."""
        base = self.files(key)
        for top, _dirs, names in os.walk(base):
            for name in names:
                try:
                    if os.lstat(os.path.join(top, name)).st_nlink > 1:
                        return True
                except OSError:
                    continue
        return False

    # -- making and removing -----------------------------------------------------------------

    def create(
        self,
        key: str,
        of: TreeOf,
        *,
        sources: Mapping[str, str | Path],
        digests: Mapping[str, str],
        shared: Iterable[str] = (),
        as_published: Iterable[str] = (),
        dirs: Iterable[str] = (),
        links: Mapping[str, str] | None = None,
    ) -> TreeManifest:
        """Make tree ``key`` from ``sources`` (venv-relative path -> a staged file on the
        store's file system, whose sha256 ``digests`` gives: the caller hashed it to check it
        against its RECORD). Each is moved in, or hard-linked where its path is in ``shared``
        (another tree takes the same file). Call inside a store session. If another process made
        the tree first, its tree is kept and this one dropped."""
        dist, version = of.dist, of.version
        shared_paths = set(shared)
        self.root.mkdir(parents=True, exist_ok=True)
        # the store's scratch space: what a killed run leaves there, gc removes
        with self.store.temp_dir(f"tree-{key[:12]}-") as work:
            base = str(work / FILES)
            os.mkdir(base)
            made = {base}
            entries: dict[str, TreeFile] = {}
            for rel in sorted(sources):  # str paths: this runs once per file of torch & co.
                target = f"{base}/{rel}"
                parent = os.path.dirname(target)
                if parent not in made:
                    os.makedirs(parent, exist_ok=True)
                    while parent not in made:  # and every folder above it, up to files/
                        made.add(parent)
                        parent = os.path.dirname(parent)
                src = sources[rel]
                if rel in shared_paths:
                    os.link(src, target)
                else:
                    os.rename(src, target)
                st = os.lstat(target)
                if not stat.S_ISREG(st.st_mode):
                    raise StoreError(f"tree {dist} {version}: {rel} is not a regular file")
                mode = _mode(st.st_mode)
                if stat.S_IMODE(st.st_mode) != mode:
                    os.chmod(target, mode)  # the mtime stays
                entries[rel] = TreeFile.model_construct(  # the values are ours: no validation
                    sha256=digests[rel], size=st.st_size, mode=mode, mtime_ns=st.st_mtime_ns
                )
            folders = sorted(set(dirs))
            for rel in folders:  # the wheel's empty folders
                target = f"{base}/{rel}"
                os.makedirs(target, exist_ok=True)
                while target not in made:
                    made.add(target)
                    target = os.path.dirname(target)
            manifest = TreeManifest(
                key=key,
                dist=dist,
                version=version,
                wheel=of.wheel,
                layout=dict(of.layout),
                files=entries,
                as_published=sorted(as_published),
                dirs=folders,
                links=dict(sorted((links or {}).items())),
            )
            (work / MANIFEST).write_bytes(compact_json(manifest.model_dump(mode="json")))
            os.chmod(work / MANIFEST, 0o444)
            for folder in sorted(made, key=len, reverse=True):
                os.chmod(folder, 0o555)  # every folder made above, deepest first
            try:
                os.rename(work, self.path(key))
            except OSError as exc:
                if self.has(key):
                    log.debug("tree %s was made by another process", key[:12])
                    found = self.manifest(key)
                    if found is not None:
                        return found
                raise StoreError(f"cannot put tree {key[:12]} in place: {exc}") from exc
            fsync_dir(self.root)
            log.debug("tree %s: %s %s, %d files", key[:12], dist, version, len(entries))
            return manifest

    def remove(self, key: str) -> None:
        """Take the tree out of ``trees/`` (a rename first, so it vanishes at once), then
        delete it. Generations that hard-link its files keep their copies of the inodes."""
        path = self.path(key)
        if not path.exists():
            return
        # gc calls this under its lock: no session (it would wait for that lock)
        with self.store.temp_dir(f"gone-{key[:12]}-", session=False) as gone:
            os.rename(path, gone / key)
            fsync_dir(self.root)

    def size(self, key: str) -> int:
        manifest = self.manifest(key)
        return sum(f.size for f in manifest.files.values()) if manifest else 0


def copy_into(src: Path, dst: Path) -> str:
    """Put ``src`` at ``dst``: a hard link where the file system allows, else a reflink, else a
    copy. Returns which ("hardlink", "reflink", "copy")."""
    try:
        os.link(src, dst)
        return "hardlink"
    except OSError as exc:
        if exc.errno not in (18, 1, 31):  # EXDEV, EPERM, EMLINK
            raise
    try:
        import fcntl

        with open(src, "rb") as fin, open(dst, "wb") as fout:
            fcntl.ioctl(fout.fileno(), 0x40049409, fin.fileno())  # FICLONE
        shutil.copymode(src, dst)
        return "reflink"
    except OSError:
        dst.unlink(missing_ok=True)
    shutil.copy2(src, dst)
    return "copy"
