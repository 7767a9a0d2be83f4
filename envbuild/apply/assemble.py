"""A generation's venv assembled from install trees: each locked distribution installed once.

The venv itself is made by ``uv venv --relocatable`` as always. For each package of the
install lock, an ``install-choice`` derivation records which of its wheels uv installs for
this interpreter (the package's wheels, the interpreter's version and sha256, the C library,
the installer) and the key of the tree that install made (:mod:`envbuild.store.trees`). A
package whose choice and tree are known, and whose tree's files still have the stat the
manifest recorded, is hard-linked in (a reflink or a copy across file systems). The others are
installed by uv into a staging venv in the store (one ``uv pip sync`` of just them; the losers
of the spec's ``[image.overlaps]`` in a second one beside it, so that no file of theirs is
overwritten), hard-linked from a uv cache of their own that is removed after, moved into new
trees, and linked in the same way.

Last, uv itself checks the assembled venv against the whole install lock (``uv pip sync
--strict --dry-run``): it must say it would change nothing. So the venv is what a plain
``uv pip sync`` of the lock makes, file for file (``tests/apply/test_shared.py`` compares them).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w
from packaging.tags import Tag
from packaging.utils import canonicalize_name

from envbuild.apply import venv as venvs
from envbuild.apply.listing import ancestors, folders, listing, shown
from envbuild.errors import EnvironmentFailure, UserError
from envbuild.fsio import record_digest, sha256_file
from envbuild.installed import hashing
from envbuild.proc import core as proc
from envbuild.snapshot import records
from envbuild.snapshot.distinfo import chosen_wheel, read_dist, wheel_tags
from envbuild.store.core import Store, derivation_key
from envbuild.store.trees import TreeManifest, TreeOf, Trees, copy_into, tree_key

log = logging.getLogger(__name__)

CHOICE = "install-choice"
#: What uv pip sync leaves in the venv it installs into (its lock file): the venv's own.
UV_LOCK = ".lock"


@dataclass
class Assembled:
    """What went into a venv: each distribution's tree, the choice records that found them,
    how files were put in place, and which trees this run made."""

    trees: dict[str, str] = field(default_factory=dict)  # dist -> tree key
    choices: list[str] = field(default_factory=list)  # install-choice derivation keys
    link_mode: str = "hardlink"
    made: list[str] = field(default_factory=list)  # dists whose tree was made now
    files: int = 0
    #: '<dist>/<path as RECORD names it>' -> sha256, of files installed as published, not
    #: as their RECORD says (see :attr:`TreeManifest.as_published`)
    as_published: dict[str, str] = field(default_factory=dict)
    #: venv-relative path -> the distribution whose file it is, where two install it with
    #: other bytes (settled by the spec's ``[image.overlaps]``)
    winners: dict[str, str] = field(default_factory=dict)
    #: the venv's own files: what ``uv venv`` made, and uv's lock file
    own: list[str] = field(default_factory=list)


def install_recipe(python: str, installer: str) -> dict[str, Any]:
    """What, besides the wheel, decides an installed tree's bytes."""
    # "folders": trees record the empty folders a wheel ships (trees made before did not, so
    # they have other keys and are made again rather than linked without those folders)
    return {
        "python": python,
        "installer": installer,
        "venv": "uv venv --relocatable",
        "folders": "recorded",
    }


def interpreter_id(venv: Path) -> dict[str, str]:
    real = (venv / "bin" / "python").resolve()
    libc = os.confstr("CS_GNU_LIBC_VERSION") if "CS_GNU_LIBC_VERSION" in os.confstr_names else ""
    return {"sha256": sha256_file(real), "libc": libc or ""}


def _wheels(pkg: Mapping[str, Any]) -> list[tuple[str, str]]:
    out = []
    for wheel in pkg.get("wheels") or []:
        name = wheel.get("name") or Path(str(wheel.get("path") or wheel.get("url", ""))).name
        out.append((str(name), str((wheel.get("hashes") or {}).get("sha256", ""))))
    return sorted(out)


def choice_key(pkg: Mapping[str, Any], python: str, interp: Mapping[str, str], lay: Any) -> str:
    """The key of the record of which wheel of ``pkg`` uv installs here."""
    return derivation_key(CHOICE, _choice_inputs(pkg, python, interp, lay))


class Assembler:
    """Assembles venvs for one store, Python (MAJOR.MINOR) and install lock folder."""

    def __init__(self, store: Store, python: str) -> None:
        self.store = store
        self.trees = Trees(store)
        self.python = python
        self.recipe = install_recipe(python, proc.uv_version())

    def assemble(
        self, venv: Path, install_lock: Path, overlaps: Mapping[str, str] | None = None
    ) -> Assembled:
        """Create ``venv`` and fill it from trees, making the trees it lacks. Call inside a
        store session (``gc`` must not take a tree before the generation's root names it)."""
        venvs.create_venv(venv, self.python)
        interp = interpreter_id(venv)
        own = listing(venv)
        data = tomllib.loads(install_lock.read_text())
        packages = data.get("packages") or []
        out = Assembled()
        known: dict[str, TreeManifest] = {}
        todo = []
        for pkg in packages:
            key = choice_key(pkg, self.python, interp, self.recipe)
            drv = self.store.lookup(key)
            manifest = self._usable(drv.meta.get("tree")) if drv is not None else None
            if drv is None or manifest is None:
                todo.append((pkg, key))
                continue
            known[manifest.dist] = manifest
            out.choices.append(key)
        if todo:
            log.info("installing %d of %d distributions into the store", len(todo), len(packages))
            # the losers of the spec's overlap rules get a staging venv of their own, or the
            # winner's file would overwrite theirs (or theirs the winner's) in a shared one
            losers = {canonicalize_name(k) for k in (overlaps or {})}
            first = [p for p, _k in todo if canonicalize_name(str(p["name"])) not in losers]
            second = [p for p, _k in todo if canonicalize_name(str(p["name"])) in losers]
            for manifest, key in self._stage(data, [first, second], install_lock):
                known[manifest.dist] = manifest
                out.choices.append(key)
                out.made.append(manifest.dist)
        out.trees = {dist: m.key for dist, m in sorted(known.items())}
        out.as_published = {
            f"{m.dist}/{shown(rel)}": m.files[rel].sha256
            for m in known.values()
            for rel in m.as_published
        }
        out.link_mode, out.files, out.winners = self._link(
            venv, [known[d] for d in sorted(known)], overlaps or {}
        )
        said = venvs.sync(venv, install_lock, dry_run=True)
        if "Would make no changes" not in said:
            raise EnvironmentFailure(
                "uv does not agree that the assembled venv is the lock: " + said.strip()[-400:],
                hint="report this: a shared generation must be what uv installs",
            )
        out.own = sorted([*own, *([UV_LOCK] if os.path.lexists(venv / UV_LOCK) else [])])
        return out

    def _usable(self, key: object) -> TreeManifest | None:
        if not isinstance(key, str):
            return None
        try:
            manifest = self.trees.manifest(key)
        except ValueError:
            return None
        if manifest is None:
            return None
        if bad := self.trees.quick_check(manifest):
            log.warning(
                "install tree %s (%s %s) was changed (%s%s): it is installed again",
                key[:12], manifest.dist, manifest.version, bad[0],
                f" and {len(bad) - 1} more" if len(bad) > 1 else "",
            )  # fmt: skip
            self.trees.remove(key)
            return None
        return manifest

    def _stage(
        self,
        data: Mapping[str, Any],
        groups: Sequence[Sequence[Mapping[str, Any]]],
        install_lock: Path,
    ) -> list[tuple[TreeManifest, str]]:
        """Install each group of packages with uv into a staging venv of its own (the groups
        at once), and move each distribution into its tree. A distribution whose file another
        one of its group overwrote is installed again on its own."""
        groups = [list(g) for g in groups if g]
        by_name: dict[str, Mapping[str, Any]] = {
            canonicalize_name(str(p["name"])): p for g in groups for p in g
        }
        made: list[tuple[TreeManifest, str]] = []
        alone: list[str] = []
        with contextlib.ExitStack() as stack:
            venvs_ = [stack.enter_context(self.store.temp_dir("stage-")) / "venv" for _ in groups]
            # uv's own cache for these syncs only, gone with the staging venvs: its files are
            # hard-linked into them and moved into trees, so nothing is copied twice and no
            # tree shares an inode with a cache other uv runs link from
            cache = stack.enter_context(self.store.temp_dir("uv-cache-"))
            for venv in venvs_:
                venvs.create_venv(venv, self.python)
            interp = interpreter_id(venvs_[0])
            skeleton = set(listing(venvs_[0])) | set(folders(venvs_[0]))
            locks = []
            for n, group in enumerate(groups):
                partial = install_lock.parent / f"pylock.stage{n}.toml"
                doc = {k: v for k, v in data.items() if k != "packages"}
                doc["packages"] = group
                partial.write_text(tomli_w.dumps(doc))
                locks.append(partial)
            try:
                with ThreadPoolExecutor(len(groups)) as pool:  # uv downloads and copies
                    for done in [
                        pool.submit(venvs.sync, v, lock, strict=False, private_cache=cache)
                        for v, lock in zip(venvs_, locks, strict=True)
                    ]:
                        done.result()
            finally:
                for partial in locks:
                    partial.unlink(missing_ok=True)
            for venv in venvs_:
                made += self._trees_of(venv, by_name, skeleton, interp, alone)
        if alone:
            for dist in alone:
                log.info("%s shares files with another distribution: installed on its own", dist)
            made += self._stage(data, [[by_name[d]] for d in alone], install_lock)
        return made

    def _trees_of(
        self,
        venv: Path,
        by_name: Mapping[str, Mapping[str, Any]],
        skeleton: set[str],
        interp: Mapping[str, str],
        alone: list[str],
    ) -> list[tuple[TreeManifest, str]]:
        """Move what uv installed into ``venv`` into trees; add to ``alone`` each distribution
        whose bytes another one overwrote."""
        staged = _staged(venv)
        claims: dict[str, list[str]] = {}
        for dist, (_version, files, _tags) in staged.items():
            for rel in files:
                claims.setdefault(rel, []).append(dist)
        lost: list[str] = []
        for rel, owners in claims.items():
            if len(owners) < 2:
                continue
            digest = record_digest(bytes.fromhex(sha256_file(venv / rel)))
            for owner in owners:
                want = staged[owner][1][rel]
                if want is not None and want != digest and owner not in lost:
                    lost.append(owner)  # its own bytes were overwritten: install it alone
        left = set(listing(venv)) - skeleton - set(claims) - {UV_LOCK}
        if left:
            raise EnvironmentFailure(
                f"uv installed files no RECORD lists: {', '.join(sorted(left)[:5])}"
            )
        empty = _empty_folders(venv, skeleton, claims)
        shared = {rel for rel, owners in claims.items() if len(owners) > 1}
        hashed = _hash_all(venv, claims)
        made = []
        for dist in sorted(staged):
            if dist in lost:
                continue
            version, files, tags = staged[dist]
            pkg = by_name.get(dist)
            if pkg is None:
                raise EnvironmentFailure(f"uv installed {dist}, which the lock does not name")
            made.append(
                self._tree(
                    pkg, dist, version, files, tags, venv, shared, interp, hashed,
                    empty.get(dist, []),
                )
            )  # fmt: skip
        alone += lost
        return made

    def reinstall(
        self, install_lock: Path, packages: Sequence[Mapping[str, Any]]
    ) -> list[TreeManifest]:
        """Install ``packages`` of ``install_lock`` (a file in a writable folder, beside the
        ``wheels/`` its path entries name) into new trees: what a repair does."""
        data = tomllib.loads(install_lock.read_text())
        return [m for m, _key in self._stage(data, [packages], install_lock)]

    def _tree(  # noqa: PLR0913
        self,
        pkg: Mapping[str, Any],
        dist: str,
        version: str,
        files: Mapping[str, str | None],
        tags: frozenset[Tag] | None,
        venv: Path,
        shared: set[str],
        interp: Mapping[str, str],
        hashed: Mapping[str, str],
        dirs: Sequence[str] = (),
    ) -> tuple[TreeManifest, str]:
        candidates = _wheels(pkg)
        wheel = chosen_wheel(candidates, tags)
        key = tree_key(wheel, self.recipe, [sha for _n, sha in candidates])
        digests = {rel: hashed[rel] for rel in files}
        as_published = [
            rel
            for rel, want in files.items()
            if want is not None and record_digest(bytes.fromhex(digests[rel])) != want
        ]
        if as_published:
            log.warning(
                "%s %s: %d file(s) differ from the wheel's own RECORD as published (%s); "
                "recorded as installed",
                dist, version, len(as_published), as_published[0],
            )  # fmt: skip
        if self.trees.has(key):
            self.trees.remove(key)  # its choice record was lost or it failed its check
        manifest = self.trees.create(
            key,
            TreeOf(dist, version, wheel, self.recipe),
            sources={rel: f"{venv}/{rel}" for rel in files},
            digests=digests,
            shared=shared & set(files),
            as_published=as_published,
            dirs=dirs,
        )
        inputs = _choice_inputs(pkg, self.python, interp, self.recipe)
        drv = self.store.record(CHOICE, inputs, {}, {"tree": key, "wheel": wheel})
        return manifest, drv.key

    def _link(
        self, venv: Path, manifests: Sequence[TreeManifest], overlaps: Mapping[str, str]
    ) -> tuple[str, int, dict[str, str]]:
        """Put every tree's files into ``venv``. Two trees with one path must agree on its
        bytes, or the spec's ``[image.overlaps]`` (loser = winner) says whose file it is, as
        for an image: install order never decides. Returns how files were put in place, how
        many, and the winner of each path with two versions."""
        placed: dict[str, TreeManifest] = {}
        winners: dict[str, str] = {}
        modes: set[str] = set()
        made_dirs: set[str] = set()
        root = str(venv)
        for manifest in manifests:  # str paths: this runs once per file of the venv
            base = str(self.trees.files(manifest.key))
            for rel in manifest.dirs:  # the wheel's empty folders, as uv makes them
                os.makedirs(f"{root}/{rel}", mode=0o755, exist_ok=True)
            for rel, entry in sorted(manifest.files.items()):
                target = f"{root}/{rel}"
                if rel in placed:
                    other = placed[rel]
                    if other.files[rel].sha256 == entry.sha256:
                        continue
                    winner = _winner(other.dist, manifest.dist, rel, overlaps)
                    winners[rel] = winner
                    if winner == other.dist:
                        continue
                    os.unlink(target)
                parent = os.path.dirname(target)
                if parent not in made_dirs:
                    os.makedirs(parent, mode=0o755, exist_ok=True)
                    made_dirs.add(parent)
                try:
                    os.link(f"{base}/{rel}", target)
                    modes.add("hardlink")
                except FileExistsError:
                    raise EnvironmentFailure(
                        f"{rel} of {manifest.dist} is a file of the venv"
                    ) from None
                except OSError:
                    modes.add(copy_into(Path(base, rel), Path(target)))
                placed[rel] = manifest
        mode = "copy" if "copy" in modes else "reflink" if "reflink" in modes else "hardlink"
        return mode, len(placed), winners


def _winner(a: str, b: str, rel: str, overlaps: Mapping[str, str]) -> str:
    rules: dict[str, str] = {
        canonicalize_name(k): canonicalize_name(v) for k, v in overlaps.items()
    }
    if rules.get(a) == b:
        return b
    if rules.get(b) == a:
        return a
    raise UserError(
        f"{a} and {b} both install {shown(rel)} with different bytes, and the spec does not say "
        "which one wins",
        hint=f'add `"{a}" = "{b}"` (loser = winner) or the reverse to [image.overlaps]',
    )


def _choice_inputs(pkg: Mapping[str, Any], python: str, interp: Any, lay: Any) -> dict[str, Any]:
    return {
        "package": canonicalize_name(str(pkg["name"])),
        "version": str(pkg.get("version", "")),
        "wheels": [list(w) for w in _wheels(pkg)],
        "interpreter": dict(interp),
        "python": python,
        "layout": lay,
    }


def _hash_all(venv: Path, rels: Iterable[str]) -> dict[str, str]:
    """The sha256 (hex) of each staged file, hashed on every core."""
    names = list(rels)
    root = str(venv)
    try:
        items = [(f"{root}/{rel}", os.lstat(f"{root}/{rel}").st_size) for rel in names]
    except OSError as exc:
        raise EnvironmentFailure(f"a file a RECORD names was not installed: {exc}") from exc
    found = hashing.hash_files(items)
    out = {}
    for rel, (path, _size) in zip(names, items, strict=True):
        got = found[path]
        if got.digest is None:
            raise EnvironmentFailure(f"{rel}: cannot be read after install ({got.error})")
        out[rel] = got.digest.hex()
    return out


def _empty_folders(
    venv: Path, skeleton: set[str], claims: Mapping[str, Sequence[str]]
) -> dict[str, list[str]]:
    """dist -> the folders uv made in ``venv`` that hold no file of any RECORD (a wheel's
    empty folders), each given to the one distribution whose files share its nearest folder."""
    holding = ancestors(claims)
    owners: dict[str, set[str]] = {}
    for rel, dists in claims.items():
        for folder in ancestors([rel]):
            owners.setdefault(folder, set()).update(dists)
    out: dict[str, list[str]] = {}
    for rel in sorted(set(folders(venv)) - skeleton - holding):
        folder = os.path.dirname(rel)
        while folder and folder not in owners:
            folder = os.path.dirname(folder)
        whose = owners.get(folder, set())
        if folder in skeleton or len(whose) != 1:
            raise EnvironmentFailure(
                f"uv made the empty folder {shown(rel)}, and no one distribution's files are "
                "beside it to say whose it is"
            )
        out.setdefault(next(iter(whose)), []).append(rel)
    return out


def _staged(venv: Path) -> dict[str, tuple[str, dict[str, str | None], frozenset[Tag] | None]]:
    """Each distribution uv installed: version, its files (venv-relative -> RECORD hash), and
    its WHEEL file's tags."""
    out: dict[str, tuple[str, dict[str, str | None], frozenset[Tag] | None]] = {}
    for site in sorted((venv / "lib").glob("python*/site-packages")):
        for entry in sorted(os.listdir(site)):
            if not entry.endswith(".dist-info"):
                continue
            dist = read_dist(str(site), entry)
            if dist.record is None:
                raise EnvironmentFailure(f"{entry}: uv installed it without a RECORD")
            files: dict[str, str | None] = {}
            # every line, bytecode a wheel ships included (a RECORD check skips those)
            prefix = str(site.relative_to(venv))
            for row in records.rows(dist.record):
                named, hashed = row[0], row[1] if len(row) > 1 else ""
                rel = os.path.normpath(f"{prefix}/{named}")
                if rel.startswith("..") or os.path.isabs(rel):
                    raise EnvironmentFailure(f"{entry}: RECORD names {named}, outside the venv")
                digest = hashed[7:].rstrip("=") if hashed.startswith("sha256=") else ""
                files[rel] = digest or None
            out[canonicalize_name(dist.name)] = (dist.version, files, wheel_tags(site / entry))
    return out
