"""The options of every command that talks to a registry (``--insecure``, ``--cert-dir``,
``--transport``) and the :class:`~envbuild.registry.core.Endpoint` they make. Light: a command's
parser is made before its core is imported."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from envbuild.registry.api import Endpoint


def add_registry_args(p: argparse.ArgumentParser) -> None:
    """Options every command that talks to a registry shares."""
    g = p.add_argument_group("registry connection")
    g.add_argument(
        "--insecure",
        action="store_true",
        help="allow plain HTTP and unverified TLS (a loopback or lab registry)",
    )
    g.add_argument(
        "--cert-dir",
        type=Path,
        metavar="DIR",
        help="trust the CA certificates DIR/*.crt (default: /etc/containers/certs.d/HOST)",
    )
    g.add_argument(
        "--transport",
        choices=("auto", "skopeo", "docker"),
        default="auto",
        help="copy with skopeo (default when installed) or through a Docker engine",
    )


def endpoint_from_args(args: argparse.Namespace) -> Endpoint:
    from envbuild.registry.api import Endpoint

    return Endpoint(insecure=args.insecure, cert_dir=args.cert_dir)
