"""Generations that share install trees: their store root, their check, their repair.

A generation assembled from trees (:mod:`envbuild.apply.assemble`) holds hard links to the
store's tree files, and its own few files (``uv venv``'s, recorded in
``generation.json``'s ``venv_files``). :func:`check` looks at each linked file: the same inode
as the tree's means its bytes are the tree's, and each tree is hashed once however many
generations link it; a write through a hard link changes the tree, so it is reported with every
generation that links it. Another inode (an editor that writes a new file and renames it over,
``sed -i``) changes this generation only, and is hashed. :func:`repair` installs a damaged
tree again from its wheel and puts the tree's files back into every generation that links it.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from packaging.utils import canonicalize_name

from envbuild.apply import generations as gens
from envbuild.apply import venv as venvs
from envbuild.apply.assemble import Assembler
from envbuild.apply.generations import Generation
from envbuild.apply.listing import ancestors, folders, listing, shown
from envbuild.errors import EnvironmentFailure
from envbuild.fsio import sha256_file
from envbuild.snapshot.records import Mode
from envbuild.store.core import Store, default_store
from envbuild.store.trees import MANIFEST, TreeManifest, Trees, copy_into, read_manifest

log = logging.getLogger(__name__)


def root_name(final: Path) -> str:
    """The store root of the generation at ``final`` (unique per state dir)."""
    where = hashlib.sha256(str(final.parent.absolute()).encode()).hexdigest()[:12]
    return f"gen-{where}-{final.name}"


def _entries(venv: Path) -> dict[str, os.stat_result]:
    """Every file and symlink under ``venv`` (venv-relative), with its lstat."""
    root = str(venv)
    return {rel: os.lstat(f"{root}/{rel}") for rel in listing(venv)}


def freeze(folder: Path, venv_files: Iterable[str]) -> None:
    """Make a generation being built read-only: its own files and every folder. The venv's
    linked files are their trees' (read-only already, and not this generation's to chmod)."""
    for entry in folder.iterdir():
        if entry.name != "venv":
            gens.freeze(entry)
    for rel in venv_files:
        _read_only(str(folder / "venv" / rel))
    for top, dirs, _names in os.walk(folder / "venv", topdown=False):
        for name in dirs:
            _read_only(os.path.join(top, name))
    _read_only(str(folder / "venv"))
    _read_only(str(folder))


def _read_only(path: str) -> None:
    st = os.lstat(path)
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o222:
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o222)


def _owner(rel: str, folders: Mapping[str, str]) -> str | None:
    """The distribution whose files share the nearest folder with ``rel`` (site-packages and
    bin, which every distribution shares, name none)."""
    folder = os.path.dirname(rel)
    while folder and folder not in ("bin",) and not folder.endswith("site-packages"):
        if folder in folders:
            return folders[folder]
        folder = os.path.dirname(folder)
    return None


def _describe(path: Path, st: os.stat_result) -> str:
    if stat.S_ISLNK(st.st_mode):
        return f"link:{os.readlink(path)}"
    return f"sha256:{sha256_file(path)}"


TREES = "trees"


def manifest_copy(folder: Path, key: str) -> Path:
    """Where a generation (or one being built, ``folder``) keeps its copy of a tree's
    manifest: a hard link to the store's, so the generation describes itself when the store
    is gone or another one."""
    return folder / TREES / f"{key}.json"


def link_manifests(folder: Path, store: Store, tree_keys: Mapping[str, str]) -> list[str]:
    """Link each tree's manifest into ``folder/trees/``; returns their paths relative to it."""
    trees = Trees(store)
    out = []
    (folder / TREES).mkdir(exist_ok=True)
    for key in sorted(set(tree_keys.values())):
        copy_into(trees.path(key) / MANIFEST, manifest_copy(folder, key))
        out.append(f"{TREES}/{key}.json")
    return out


def expected(
    folder: Path, tree_keys: Mapping[str, str], winners: Mapping[str, str] | None = None
) -> tuple[dict[str, tuple[str, TreeManifest]], list[str]]:
    """venv-relative path -> (dist, manifest) the file comes from, from the manifests in
    ``folder/trees/`` (``winners``: whose file a path two distributions install is); and the
    distributions whose manifest is gone or unreadable."""
    out: dict[str, tuple[str, TreeManifest]] = {}
    by_dist: dict[str, TreeManifest] = {}
    gone = []
    for dist, key in sorted(tree_keys.items()):
        manifest = read_manifest(manifest_copy(folder, key), key)
        if manifest is None:
            gone.append(dist)
            continue
        by_dist[dist] = manifest
        for rel in manifest.files:
            out.setdefault(rel, (dist, manifest))
    for rel, dist in (winners or {}).items():
        if dist in by_dist and rel in by_dist[dist].files:
            out[rel] = (dist, by_dist[dist])
    return out, gone


def own_files(venv: Path, own: Iterable[str]) -> dict[str, str]:
    """The venv's own files (``own``: what :class:`~envbuild.apply.assemble.Assembled` says
    no tree gave it), as ``generation.json`` records them. Anything else found there later is
    reported as added."""
    return {rel: _describe(venv / rel, os.lstat(venv / rel)) for rel in sorted(own)}


def _content(manifest: TreeManifest) -> dict[str, tuple[str, int, int]]:
    return {rel: (f.sha256, f.size, f.mode) for rel, f in manifest.files.items()}


def tree_digests(gen: Generation, store: Store | None = None) -> dict[str, str]:
    """Absolute path -> sha256 of each venv file that is still the inode of its tree's file (so
    its bytes are the ones the manifest hashed when the tree was made)."""
    trees = Trees(store or default_store())
    want, _gone = expected(gen.path, gen.meta.trees, gen.meta.overlaps)
    out = {}
    for rel, (_dist, manifest) in want.items():
        path = gen.venv / rel
        try:
            a, b = os.lstat(path), os.lstat(trees.files(manifest.key) / rel)
        except OSError:
            continue
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
            out[str(path)] = manifest.files[rel].sha256
    return out


def linked_by(all_gens: Sequence[Generation]) -> dict[str, list[int]]:
    """Tree key -> the numbers of the generations that link it."""
    out: dict[str, list[int]] = {}
    for gen in all_gens:
        for key in gen.meta.trees.values():
            out.setdefault(key, []).append(gen.number)
    return out


def check(
    gen: Generation,
    store: Store,
    mode: Mode = "full",
    *,
    memo: dict[str, list[str] | None] | None = None,
    links: Mapping[str, list[int]] | None = None,
) -> list[str]:
    """What changed in a shared generation's venv since it was made. ``memo`` (tree key ->
    its bad paths) lets a caller check each tree once over many generations; ``links`` names
    the generations each tree reaches."""
    trees = Trees(store)
    memo = {} if memo is None else memo
    want, gone = expected(gen.path, gen.meta.trees, gen.meta.overlaps)
    problems = [
        f"venv: {dist}: the manifest of its install tree {gen.meta.trees[dist][:12]} is gone"
        for dist in gone
    ]
    have = _entries(gen.venv)
    folders_of = {os.path.dirname(rel): dist for rel, (dist, _m) in want.items()}
    for rel, st in sorted(have.items()):
        if rel in gen.meta.venv_files:
            if _describe(gen.venv / rel, st) != gen.meta.venv_files[rel]:
                problems.append(f"venv: {rel} was modified")
        elif rel not in want:  # bytecode too: nothing writes any into a generation
            owner = _owner(rel, folders_of)
            problems.append(f"venv: {owner + ': ' if owner else ''}{shown(rel)} was added")
    # and every folder: one no file of the manifest is in, nor a tree's own empty folder
    made = ancestors([*want, *gen.meta.venv_files])
    empty = {d for _dist, m in want.values() for d in m.dirs}
    made |= empty | ancestors(empty)
    for rel in sorted(set(folders(gen.venv)) - made):
        if os.path.dirname(rel) in made or not os.path.dirname(rel):  # its top added folder
            owner = _owner(rel, folders_of)
            problems.append(f"venv: {owner + ': ' if owner else ''}{shown(rel)}/ was added")
    for rel in sorted(set(gen.meta.venv_files) - set(have)):
        problems.append(f"venv: {rel} is missing")
    for rel, (dist, manifest) in sorted(want.items()):
        found = have.get(rel)
        if found is None:
            problems.append(f"venv: {dist}: {shown(rel)} is missing")
            continue
        key = manifest.key
        entry = manifest.files[rel]
        try:
            tree_st = os.lstat(trees.files(key) / rel)
            same = (tree_st.st_dev, tree_st.st_ino) == (found.st_dev, found.st_ino)
        except OSError:
            same = False  # the tree is gone from this store: the file is hashed on its own
        if same and key not in memo:
            in_store = trees.manifest(key)
            if in_store is None or _content(in_store) != _content(manifest):
                memo[key] = None  # not the tree this generation was made from
            else:
                memo[key] = (
                    trees.verify(in_store) if mode == "full" else trees.quick_check(in_store)
                )
        if same and memo[key] is None:
            same = False  # its files are hashed on their own
        if same:
            if rel in (memo[key] or ()):
                numbers = ", ".join(str(n) for n in sorted((links or {}).get(key, [gen.number])))
                problems.append(
                    f"venv: {dist}: {shown(rel)} was modified in its shared install tree "
                    f"{key[:12]} "
                    f"(a write through a hard link: generations {numbers} link it)"
                )
            continue
        # not the tree's inode (a copy, a replaced file, a tree gone): its own bytes are hashed
        ok = (
            stat.S_ISREG(found.st_mode)
            and stat.S_IMODE(found.st_mode) == entry.mode
            and found.st_size == entry.size
            and sha256_file(gen.venv / rel) == entry.sha256
        )
        if not ok:
            problems.append(
                f"venv: {dist}: {shown(rel)} was modified (in generation {gen.number} only)"
            )
    return problems


def repair(gen: Generation, store: Store, all_gens: Sequence[Generation], python: str) -> list[str]:
    """Install every damaged or missing tree of ``gen`` again from its wheel, and put each
    tree file back into ``gen`` and every other generation that links it. Returns what was
    done, one line each."""
    trees = Trees(store)
    done: list[str] = []
    with store.session():
        rebuild = []
        for dist, key in sorted(gen.meta.trees.items()):
            manifest = trees.manifest(key)
            if manifest is None or trees.verify(manifest):
                rebuild.append(dist)
        if rebuild:
            data = tomllib.loads((gen.path / venvs.INSTALL_LOCK).read_text())
            packages = [
                p for p in data.get("packages") or [] if canonicalize_name(p["name"]) in rebuild
            ]
            with store.temp_dir("repair-") as work:
                lock = work / venvs.INSTALL_LOCK
                shutil.copyfile(gen.path / venvs.INSTALL_LOCK, lock)
                if (gen.path / venvs.WHEELS).is_dir():
                    os.symlink(gen.path / venvs.WHEELS, work / venvs.WHEELS)
                for key in {gen.meta.trees[d] for d in rebuild}:
                    trees.remove(key)
                made = Assembler(store, python).reinstall(lock, packages)
            for manifest in made:
                if gen.meta.trees.get(manifest.dist) != manifest.key:
                    raise EnvironmentFailure(
                        f"{manifest.dist}: installed again, it is not the tree the generation "
                        f"links ({manifest.key[:12]}, not {gen.meta.trees.get(manifest.dist)})"
                    )
                done.append(f"install tree {manifest.key[:12]} ({manifest.dist}): installed "
                            "again from its wheel")  # fmt: skip
        keys = set(gen.meta.trees.values())
        for other in all_gens:
            if other.number == gen.number or keys & set(other.meta.trees.values()):
                fixed = _relink(other, trees)
                if fixed:
                    done.append(f"generation {other.number}: {fixed} file(s) linked again")
    return done


def _relink(gen: Generation, trees: Trees) -> int:
    """Replace each venv file that is not its tree's inode by a link to the tree's file."""
    want, _gone = expected(gen.path, gen.meta.trees, gen.meta.overlaps)
    fixed = 0
    for rel, (_dist, manifest) in sorted(want.items()):
        source = trees.files(manifest.key) / rel
        target = gen.venv / rel
        try:
            a, b = os.lstat(source), os.lstat(target)
            if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
                continue
        except FileNotFoundError:
            pass
        parent = target.parent
        parent.mkdir(parents=True, exist_ok=True)
        mode = stat.S_IMODE(os.lstat(parent).st_mode)
        os.chmod(parent, mode | 0o700)
        try:
            tmp = parent / f".repair-{os.getpid()}-{target.name}"
            tmp.unlink(missing_ok=True)
            copy_into(source, tmp)
            os.replace(tmp, target)
        finally:
            os.chmod(parent, mode)
        fixed += 1
    if fixed:
        gens.freeze(gen.venv)
    return fixed
