"""`envbuild gc [--store DIR] [--dry-run] [--json]`: remove what no image or root refers to."""

from __future__ import annotations

import argparse
import logging

from envbuild import scratch
from envbuild.cli import render
from envbuild.errors import ExitCode
from envbuild.store.core import Store, default_store
from envbuild.store.gc import collect

log = logging.getLogger(__name__)


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Remove every blob and derivation of the store that no root keeps alive, "
        "and temporary files that killed builds left (in the store, in /dev/shm and in the "
        "temporary directory). Each output folder of `envbuild build` is a root (as a Nix "
        "out-link is) as long as it holds the image built into it: removing the folder, or "
        "building another image into it, lets go of the old image. Waits until running "
        "builds on the store finish."
    )
    p.add_argument(
        "--store",
        metavar="DIR",
        help="the store (default: $ENVBUILD_STORE, else ~/.cache/envbuild/store)",
    )
    p.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    render.add_json_flag(p)
    p.set_defaults(func=run)


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def verb_of(dry_run: bool) -> str:
    return "would remove" if dry_run else "removed"


def run(args: argparse.Namespace) -> int:
    store = Store(args.store) if args.store else default_store()
    result = collect(store, dry_run=args.dry_run)
    swept = 0 if args.dry_run else scratch.sweep()
    if args.json:
        render.emit_json({"store": str(store.root), **result.as_dict(), "removed_scratch": swept})
        return ExitCode.OK
    for name in result.removed_roots:
        render.echo(
            f"{verb_of(result.dry_run)} root {name} (its output folder is gone or holds "
            "another image, or its generation is gone)"
        )
    verb = verb_of(result.dry_run)
    for digest in result.removed_blobs:
        render.echo(f"{verb} blob {digest}")
    for key in result.removed_derivations:
        render.echo(f"{verb} derivation {key}")
    for key in result.removed_trees:
        render.echo(f"{verb} install tree {key}")
    for key in result.linked_trees:
        render.echo(f"kept install tree {key}: no root names it, but a generation links its files")
    render.echo(
        f"{verb} {len(result.removed_blobs)} blobs ({_size(result.freed_bytes)}), "
        f"{len(result.removed_derivations)} derivations, {len(result.removed_trees)} install "
        f"trees, {result.removed_temp + swept} "
        f"temporary files; kept {result.kept_blobs} blobs for {result.roots} roots"
    )
    return ExitCode.OK
