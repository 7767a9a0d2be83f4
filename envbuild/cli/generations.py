"""`envbuild generations`: list, check and garbage-collect the generations on this machine."""

from __future__ import annotations

import argparse
from pathlib import Path

from envbuild.apply import host as hostmod
from envbuild.apply.manage import gc, list_infos, recover_pending
from envbuild.cli import render
from envbuild.cli.apply import add_root_flags, show_recovery
from envbuild.errors import ExitCode


def register(p: argparse.ArgumentParser) -> None:
    p.description = (
        "List the generations under the state dir. --verify checks each one's files "
        "(exit 1 if one was modified); --gc removes all but the --keep newest (never the "
        "current one). A switch cut short by a kill is undone first."
    )
    add_root_flags(p)
    p.add_argument("--verify", action="store_true", help="check every file of each generation")
    p.add_argument("--gc", action="store_true", help="remove old generations")
    p.add_argument(
        "--keep", type=int, default=3, metavar="N", help="with --gc: keep the N newest (default 3)"
    )
    p.add_argument("--dry-run", action="store_true", help="with --gc: only say what would go")
    render.add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    host = hostmod.real_host(Path(args.root))
    paths = host.paths
    # Listing must not fail because an apply is running: then its journal is no leftover.
    recovered = None
    if not (args.gc and args.dry_run):
        recovered = recover_pending(host, wait=args.wait, busy_ok=not args.gc)
    if recovered is not None and not args.json:
        show_recovery(recovered)
    if args.gc:
        result = gc(
            paths,
            keep=args.keep,
            dry_run=args.dry_run,
            wait=args.wait,
            wheels=host.wheels,
            store=host.store,
        )
        if args.json:
            render.emit_json(
                {**result.as_dict(), "recovered": recovered.as_dict() if recovered else None}
            )
        else:
            verb = "would remove" if args.dry_run else "removed"
            for name in result.removed:
                render.echo(f"{verb} {name}")
            for key in result.removed_trees:
                render.echo(f"{verb} install tree {key} (no generation links it)")
            render.echo(
                f"{verb} {len(result.removed)} generation(s) and {len(result.removed_trees)} "
                f"install tree(s), {result.freed_bytes / 1e9:.2f} GB; kept {len(result.kept)}"
            )
        return ExitCode.OK
    infos = list_infos(paths, verify=args.verify, store=host.store)
    bad = any(i.check is not None and not i.check.ok for i in infos)
    if args.json:
        render.emit_json(
            {
                "generations": [i.as_dict() for i in infos],
                "recovered": recovered.as_dict() if recovered else None,
            }
        )
    elif not infos:
        render.echo(f"no generations under {paths.generations}")
    else:
        for i in infos:
            mark = "*" if i.current else " "
            line = f"{mark} {i.number:>3}  {i.created}  {i.spec_name}  spec {i.spec_hash[:12]}"
            if i.check is not None:
                line += "  ok" if i.check.ok else "  MODIFIED"
            render.echo(line)
            if i.check is not None:
                for problem in i.check.problems[:10]:
                    render.echo(f"        {problem}")
    return ExitCode.DIFFERENT if bad else ExitCode.OK
