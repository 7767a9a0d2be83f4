"""Local bases: an OCI image layout (pinned by manifest digest) or a rootfs tarball (by sha256).

An image's layers are imported as they are (same blobs, same digests; Docker media types become
their OCI equivalents, which name the same bytes), after each one is read through: its digest,
its diff_id against the config's ``rootfs.diff_ids``, and every member's path and link checked by
:mod:`envbuild.build.base.tarsafe`. A rootfs tarball (plain, gzip, zstd, xz or bzip2) is checked
against its sha256, then re-packed into one deterministic layer (modes and numeric owners kept).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envbuild.build.base.filekind import sniff
from envbuild.build.base.model import DEFAULT_PATH, BaseImage
from envbuild.build.base.tarread import (
    Readable,
    count_members,
    file_head,
    located,
    open_stream,
    open_tar,
    scan,
    tar_entries,
)
from envbuild.build.base.tarsafe import Limits, Tree
from envbuild.build.image import History, OciImageConfig
from envbuild.build.layers import Compression, Layer, compressor_id, write_layer
from envbuild.errors import IntegrityError, ManifestError
from envbuild.fsio import sha256_file
from envbuild.lock.model import BaseLock, OciLayoutBaseLock, RootfsBaseLock
from envbuild.oci import core as oci
from envbuild.oci.compression import MEDIA_TYPES, compression_of
from envbuild.oci.layout import open_layout
from envbuild.store.core import Output, Store

log = logging.getLogger(__name__)

#: Bump when importing or re-packing changes what a pinned base produces. 2: the member rules
#: of :mod:`envbuild.build.base.tarsafe` (sparse members, limits, symlinks across layers): a base
#: imported under the older rules is read again. 3: names with a NUL, whiteouts naming no file,
#: the cost limits refused; the setuid/setgid files recorded (``setid``).
RECIPE = 3
CHUNK = 1 << 20


class _HashingReader:
    """A read-only stream that hashes and counts what passes through it."""

    def __init__(self, f: Readable) -> None:
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.sha.update(data)
        self.size += len(data)
        return data


@dataclass(frozen=True)
class Scan:
    diff_id: str
    uncompressed_size: int
    entries: int
    files: int
    file_bytes: int


def scan_layer(path: Path, media_type: str, tree: Tree) -> Scan:
    """Read a layer blob through: its diff_id and summary, every member checked by ``tree``
    (which holds what the image's lower layers made)."""
    with open_stream(path, compression_of(media_type).value, tree) as raw:
        reader = _HashingReader(raw)
        got = scan(reader, tree)
    return Scan(
        f"sha256:{reader.sha.hexdigest()}", reader.size, got.members, got.files, got.file_bytes
    )


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


class _Descriptor(_Loose):
    mediaType: str = ""
    digest: Digest


class _Manifest(_Loose):
    layers: list[_Descriptor] | None = None


class _RunConfig(_Loose):
    Env: list[str] | None = None
    Entrypoint: list[str] | None = None
    Cmd: list[str] | None = None
    WorkingDir: str | None = None
    User: str | None = None
    Labels: dict[str, str] | None = None
    ExposedPorts: dict[str, Any] | None = None
    StopSignal: str | None = None


class _RootFs(_Loose):
    diff_ids: list[Digest] | None = None


class _History(_Loose):
    created_by: str = ""
    comment: str = ""
    empty_layer: bool = False
    created: str | None = None


class _Config(_Loose):
    architecture: str = "amd64"
    os: str = "linux"
    variant: str | None = None
    config: _RunConfig | None = None
    rootfs: _RootFs | None = None
    history: list[_History] | None = None


def _check_shapes(manifest: Any, config: Any, where: str) -> None:
    """Refuse an image manifest or config whose keys envbuild reads do not have their types
    (an image of another tool is read as far as envbuild needs it, nothing more)."""
    for what, model, doc in (("manifest", _Manifest, manifest), ("config", _Config, config)):
        try:
            model.model_validate(doc)
        except ValidationError as exc:
            bad = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg']}"
                for e in exc.errors()[:3]
            )
            raise ManifestError(
                f"{where}: invalid image {what}: {bad}",
                hint="the base image is malformed: pin another one",
            ) from exc


def import_image(
    store: Store,
    manifest: dict[str, Any],
    config: dict[str, Any],
    blob_path: Callable[[str], Path],
    *,
    where: str,
    limits: Limits | None = None,
) -> Output:
    """Copy an image's layers into the store, verified and scanned (all layers together against
    one :class:`~envbuild.build.base.tarsafe.Tree` and ``limits``); the derivation output of an
    image
    base (``meta``: layers, config, history)."""
    _check_shapes(manifest, config, where)
    descs = list(manifest.get("layers") or [])
    diff_ids = list((config.get("rootfs") or {}).get("diff_ids") or [])
    if len(descs) != len(diff_ids):
        raise ManifestError(
            f"{where}: the manifest lists {len(descs)} layers, the config {len(diff_ids)}"
        )
    layers: list[Layer] = []
    tree = Tree(where, limits)
    for i, (desc, diff_id) in enumerate(zip(descs, diff_ids, strict=True)):
        digest, media_type = str(desc.get("digest")), str(desc.get("mediaType", ""))
        if "foreign" in media_type or "nondistributable" in media_type:
            raise ManifestError(f"{where}: layer {i} is a foreign layer ({media_type})")
        compression = compression_of(media_type)
        if not blob_path(digest).is_file():
            raise ManifestError(f"{where}: layer {i} ({digest}) is missing")
        # its size, its format (by its first bytes) against its descriptor, before it is read
        with oci.open_blob(blob_path(digest), oci.Descriptor.from_json(desc, Path(where))) as f:
            stored = store.add_stream(f, expected=digest)
        tree.where = f"{where} layer {i} ({digest})"
        if i:
            tree.next_layer()
        scan = scan_layer(store.blob_path(stored), media_type, tree)
        if scan.diff_id != diff_id:
            # the blob is the bytes its digest names; the config describes it wrongly: the
            # image is bad input (exit 2), not bytes damaged on the way (an IntegrityError)
            raise ManifestError(
                f"{where}: layer {i} ({digest}) uncompresses to {scan.diff_id}, but the config's "
                f"rootfs.diff_ids[{i}] says {diff_id}",
                hint="the image's config does not describe its layers: build or export the "
                "base image again",
            )
        layers.append(
            Layer(
                digest=stored,
                diff_id=scan.diff_id,
                size=store.blob_path(stored).stat().st_size,
                media_type=MEDIA_TYPES[compression],
                compression=compression,
                compressor="imported",
                uncompressed_size=scan.uncompressed_size,
                entries=scan.entries,
                files=scan.files,
                file_bytes=scan.file_bytes,
            )
        )
    tree.where = where
    tree.finish()
    setid = tree.setid()
    history = [
        History(
            created_by=str(h.get("created_by", "")),
            comment=str(h.get("comment", "")),
            empty_layer=bool(h.get("empty_layer", False)),
            created=h.get("created"),
        ).model_dump(mode="json")
        for h in config.get("history") or []
    ]
    if sum(1 for h in history if not h["empty_layer"]) != len(layers):
        history = [
            History(created_by=f"{where} layer {i}").model_dump(mode="json")
            for i in range(len(layers))
        ]
    return Output(
        {f"layer-{i:03d}": x.digest for i, x in enumerate(layers)},
        {
            "layers": [x.model_dump(mode="json") for x in layers],
            "config": OciImageConfig.from_oci(config).model_dump(mode="json"),
            "history": history,
            "setid": setid,
        },
    )


def base_from_output(kind: str, key: str, meta: dict[str, Any], lock: BaseLock) -> BaseImage:
    return BaseImage(
        kind=kind,
        key=key,
        layers=[Layer.model_validate(x) for x in meta["layers"]],
        config=OciImageConfig.model_validate(meta["config"]),
        history=[History.model_validate(h) for h in meta["history"]],
        lock=lock,
        setid=meta.get("setid"),
    )


def from_oci_layout(
    store: Store, path: Path, pin: OciLayoutBaseLock, *, limits: Limits | None = None
) -> BaseImage:
    """The image ``pin.digest`` of the OCI layout at ``path``."""
    inputs = {"recipe": RECIPE, "manifest": pin.digest}

    def produce() -> Output:
        layout = open_layout(path, digest=pin.digest, architecture="amd64")
        return import_image(
            store,
            layout.document,
            layout.read_config(),
            layout.blob_path,
            where=f"OCI layout {path}",
            limits=limits,
        )

    with store.session():
        got = store.realize("base-oci", inputs, produce)
    return base_from_output("oci-layout", got.drv.key, got.drv.meta, pin)


@contextlib.contextmanager
def _plain_tar(path: Path, work: Path, tree: Tree) -> Iterator[Path]:
    """``path`` as an uncompressed (seekable) tarball: itself, or a decompressed copy (bounded
    by the tree's limits as it is written)."""
    compression = sniff(path)
    if compression == "none":
        tree.charge(path.stat().st_size)
        count_members(path, tree)
        yield path
        return
    out = work / "rootfs.tar"
    with open_stream(path, compression, tree) as src, out.open("wb") as dst:
        shutil.copyfileobj(src, dst, CHUNK)
    count_members(out, tree)
    yield out


def from_tarball(
    store: Store,
    path: Path,
    pin: RootfsBaseLock,
    *,
    compression: Compression = Compression.ZSTD,
    limits: Limits | None = None,
    sde: int = 0,
) -> BaseImage:
    """The rootfs tarball at ``path``, which must have sha256 ``pin.sha256`` (plain, gzip, xz,
    zstd or bzip2), read under ``limits``, repacked with mtimes ``sde`` (the plan's
    SOURCE_DATE_EPOCH)."""
    inputs = {
        "recipe": RECIPE,
        "sha256": pin.sha256,
        "compression": compressor_id(compression),
        "source_date_epoch": sde,
    }

    def produce() -> Output:
        where = f"rootfs tarball {path}"
        try:
            actual = sha256_file(path)
        except OSError as exc:
            raise ManifestError(f"{where} cannot be read: {exc.strerror}") from exc
        if actual != pin.sha256:
            raise IntegrityError(
                f"{where} has sha256 {actual}, the spec pins {pin.sha256}",
                hint="the file changed: restore it, or update base.sha256 and relock",
            )
        tree = Tree(where, limits)
        with (
            store.temp_dir("rootfs-") as work,
            _plain_tar(path, work, tree) as plain,
            located(tree, lambda: file_head(plain)),
            open_tar(name=plain, tree=tree) as tf,
        ):
            entries = tar_entries(tf, tree)
            layer = write_layer(store, entries, compression=compression, mtime=sde)
        setid = tree.setid()
        history = [History(created_by=f"envbuild: rootfs tarball sha256:{pin.sha256[:12]}")]
        return Output(
            {"layer": layer.digest},
            {
                "layers": [layer.model_dump(mode="json")],
                "config": OciImageConfig(env={"PATH": DEFAULT_PATH}).model_dump(mode="json"),
                "history": [h.model_dump(mode="json") for h in history],
                "setid": setid,
            },
        )

    with store.session():
        got = store.realize("base-rootfs", inputs, produce)
    return base_from_output("rootfs", got.drv.key, got.drv.meta, pin)
