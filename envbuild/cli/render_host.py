"""`envbuild render host-setup SPEC`: the script that installs a spec's driver and toolkit;
`envbuild render unit SPEC`: the vLLM unit apply would install, with its secrets file's keys."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from envbuild.apply.host import real_host
from envbuild.apply.hostsetup import render_host_setup
from envbuild.apply.inputs import from_spec
from envbuild.apply.paths import HF_HOME
from envbuild.apply.preview import unit_preview
from envbuild.cli import render
from envbuild.errors import ExitCode
from envbuild.fsio import write_atomic
from envbuild.spec import load_spec


def register(p: argparse.ArgumentParser) -> None:
    p.description = "Render a file from a spec. envbuild never runs what it renders here."
    what = p.add_subparsers(dest="what", metavar="WHAT", required=True)
    hs: argparse.ArgumentParser = what.add_parser(
        "host-setup",
        help="a shell script installing the spec's NVIDIA driver and CUDA toolkit (apt)",
        description="Write a POSIX shell script that installs the driver version and CUDA "
        "toolkit the spec pins from NVIDIA's apt repository (Debian/Ubuntu), idempotently.",
    )
    hs.add_argument("spec", metavar="SPEC")
    hs.add_argument("-o", "--output", metavar="FILE", help="write here (mode 0755), not stdout")
    hs.set_defaults(func=run)
    un: argparse.ArgumentParser = what.add_parser(
        "unit",
        help="the vLLM systemd unit apply would install for the spec, and its secrets' keys",
        description="Write the systemd unit `envbuild apply SPEC` would install (for the next "
        "generation of this machine's state dir), and say which keys its EnvironmentFile "
        "holds; their values (secrets) are never shown.",
    )
    un.add_argument("spec", metavar="SPEC")
    un.add_argument("--lock", metavar="FILE", help="the lock (default: the spec's own)")
    un.add_argument("-o", "--output", metavar="FILE", help="write the unit here, not stdout")
    un.add_argument("--root", default="/", metavar="DIR", help="the state dir's root, as apply")
    un.add_argument(
        "--hf-home",
        default=HF_HOME,
        metavar="PATH",
        help=f"HF_HOME for the model and the unit, under --root (default: {HF_HOME})",
    )
    render.add_json_flag(un)
    un.set_defaults(func=run_unit)


def run(args: argparse.Namespace) -> int:
    text = render_host_setup(load_spec(args.spec))
    if args.output:
        write_atomic(Path(args.output), text, 0o755)
    else:
        render.echo(text.rstrip("\n"))
    return ExitCode.OK


def run_unit(args: argparse.Namespace) -> int:
    host = real_host(Path(args.root), args.hf_home)
    inp = from_spec(args.spec, lock=Path(args.lock) if args.lock else None)
    shown = unit_preview(inp, host.paths, host.wheels, host.store)
    if args.output:
        write_atomic(Path(args.output), shown.text, 0o644)
    if args.json:
        render.emit_json(
            {
                "unit": shown.unit,
                "text": shown.text,
                "env_file": str(shown.env_file),
                "env_keys": shown.env_keys,
                "exact_path": shown.exact_path,
                "generation": shown.generation,
                "reused": shown.reused,
            }
        )
    elif not args.output:
        render.echo(shown.text.rstrip("\n"))
    if not args.json:
        keys = ", ".join(shown.env_keys) or "none"
        sys.stderr.write(f"{shown.unit}: EnvironmentFile {shown.env_file} holds {keys}\n")
        what = "reuses" if shown.reused else "would build"
        sys.stderr.write(f"apply {what} generation {shown.generation}\n")
        if not shown.exact_path:
            sys.stderr.write(
                "note: the generation's folder is named by a content hash known once its "
                "source builds and patched wheels are in the store; shown as <n>-unbuilt\n"
            )
    return ExitCode.OK
