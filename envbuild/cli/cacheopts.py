"""``--cache REGISTRY/REPO`` and ``--cache-read-only``: the remote build cache, for every command
that builds (``envbuild build``, ``envbuild ci``). Light: the store and registry are imported
only when a cache is used."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from envbuild.registry.api import Endpoint
    from envbuild.registry.transport import Transport
    from envbuild.store.core import Store


def add_cache_args(p: argparse.ArgumentParser) -> None:
    """``--cache REGISTRY/REPO`` and ``--cache-read-only``, for any command that builds."""
    p.add_argument(
        "--cache",
        metavar="REGISTRY/REPO",
        help="a remote build cache: pull layers and source builds made elsewhere, push new ones",
    )
    p.add_argument(
        "--cache-read-only", action="store_true", help="pull from the cache but push nothing to it"
    )


def store_with_cache(
    store: Store,
    args: argparse.Namespace,
    endpoint: Endpoint,
    transport: Transport | None = None,
) -> Store:
    """``store`` behind the remote cache ``--cache`` names (``store`` itself without one)."""
    if not args.cache:
        return store
    from envbuild.cli.engineopts import docker_engine
    from envbuild.registry.ref import parse_repo
    from envbuild.store.remote import CachedStore, RemoteCache

    remote = RemoteCache(
        parse_repo(args.cache, what="--cache"),
        endpoint=endpoint,
        transport=transport,
        engine=docker_engine(),
        push=not args.cache_read_only,
    )
    return CachedStore.over(store, remote)
