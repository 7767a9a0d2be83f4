"""`envbuild lock SPEC... [--check]`: resolve specs into lockfiles, or check they are current.

A Debian base is pinned too (mmdebstrap, through :class:`envbuild.lock.core.BasePinner`): by default
its package set is reused from the existing lock while the spec's [base] and cutoff are
unchanged and resolved otherwise; ``--refresh-base`` always resolves it, ``--python-only``
never does.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from envbuild.cli import render
from envbuild.errors import ExitCode, UsageError
from envbuild.lock.core import check_lock, lock_spec
from envbuild.lock.pin import BaseMode, BasePinner
from envbuild.spec.validate import validate
from envbuild.store.core import Store


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Resolve each SPEC with uv for its target (Python version, platform tag, "
        "torch index, exclude-newer cutoff) and write lockfiles/pylock.<spec-name>.toml "
        "(PEP 751). A Debian base's package set is pinned with its .deb hashes: taken from "
        "the existing lock while the spec's [base] and cutoff are unchanged, resolved with "
        "mmdebstrap otherwise. With --check, resolve nothing: exit 1 and say what changed when "
        "a lock no longer matches its spec, 0 when it does."
    )
    p.add_argument("specs", nargs="+", metavar="SPEC", help="spec files (TOML)")
    p.add_argument(
        "--check",
        action="store_true",
        help="only check that each lock matches its spec (exit 1 if not)",
    )
    p.add_argument(
        "--output",
        "-o",
        type=Path,
        metavar="PATH",
        help="write (or check) the lock at PATH instead of lockfiles/ (one SPEC only)",
    )
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--refresh-base",
        action="store_true",
        help="resolve a Debian base's package set again with mmdebstrap, even when the "
        "existing lock pins it for an unchanged [base]",
    )
    how.add_argument(
        "--python-only",
        action="store_true",
        help="never run mmdebstrap: keep the Debian package set the existing lock pins while "
        "the spec's [base] is unchanged (even if the cutoff moved), else leave it unpinned",
    )
    p.add_argument(
        "--store",
        type=Path,
        metavar="DIR",
        help="where mmdebstrap's rootfs is kept for the build (default: $ENVBUILD_STORE or "
        "~/.cache/envbuild/store)",
    )
    p.add_argument(
        "--export-wheels",
        type=Path,
        metavar="DIR",
        help="write nothing to lockfiles/: put an installable form of SPEC's lock into DIR "
        "for pip or uv (requirements.txt with every hash, and the wheels `envbuild build` "
        "made for its source builds and patches; one SPEC, built first)",
    )
    p.add_argument(
        "--build",
        type=Path,
        metavar="DIR",
        help="with --export-wheels: the output of `envbuild build` whose wheels to take "
        "(default: images/<spec-name>/)",
    )
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.export_wheels is not None:
        return _export(args)
    if args.output is not None and len(args.specs) > 1:
        raise UsageError("--output takes one SPEC, got several")
    if args.check:
        if args.refresh_base or args.python_only:
            raise UsageError("--check resolves nothing; drop --refresh-base / --python-only")
        return _check(args)
    mode = (
        BaseMode.REFRESH
        if args.refresh_base
        else BaseMode.KEEP
        if args.python_only
        else BaseMode.PIN
    )
    from envbuild.build.base.core import resolve_debian  # mmdebstrap's driver: only when locking

    store = Store(args.store) if args.store else None
    pinner = BasePinner(mode, store, None if mode is BaseMode.KEEP else resolve_debian)
    results = []
    for spec in args.specs:
        loaded = validate(spec).loaded
        result = lock_spec(loaded, output=args.output, pinner=pinner)
        shown = loaded.display(result.path)
        results.append(result.as_dict(shown))
        if not args.json:
            state = "written" if result.changed else "unchanged"
            base = _base_text(result.base_summary())
            render.echo(f"{shown}: {len(result.lock.packages)} packages{base} ({state})")
    if args.json:
        render.emit_json({"results": results})
    return ExitCode.OK


def _export(args: argparse.Namespace) -> int:
    from envbuild.pipeline.dockerfile import export_wheels
    from envbuild.store.core import default_store

    if len(args.specs) > 1 or args.check or args.output is not None:
        raise UsageError("--export-wheels takes one SPEC, without --check or --output")
    loaded = validate(args.specs[0]).loaded
    store = Store(args.store) if args.store else default_store()
    done = export_wheels(loaded, store=store, dest=args.export_wheels, build=args.build)
    if args.json:
        render.emit_json(
            {
                "requirements": str(done.requirements),
                "wheels": [str(w) for w in done.wheels],
                "pip": done.pip_command(),
            }
        )
        return ExitCode.OK
    render.echo(f"{done.requirements}: the lock's wheels, {len(done.wheels)} built by envbuild")
    render.echo(f"install: {done.pip_command()}")
    return ExitCode.OK


def _base_text(summary: dict[str, object]) -> str:
    if summary["kind"] != "debian":
        return ""
    if summary["source"] == "unpinned":
        return ", Debian base not pinned"
    return f", Debian base {summary['packages']} packages ({summary['source']})"


def _check(args: argparse.Namespace) -> int:
    results = []
    stale = False
    for spec in args.specs:
        loaded = validate(spec).loaded
        check = check_lock(loaded, path=args.output)
        stale |= not check.ok
        results.append(check.as_dict())
        if not args.json:
            if check.ok:
                render.echo(f"{check.lock}: current")
                for note in check.notes:
                    render.echo(f"  note: {note}")
            else:
                render.echo(f"{check.lock}: stale")
                for change in check.changes:
                    render.echo(f"  {change.message}")
    if args.json:
        render.emit_json({"results": results})
    return ExitCode.DIFFERENT if stale else ExitCode.OK
