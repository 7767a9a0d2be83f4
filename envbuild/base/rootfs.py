"""Local bases: an OCI image layout (pinned by manifest digest) or a rootfs tarball (by sha256).

An image's layers are imported as they are (same blobs, same digests; Docker media types become
their OCI equivalents, which name the same bytes), after each one is read through: its digest,
its diff_id against the config's ``rootfs.diff_ids``, and every member's path and link checked by
:mod:`envbuild.base.tarsafe`. A rootfs tarball (plain, gzip, zstd or xz) is checked against its
sha256, then re-packed into one deterministic layer (modes and numeric owners kept).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import logging
import lzma
import shutil
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from envbuild.base.model import DEFAULT_PATH, BaseImage
from envbuild.base.tarsafe import UnsafeArchive, check_symlink, member_path, tar_entries
from envbuild.errors import IntegrityError, ManifestError
from envbuild.fsio import sha256_file
from envbuild.image import History, ImageConfig, read_oci_layout
from envbuild.layers import (
    MEDIA_TYPES,
    Compression,
    Layer,
    compression_of,
    compressor_id,
    open_uncompressed,
    source_date_epoch,
    write_layer,
)
from envbuild.lock.model import BaseLock, OciLayoutBaseLock, RootfsBaseLock
from envbuild.store import Output, Store

log = logging.getLogger("envbuild.base")

#: Bump when importing or re-packing changes what a pinned base produces.
RECIPE = 1
CHUNK = 1 << 20


class _HashingReader:
    """A read-only stream that hashes and counts what passes through it."""

    def __init__(self, f: IO[bytes]) -> None:
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.sha.update(data)
        self.size += len(data)
        return data

    def drain(self) -> None:
        while self.read(CHUNK):
            pass


@dataclass(frozen=True)
class Scan:
    diff_id: str
    uncompressed_size: int
    entries: int
    files: int
    file_bytes: int


def scan_layer(path: Path, media_type: str, *, where: str) -> Scan:
    """Read a layer blob through: its diff_id and summary, every member checked for safety."""
    entries = files = file_bytes = 0
    links: dict[str, str] = {}
    with open_uncompressed(path, media_type) as raw:
        reader = _HashingReader(raw)
        with tarfile.open(fileobj=reader, mode="r|") as tf:  # type: ignore[call-overload]
            for m in tf:
                name = member_path(m.name, where=where)
                entries += 1
                if m.issym():
                    links[name] = m.linkname
                    check_symlink(name, m.linkname, where=where, readlink=links.get)
                elif m.islnk():
                    member_path(m.linkname, where=where)
                elif (m.ischr() or m.isblk() or m.isfifo()) and not name.startswith("dev/"):
                    raise UnsafeArchive(where, f"member {m.name!r} is a device file or fifo")
                elif m.isreg():
                    files += 1
                    file_bytes += m.size
        reader.drain()
    return Scan(f"sha256:{reader.sha.hexdigest()}", reader.size, entries, files, file_bytes)


def import_image(
    store: Store,
    manifest: dict[str, Any],
    config: dict[str, Any],
    blob_path: Callable[[str], Path],
    *,
    where: str,
) -> Output:
    """Copy an image's layers into the store, verified and scanned; the derivation output of an
    image base (``meta``: layers, config, history)."""
    descs = list(manifest.get("layers") or [])
    diff_ids = list((config.get("rootfs") or {}).get("diff_ids") or [])
    if len(descs) != len(diff_ids):
        raise ManifestError(
            f"{where}: the manifest lists {len(descs)} layers, the config {len(diff_ids)}"
        )
    layers: list[Layer] = []
    for i, (desc, diff_id) in enumerate(zip(descs, diff_ids, strict=True)):
        digest, media_type = str(desc.get("digest")), str(desc.get("mediaType", ""))
        if "foreign" in media_type or "nondistributable" in media_type:
            raise ManifestError(f"{where}: layer {i} is a foreign layer ({media_type})")
        compression = compression_of(media_type)
        stored = store.add_file(blob_path(digest), expected=digest)
        scan = scan_layer(store.blob_path(stored), media_type, where=f"{where} layer {i}")
        if scan.diff_id != diff_id:
            raise IntegrityError(
                f"{where}: layer {i} uncompresses to {scan.diff_id}, the config says {diff_id}"
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
            "config": ImageConfig.from_oci(config).model_dump(mode="json"),
            "history": history,
        },
    )


def base_from_output(kind: str, key: str, meta: dict[str, Any], lock: BaseLock) -> BaseImage:
    return BaseImage(
        kind=kind,
        key=key,
        layers=[Layer.model_validate(x) for x in meta["layers"]],
        config=ImageConfig.model_validate(meta["config"]),
        history=[History.model_validate(h) for h in meta["history"]],
        lock=lock,
    )


def from_oci_layout(store: Store, path: Path, pin: OciLayoutBaseLock) -> BaseImage:
    """The image ``pin.digest`` of the OCI layout at ``path``."""
    inputs = {"recipe": RECIPE, "manifest": pin.digest}

    def builder() -> Output:
        layout = read_oci_layout(path, digest=pin.digest)
        return import_image(
            store, layout.manifest, layout.config, layout.blob_path, where=f"OCI layout {path}"
        )

    with store.session():
        got = store.build("base-oci", inputs, builder)
    return base_from_output("oci-layout", got.drv.key, got.drv.meta, pin)


@contextlib.contextmanager
def _plain_tar(path: Path, work: Path) -> Iterator[Path]:
    """``path`` as an uncompressed (seekable) tarball: itself, or a decompressed copy."""
    with path.open("rb") as f:
        magic = f.read(6)
    with contextlib.ExitStack() as stack:
        src: Any
        if magic[:2] == b"\x1f\x8b":
            src = stack.enter_context(gzip.open(path, "rb"))
        elif magic == b"\xfd7zXZ\x00":
            src = stack.enter_context(lzma.open(path, "rb"))
        elif magic[:4] == b"\x28\xb5\x2f\xfd":
            src = stack.enter_context(open_uncompressed(path, MEDIA_TYPES[Compression.ZSTD]))
        else:
            yield path
            return
        out = work / "rootfs.tar"
        with out.open("wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK)
    yield out


def from_tarball(
    store: Store,
    path: Path,
    pin: RootfsBaseLock,
    *,
    compression: Compression = Compression.ZSTD,
) -> BaseImage:
    """The rootfs tarball at ``path``, which must have sha256 ``pin.sha256``."""
    sde = source_date_epoch()
    inputs = {
        "recipe": RECIPE,
        "sha256": pin.sha256,
        "compression": compressor_id(compression),
        "source_date_epoch": sde,
    }

    def builder() -> Output:
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
        with store.temp_dir("rootfs-") as work, _plain_tar(path, work) as plain:
            try:
                with tarfile.open(plain, "r:") as tf:
                    entries = tar_entries(tf, where=where)
                    layer = write_layer(store, entries, compression=compression, mtime=sde)
            except tarfile.TarError as exc:
                raise UnsafeArchive(path, f"is not a tar archive ({exc})") from exc
        history = [History(created_by=f"envbuild: rootfs tarball sha256:{pin.sha256[:12]}")]
        return Output(
            {"layer": layer.digest},
            {
                "layers": [layer.model_dump(mode="json")],
                "config": ImageConfig(env={"PATH": DEFAULT_PATH}).model_dump(mode="json"),
                "history": [h.model_dump(mode="json") for h in history],
            },
        )

    with store.session():
        got = store.build("base-rootfs", inputs, builder)
    return base_from_output("rootfs", got.drv.key, got.drv.meta, pin)
