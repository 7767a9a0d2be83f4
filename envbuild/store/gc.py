"""Garbage collection: remove every blob and derivation record of a store that no root keeps.

Input: the store's roots (``roots/<name>.json``, :class:`~envbuild.store.core.Root`) and its
derivation records; output: a :class:`GcResult` saying what went (or, with ``dry_run``, would
go). A root of an output folder lives only while that folder holds the image it was made for
(:func:`output_holds`), the way a Nix out-link does. ``collect`` takes the store's gc lock
exclusively, so it waits until every running build's session has ended.

What is live is what the records state, never what a blob holds: a root names each blob it
needs (an image's manifest, its config and every layer) and the derivations it keeps; a live
derivation keeps its outputs and the derivations it references (:func:`live`). A blob that
happens to contain a digest keeps nothing. A store written before records had references gcs
the same: its records reference nothing, and every root envbuild wrote names its image's config
and layers beside the manifest.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envbuild.fsio import rmtree
from envbuild.scratch import CHROOT
from envbuild.store.blobs import digest_hex
from envbuild.store.core import Derivation, Root, Store
from envbuild.store.trees import Trees

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GcResult:
    """What one gc removed (or would remove) and what it kept."""

    dry_run: bool
    removed_blobs: list[str]
    removed_derivations: list[str]
    removed_temp: int
    freed_bytes: int
    removed_roots: list[str]
    kept_blobs: int
    kept_derivations: int
    roots: int
    removed_trees: list[str] = field(default_factory=list)
    #: Trees no root names whose files are still hard-linked from somewhere: kept.
    linked_trees: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The result as JSON data (`envbuild gc --json`)."""
        return {
            "dry_run": self.dry_run,
            "removed_blobs": self.removed_blobs,
            "removed_derivations": self.removed_derivations,
            "removed_temp": self.removed_temp,
            "removed_roots": self.removed_roots,
            "freed_bytes": self.freed_bytes,
            "kept_blobs": self.kept_blobs,
            "kept_derivations": self.kept_derivations,
            "roots": self.roots,
            "removed_trees": self.removed_trees,
            "linked_trees": self.linked_trees,
        }


def collect(store: Store, *, dry_run: bool = False) -> GcResult:
    """Remove every blob and derivation no root keeps alive, and leftover temp files.

    Live: the blobs and derivations a root names; the outputs and the references of a live
    derivation; and every derivation whose outputs are all live (cheap records that stay
    valid). References are only what roots and records state: no blob is read to find more.
    Waits until no build holds a session.
    """
    with store.gc_guard():
        roots = store.roots()
        stale_roots = sorted(n for n, r in roots.items() if not output_holds(r))
        for name in stale_roots:
            gone = roots[name]
            if gone.generation is not None:
                log.info("root %s: generation %s is gone", name, gone.generation)
            else:
                log.info("root %s: %s no longer holds %s", name, gone.output, gone.image)
            del roots[name]
        records: dict[str, Derivation] = {}
        for key in store.derivations():
            try:
                records[key] = Derivation.model_validate_json(
                    (store.drvs / f"{key}.json").read_bytes()
                )
            except (ValidationError, ValueError):
                log.warning("derivation record %s is unreadable; removing it", key)
        live_blobs, live_drvs = live(roots.values(), records)
        dead_drvs = sorted(set(store.derivations()) - live_drvs)
        dead_blobs: list[str] = []
        freed = 0
        all_blobs = sorted(store.blobs.iterdir())
        for path in all_blobs:
            digest = f"sha256:{path.name}"
            if digest not in live_blobs:
                dead_blobs.append(digest)
                freed += path.lstat().st_size
        temps = sorted(store.tmp.iterdir())
        stale_locks = [p for p in store.guards.iterdir() if p.name != "gc.lock"]
        kept_hex = {p.name for p in all_blobs} - {digest_hex(d) for d in dead_blobs}
        stale_stamps = store.stale_stamps(kept_hex)
        trees = Trees(store)
        dead_trees, linked_trees, tree_bytes = _dead_trees(trees, roots.values())
        freed += tree_bytes
        if not dry_run:
            for key in dead_trees:
                trees.remove(key)
            for name in stale_roots:
                (store.roots_dir / f"{name}.json").unlink(missing_ok=True)
            for key in dead_drvs:
                (store.drvs / f"{key}.json").unlink(missing_ok=True)
            for digest in dead_blobs:
                store.blob_path(digest).unlink(missing_ok=True)
            for path in stale_stamps:
                path.unlink(missing_ok=True)
            for path in temps:  # a chroot's folder: what a killed mmdebstrap left mounted
                rmtree(path, unmount=path.name.startswith(CHROOT))
            for path in stale_locks:
                path.unlink(missing_ok=True)
    return GcResult(
        dry_run=dry_run,
        removed_blobs=dead_blobs,
        removed_derivations=dead_drvs,
        removed_temp=len(temps),
        removed_roots=stale_roots,
        freed_bytes=freed,
        kept_blobs=len(all_blobs) - len(dead_blobs),
        kept_derivations=len(live_drvs),
        roots=len(roots),
        removed_trees=dead_trees,
        linked_trees=linked_trees,
    )


def collect_trees(store: Store, *, dry_run: bool = False) -> tuple[list[str], list[str], int]:
    """Remove only the install trees no root keeps (what ``generations --gc`` does after it
    removed generations): returns the trees removed, those kept because a file of theirs is
    still hard-linked from somewhere, and the bytes freed."""
    with store.gc_guard():
        roots = [r for r in store.roots().values() if output_holds(r)]
        trees = Trees(store)
        dead, linked, freed = _dead_trees(trees, roots)
        if not dry_run:
            for key in dead:
                trees.remove(key)
    return dead, linked, freed


def _dead_trees(trees: Trees, roots: Iterable[Root]) -> tuple[list[str], list[str], int]:
    live_trees = {key for root in roots for key in root.trees}
    dead, linked, freed = [], [], 0
    for key in trees.all():
        if key in live_trees:
            continue
        if trees.in_use(key):
            log.warning("tree %s: no root names it, but its files are linked: kept", key[:12])
            linked.append(key)
            continue
        dead.append(key)
        freed += trees.size(key)
    return dead, linked, freed


def live(roots: Iterable[Root], records: Mapping[str, Derivation]) -> tuple[set[str], set[str]]:
    """The blob digests and derivation keys that ``roots`` keep alive, given every readable
    derivation record by key. A reference to a record that is not here keeps nothing."""
    blobs: set[str] = set()
    drvs: set[str] = set()
    todo: list[str] = []
    for root in roots:
        blobs.update(root.blobs)
        todo.extend(root.derivations)

    def drain() -> None:
        while todo:
            key = todo.pop()
            if key in drvs or key not in records:
                continue
            drvs.add(key)
            blobs.update(records[key].outputs.values())
            todo.extend(records[key].references)

    drain()
    # a record whose outputs are all kept stays too (it costs nothing and saves a rebuild), and
    # so does what it references; that can make more records' outputs live, hence the loop
    while more := [
        key
        for key, drv in records.items()
        if key not in drvs and drv.outputs and set(drv.outputs.values()) <= blobs
    ]:
        todo.extend(more)
        drain()
    return blobs, drvs


def output_holds(root: Root) -> bool:
    """Whether the output folder of ``root`` still holds the image it was made for (a root
    that names no folder always lives). A generation's root lives while its folder is a
    complete generation."""
    if root.generation is not None:
        return (Path(root.generation) / "generation.json").is_file()
    if root.output is None:
        return True
    try:
        with (Path(root.output) / "build-manifest.json").open("rb") as f:
            data = f.read(MAX_MANIFEST + 1)
        doc = json.loads(data) if len(data) <= MAX_MANIFEST else None
    except (OSError, ValueError, RecursionError):  # whatever the folder holds now
        return False
    return isinstance(doc, dict) and doc.get("image") == root.image


#: A build manifest bigger than this is not one envbuild wrote (they are kilobytes).
MAX_MANIFEST = 64 << 20
