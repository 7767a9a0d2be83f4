"""A layer of a directory tree, for tests that need a real layer blob in a store: the tree's
entries (:func:`envbuild.build.entries.tree_entries`) written by
:func:`envbuild.build.layers.write_layer`, as the build writes its staging trees."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from envbuild.build.entries import Entry, tree_entries
from envbuild.build.layers import Compression, Layer, write_layer
from envbuild.store.core import Store


def layer_from_tree(
    store: Store,
    root: Path,
    *,
    prefix: str = "",
    compression: Compression = Compression.ZSTD,
    mtime: int = 0,
    extra: Iterable[Entry] = (),
    progress: Callable[[int], None] | None = None,
) -> Layer:
    """Pack the tree at ``root`` (placed under ``prefix``), plus ``extra`` entries (whiteouts)."""
    entries = [*tree_entries(root, prefix=prefix), *extra]
    return write_layer(store, entries, compression=compression, mtime=mtime, progress=progress)
