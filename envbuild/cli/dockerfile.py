"""`envbuild dockerfile SPEC`: an equivalent Dockerfile, rendered from the spec and its lock."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from envbuild.build.dockerfile import (
    BASE_DIR,
    WHEELS_DIR,
    copy_base,
    copy_wheels,
    read_build_manifest,
    render_dockerfile,
)
from envbuild.build.planner import load_lock
from envbuild.cli import render
from envbuild.errors import ExitCode
from envbuild.fsio import write_atomic
from envbuild.lock import find_lock
from envbuild.spec import load_spec
from envbuild.store.core import Store, default_store


def register(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "dockerfile",
        help="render a Dockerfile equivalent to `envbuild build` (for docker users)",
        description="Render SPEC's image as a Dockerfile: FROM the base, apt packages, the "
        "lock's wheels installed with uv and checked hashes, the same env, command and labels.",
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        type=Path,
        help="write here, not stdout; wheels envbuild built or patched are copied beside it",
    )
    p.add_argument(
        "--build",
        metavar="DIR",
        type=Path,
        help="for source builds and patches: the output of `envbuild build` whose wheels the "
        "Dockerfile installs (default: images/<spec-name>/)",
    )
    p.add_argument(
        "--store",
        metavar="DIR",
        type=Path,
        help="the store holding those wheels (default: $ENVBUILD_STORE or ~/.cache/envbuild/store)",
    )
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loaded = load_spec(args.spec)
    lock, lock_hash = load_lock(loaded)
    manifest = read_build_manifest(args.build or loaded.root / "images" / loaded.name)
    result = render_dockerfile(
        loaded,
        lock,
        lock_hash=lock_hash,
        lock_file=loaded.display(find_lock(loaded)),
        manifest=manifest,
    )
    if args.output:
        copy_base(loaded, args.output.parent / BASE_DIR)
        if result.wheels:
            store = Store(args.store) if args.store else default_store()
            copy_wheels(store, result.wheels, args.output.parent / WHEELS_DIR)
        write_atomic(args.output, result.text)
    elif result.wheels and not args.json:
        print(
            f"note: the Dockerfile COPYs {WHEELS_DIR}/ from its build context; `-o FILE` puts "
            "the wheels there",
            file=sys.stderr,
        )
    if args.json:
        render.emit_json(
            {
                "base": result.base,
                "requirements": result.requirements,
                "dockerfile": result.text,
                "wheels": [asdict(w) for w in result.wheels],
            }
        )
    elif not args.output:
        render.echo(result.text.rstrip("\n"))
    return ExitCode.OK
