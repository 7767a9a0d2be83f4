"""Layers: tar streams of layer entries, hashed and compressed on the fly, written into the store.

Use::

    layer = write_layer(store, entries, compression=Compression.ZSTD)  # entries: Iterable[Entry]
    compressor_id(Compression.ZSTD)   # "zstd 1.5.4 -3": put it in a layer's derivation inputs
    with open_uncompressed(store.blob_path(layer.digest), layer.media_type) as f: ...

The entries (:mod:`envbuild.build.entries`: ``tree_entries``, ``whiteout``, ``opaque``) are
written by :mod:`envbuild.build.tarwrite` as the same bytes on every machine. A :class:`Layer`
carries ``digest`` (of the compressed blob, its name in the store), ``diff_id`` (sha256 of the
uncompressed tar), ``size``, ``media_type`` and a summary (entries, files, bytes).
The stream goes tar -> sha256 (diff_id) -> compressor (``zstd -T0`` or ``pigz``, through 1 MiB
buffers) -> sha256 (digest) -> a temp file in the store renamed to its digest: never in memory.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator

from pydantic import BaseModel, ConfigDict

from envbuild.build.entries import Entry, arrange
from envbuild.build.tarwrite import CHUNK, Sink, TarCounts, write_tar
from envbuild.errors import LayerError, UserError
from envbuild.oci.compression import MEDIA_TYPES
from envbuild.oci.layout import Compression as Compression  # noqa: PLC0414 (re-exported; defined there)
from envbuild.proc import core as proc
from envbuild.store.core import Store

log = logging.getLogger(__name__)

#: 1 MiB buffers circulating between the tar writer and the thread hashing and feeding them on.
BUFFERS = 4


DEFAULT_LEVEL = {Compression.ZSTD: 3, Compression.GZIP: 6, Compression.NONE: 0}


class Layer(BaseModel):
    """A layer blob in the store, with what an image config and manifest need to name it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    digest: str
    diff_id: str
    size: int
    media_type: str
    compression: Compression
    compressor: str
    uncompressed_size: int
    entries: int
    files: int
    file_bytes: int


def source_date_epoch() -> int | None:
    """``$SOURCE_DATE_EPOCH`` (the reproducible-builds convention), None when unset. A build
    reads it once, into its plan (:func:`envbuild.pipeline.planner.make_plan`), and its stages
    take it from there."""
    value = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if not value:
        return None
    if not value.isdigit():
        raise UserError(
            f"SOURCE_DATE_EPOCH={value!r} is not a number of seconds",
            hint="set it to an integer such as $(git log -1 --format=%ct), or unset it",
        )
    return int(value)


@functools.cache
def _tool_version(tool: str) -> str:
    done = proc.run([tool, "--version"], tool=tool, hint=_install_hint(tool))
    for word in (done.stdout + done.stderr).replace(",", " ").split():
        if word[:1] in "v0123456789" and any(c.isdigit() for c in word):
            return word.lstrip("v")
    return "unknown"


def _install_hint(tool: str) -> str:
    return f"install it (Debian: apt-get install {tool})"


def compressor_id(compression: Compression, level: int | None = None) -> str:
    """Names the compressor and its version: another version may give other bytes, so put this
    into the derivation inputs of a layer."""
    if compression is Compression.NONE:
        return "none"
    level = DEFAULT_LEVEL[compression] if level is None else level
    tool = "zstd" if compression is Compression.ZSTD else "pigz"
    return f"{tool} {_tool_version(tool)} -{level}"


def _compress_argv(compression: Compression, level: int) -> list[str]:
    if compression is Compression.ZSTD:
        return ["zstd", f"-{level}", "-T0", "-q", "-c", "--no-progress"]
    # -n: no name and no time in the gzip header; pigz output does not depend on its thread count
    return ["pigz", f"-{level}", "-n", "-c"]


class _HandoffSink(Sink):
    """A :class:`Sink` whose full buffers go to a thread that hashes them (the diff_id) and
    writes them on (to the compressor's pipe), while this thread fills the next one: sha256
    and the pipe's copy release the GIL, so they run beside the tar writer's Python. A few
    1 MiB buffers circulate; nothing else is held."""

    def __init__(self, out: Callable[[bytes | bytearray | memoryview], None], buffers: int) -> None:
        super().__init__(out)
        self.diff = hashlib.sha256()
        self.failures: list[BaseException] = []
        self._full: queue.SimpleQueue[tuple[bytearray, int] | None] = queue.SimpleQueue()
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        for _ in range(buffers - 1):
            self._free.put(bytearray(CHUNK))
        self._thread = threading.Thread(target=self._run, name="layer-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (item := self._full.get()) is not None:
            buf, n = item
            if not self.failures:
                try:
                    view = memoryview(buf)[:n]
                    self.diff.update(view)
                    self.out(view)
                except BaseException as exc:  # handed to the writing thread at its next flush
                    self.failures.append(exc)
            self._free.put(buf)

    def flush(self) -> None:
        if self.failures:
            raise self.failures[0]
        if self.fill:
            self._full.put((self.buf, self.fill))
            self.buf = self._free.get()
            self.view = memoryview(self.buf)
            self.fill = 0

    def abandon(self) -> None:
        """Stop the thread without writing what is queued (the layer failed anyway)."""
        self.failures.append(LayerError("the layer was abandoned"))
        self._full.put(None)
        self._thread.join()

    def close(self) -> None:
        """Wait for every buffer to be written; raises what went wrong in the thread."""
        self._full.put(None)
        self._thread.join()
        if self.failures:
            raise self.failures[0]


@contextlib.contextmanager
def _handoff(out: Callable[[bytes | bytearray | memoryview], None]) -> Iterator[_HandoffSink]:
    sink = _HandoffSink(out, BUFFERS)
    try:
        yield sink
        sink.flush()
    except BaseException:
        sink.abandon()
        raise
    sink.close()


def _write(
    store: Store,
    compression: Compression,
    level: int,
    produce: Callable[[Sink], TarCounts],
) -> Layer:
    """Run ``produce`` (which writes one tar stream into a sink) into a new layer blob."""
    with store.blob_writer() as blob:
        if compression is Compression.NONE:
            with _handoff(blob.write) as sink:
                counts = produce(sink)
        else:
            argv = _compress_argv(compression, level)
            with (
                proc.filter_bytes(argv, blob.write, hint=_install_hint(argv[0])) as feed,
                _handoff(feed) as sink,
            ):
                counts = produce(sink)
    layer = Layer(
        digest=blob.digest,
        diff_id=f"sha256:{sink.diff.hexdigest()}",
        size=blob.size,
        media_type=MEDIA_TYPES[compression],
        compression=compression,
        compressor=compressor_id(compression, level),
        uncompressed_size=sink.size,
        entries=counts.entries,
        files=counts.files,
        file_bytes=counts.file_bytes,
    )
    log.debug(
        "layer %s: %d entries, %d bytes -> %d",
        layer.digest[:19],
        counts.entries,
        sink.size,
        blob.size,
    )
    return layer


def write_layer(
    store: Store,
    entries: Iterable[Entry],
    *,
    compression: Compression = Compression.ZSTD,
    level: int | None = None,
    mtime: int = 0,
    progress: Callable[[int], None] | None = None,
) -> Layer:
    """Write ``entries`` as one deterministic layer blob into ``store`` and describe it, every
    member's mtime ``mtime`` (a build's: its plan's SOURCE_DATE_EPOCH). ``progress`` is called
    with the byte count of each file packed."""
    arranged = arrange(entries)
    level = DEFAULT_LEVEL[compression] if level is None else level
    return _write(store, compression, level, lambda s: write_tar(arranged, s, mtime, progress))
