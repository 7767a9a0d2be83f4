"""`envbuild dockerfile SPEC`: an equivalent Dockerfile, rendered from the spec and its lock."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from envbuild.cli import render
from envbuild.errors import ExitCode
from envbuild.pipeline.dockerfile import CA_DIR, WHEELS_DIR, make_dockerfile
from envbuild.spec import load_spec
from envbuild.store.core import Store, default_store

log = logging.getLogger(__name__)


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Render SPEC's image as a Dockerfile: FROM the base, apt packages, the "
        "lock's wheels installed with uv and checked hashes, the same env, command and labels."
    )
    p.add_argument("spec", metavar="SPEC")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        type=Path,
        help="write here, not stdout; its build context beside it: $SSL_CERT_FILE in envbuild-ca/, "
        "wheels envbuild built or patched in envbuild-wheels/",
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
    store = Store(args.store) if args.store else default_store()
    result = make_dockerfile(loaded, store=store, build=args.build, output=args.output)
    if args.json:
        render.emit_json(result.as_dict())
        return ExitCode.OK
    if args.output:
        return ExitCode.OK
    needs = [CA_DIR, *([WHEELS_DIR] if result.wheels else [])]
    render.note(
        f"note: the Dockerfile COPYs {' and '.join(f'{d}/' for d in needs)} from its build "
        "context; `-o FILE` puts them there (the CA bundle from $SSL_CERT_FILE)"
    )
    render.echo(result.text.rstrip("\n"))
    return ExitCode.OK
