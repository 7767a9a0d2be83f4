"""Garbage collection: remove every blob and derivation record of a store that no root keeps.

Input: the store's roots (``roots/<name>.json``, :class:`~envbuild.store.core.Root`) and its
derivation records; output: a :class:`GcResult` saying what went (or, with ``dry_run``, would
go). A root of an output folder lives only while that folder holds the image it was made for
(:func:`output_holds`), the way a Nix out-link does. ``collect`` takes the store's gc lock
exclusively, so it waits until every running build's session has ended.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envbuild.store.blobs import DIGEST_RE, digest_hex, rmtree
from envbuild.store.core import Derivation, Root, Store

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
        }


def collect(store: Store, *, dry_run: bool = False) -> GcResult:
    """Remove every blob and derivation no root keeps alive, and leftover temp files.

    Live: the blobs and derivations a root names; the outputs of live derivations; what a
    live image manifest or index names; and every derivation whose outputs are all live
    (cheap records that stay valid). Waits until no build holds a session.
    """
    with store.gc_lock():
        roots = store.roots()
        stale_roots = sorted(n for n, r in roots.items() if not output_holds(r))
        for name in stale_roots:
            log.info("root %s: %s no longer holds %s", name, roots[name].output, roots[name].image)
            del roots[name]
        live_blobs: set[str] = set()
        live_drvs: set[str] = set()
        records: dict[str, Derivation] = {}
        for key in store.derivations():
            try:
                records[key] = Derivation.model_validate_json(
                    (store.drvs / f"{key}.json").read_bytes()
                )
            except (ValidationError, ValueError):
                log.warning("derivation record %s is unreadable; removing it", key)
        for root in roots.values():
            live_blobs.update(root.blobs)
            for key in root.derivations:
                if key in records:
                    live_drvs.add(key)
                    live_blobs.update(records[key].outputs.values())
        _follow_manifests(store, live_blobs)
        for key, drv in records.items():
            if drv.outputs and set(drv.outputs.values()) <= live_blobs:
                live_drvs.add(key)
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
        stale_locks = [p for p in store.locks.iterdir() if p.name != "gc.lock"]
        kept_hex = {p.name for p in all_blobs} - {digest_hex(d) for d in dead_blobs}
        stale_stamps = store.stale_stamps(kept_hex)
        if not dry_run:
            for name in stale_roots:
                (store.roots_dir / f"{name}.json").unlink(missing_ok=True)
            for key in dead_drvs:
                (store.drvs / f"{key}.json").unlink(missing_ok=True)
            for digest in dead_blobs:
                store.blob_path(digest).unlink(missing_ok=True)
            for path in stale_stamps:
                path.unlink(missing_ok=True)
            for path in temps:
                rmtree(path)
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
    )


def _follow_manifests(store: Store, live: set[str]) -> None:
    """Add what live OCI/Docker manifests and indexes name (config, layers, manifests)."""
    todo = list(live)
    while todo:
        digest = todo.pop()
        path = store.blob_path(digest)
        try:
            if path.stat().st_size > 4 << 20:
                continue
            with path.open("rb") as f:
                if f.read(1) != b"{":
                    continue
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict):
            continue
        named: list[Any] = []
        if isinstance(doc.get("config"), dict):
            named.append(doc["config"])
        for key in ("layers", "manifests"):
            if isinstance(doc.get(key), list):
                named.extend(doc[key])
        for desc in named:
            d = desc.get("digest") if isinstance(desc, dict) else None
            if isinstance(d, str) and DIGEST_RE.match(d) and d not in live:
                live.add(d)
                todo.append(d)


def output_holds(root: Root) -> bool:
    """Whether the output folder of ``root`` still holds the image it was made for (a root
    that names no folder always lives)."""
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
