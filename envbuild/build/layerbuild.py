"""The layers stage: each planned layer installed with uv into a fresh staging root and packed
as one deterministic tar, ``WORKERS`` at a time, under the layer's derivation key.

A layer whose key the store knows is neither installed nor packed again; a layer's staging
tree sits in memory when there is room (:mod:`envbuild.scratch`). While it is on disk, the ELF
facts of its wheels' members are read from it into the link-check cache
(:mod:`envbuild.linkcheck.staging`), so the links stage inflates no wheel a second time.
Input: planned layers and the verified wheel files; output:
:class:`~envbuild.build.manifest.BuiltLayer` records.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any, cast

from envbuild import progress, scratch
from envbuild.build import layers
from envbuild.build.entries import Kind, tree_entries
from envbuild.build.fetch import fetch_wheels
from envbuild.build.install import install, write_venv
from envbuild.build.manifest import BuiltLayer
from envbuild.build.plan import PlanLayer
from envbuild.installed.venv import VenvTarget
from envbuild.linkcheck.reader import Cache, default_cache
from envbuild.linkcheck.staging import record_staged
from envbuild.linkcheck.wheels import Wheel
from envbuild.lock.wheels import WheelRef
from envbuild.store.core import Output, Store

log = logging.getLogger(__name__)

#: uv's cache of unzipped wheels, inside the store's tmp/ (so `envbuild gc` clears it): a layer
#: rebuilt after one of its distributions changed copies the others instead of unzipping them.
UV_CACHE = "uv-cache"
#: A layer's staging tree plus uv's unzipped copy, per byte of its wheels (wheels unzip to about
#: 2-3 times their size): what a scratch folder in memory must have room for.
STAGING_PER_WHEEL_BYTE = 6
#: Layers installed and packed at once.
WORKERS = 2
#: The niceness of the layer workers while the base is being made.
DEFERRED_NICE = 10


@dataclass(frozen=True)
class LayerInputs:
    """What every Python layer of one build is made from: the store, the wheel files checked
    so far by sha256 (``blobs``: a layer whose wheels were not fetched, because the store
    promised the layer, adds them), the locked wheels by sha256, the paths each distribution
    leaves out (the overlap report), the venv target and the compression."""

    store: Store
    blobs: dict[str, Path]
    by_sha: Mapping[str, WheelRef]
    leaves: Mapping[str, frozenset[str]]
    target: VenvTarget
    compression: layers.Compression


def build_layers(
    todo: Sequence[PlanLayer],
    inputs: LayerInputs,
    *,
    defer_to: Future[Any] | None = None,
) -> list[tuple[BuiltLayer, bool]] | None:
    """Install and pack ``todo`` (or find them in the store), ``WORKERS`` at a time; while
    ``defer_to`` runs, at a lower priority (see :func:`_defer`). Returns each layer's record and
    whether the store had it, in ``todo``'s order. When a layer fails, or ``defer_to`` does, the
    layers not started yet are dropped and this waits for the running ones (what they made
    stays in the store): a failed layer's error is raised, a failed ``defer_to`` gives None (it
    is the caller's to raise); so for Ctrl-C, which is raised once the running ones are done."""
    init = (lambda: _defer(defer_to)) if defer_to is not None else None
    with ThreadPoolExecutor(max_workers=WORKERS, initializer=init) as pool:
        try:
            jobs = {
                layer.name: pool.submit(progress.carried(build_layer), layer, inputs)
                for layer in todo
            }
            pending: set[Future[Any]] = set(jobs.values())
            base = {defer_to} if defer_to is not None else set()
            while pending:
                done, _ = wait(pending | base, return_when=FIRST_COMPLETED)
                if any(f.exception() is not None for f in done):
                    pool.shutdown(cancel_futures=True)
                    break
                pending -= done
                base -= done
        except BaseException:  # Ctrl-C: the pool's exit would run every layer still queued
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    if defer_to is not None and defer_to.done() and defer_to.exception() is not None:
        return None
    # the pool takes jobs in this order: none dropped before a failed one, whose error the
    # first failed layer's result() raises
    return [jobs[layer.name].result() for layer in todo]


def _defer(other: Future[Any]) -> None:
    """Lower this thread's priority (and so that of the uv and zstd it starts, and the threads
    it makes) while ``other`` is still running. mmdebstrap is one long chain of mostly serial
    work, the base's critical path, while the layers are parallel work that can fill the other
    cores: on two cores, an equal share slowed mmdebstrap from 25 s to 40 s and the build with
    it. Linux keeps a niceness per thread; elsewhere this changes nothing."""
    if other.done():
        return
    with contextlib.suppress(OSError, AttributeError):
        now = os.getpriority(os.PRIO_PROCESS, 0)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), max(now, DEFERRED_NICE))


def build_layer(layer: PlanLayer, inputs: LayerInputs) -> tuple[BuiltLayer, bool]:
    """One planned layer from the store, or installed and packed now under its key."""
    store, blobs, leaves, target = inputs.store, inputs.blobs, inputs.leaves, inputs.target
    names = [d.name for d in layer.dists]
    left = {d: sorted(leaves[d]) for d in names if d in leaves}

    def produce() -> Output:
        if missing := [inputs.by_sha[d.sha256] for d in layer.dists if d.sha256 not in blobs]:
            # the remote cache said it had this layer, then did not deliver it
            blobs.update(fetch_wheels(missing, store))
        refs = [(d.ref(""), blobs[d.sha256]) for d in layer.dists]
        # the staging tree and the wheels uv unzips for it, in memory when there is room
        needed = STAGING_PER_WHEEL_BYTE * sum(path.stat().st_size for _, path in refs)
        with (
            scratch.folder("stage-", needed) as fast,
            store.temp_dir("stage-") if fast is None else contextlib.nullcontext(fast) as work,
        ):
            root = work / "root"
            root.mkdir()
            if layer.kind == "venv":
                write_venv(root, target)
            else:
                with progress.task(f"install {layer.name}", len(refs), unit="dists") as task:
                    install(
                        refs,
                        target,
                        root,
                        remove={d: leaves[d] for d in left},
                        cache=work / UV_CACHE if fast is not None else store.tmp / UV_CACHE,
                    )
                    task.advance(len(refs))
                # the links stage's facts, from the files on disk: it then inflates no member
                staged = [Wheel(d.name, d.version, blobs[d.sha256], d.sha256) for d in layer.dists]
                record_staged(root, staged, target, Cache(default_cache()), leaves)
            packed = pack(
                store,
                root,
                layer.name,
                compression=inputs.compression,
                mtime=int(layer.inputs["source_date_epoch"]),
            )
        return Output(
            outputs={"layer": packed.digest},
            meta={**packed.model_dump(mode="json"), "leaves_out": left},
        )

    realized = store.realize("layer", layer.inputs, produce)
    meta = realized.drv.meta
    return (
        BuiltLayer(
            name=layer.name,
            kind=layer.kind,
            key=layer.key,
            digest=realized.drv.outputs["layer"],
            diff_id=str(meta["diff_id"]),
            size=int(meta["size"]),
            media_type=str(meta["media_type"]),
            distributions=[f"{d.name}=={d.version}" for d in layer.dists],
            leaves_out={k: list(v) for k, v in dict(meta.get("leaves_out", {})).items()},
        ),
        realized.reused,
    )


def pack(
    store: Store,
    root: Path,
    name: str,
    *,
    compression: layers.Compression,
    mtime: int,
) -> layers.Layer:
    """Pack the staging tree ``root`` as one deterministic layer, reporting bytes read."""
    entries = tree_entries(root)
    total = sum(e.size for e in entries if e.kind is Kind.FILE)
    with progress.task(f"pack {name}", total) as task:
        counted = [
            replace(e, source=_counting_opener(e.source, task.advance))
            if isinstance(e.source, Path)
            else e
            for e in entries
        ]
        return layers.write_layer(store, counted, compression=compression, mtime=mtime)


class _Counting(io.RawIOBase):
    def __init__(self, f: io.RawIOBase, advance: Callable[[int], None]) -> None:
        self._f, self._advance = f, advance

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        n = self._f.readinto(buf)
        if n:
            self._advance(n)
        return n or 0

    def close(self) -> None:
        self._f.close()
        super().close()


def _counting_opener(path: Path, advance: Callable[[int], None]) -> Callable[[], IO[bytes]]:
    def opener() -> IO[bytes]:
        raw = cast(io.RawIOBase, path.open("rb", buffering=0))
        return cast(IO[bytes], _Counting(raw, advance))

    return opener
