"""The OCI image layout of an image: its blobs placed from the store, then ``index.json``.

:func:`write_oci_layout` hardlinks every blob of an :class:`~envbuild.build.image.Image` (and of
its referrers, the SBOM) from the store into ``OUT/blobs/sha256`` (copying across file systems),
each checked first, keeping blobs already there that are unchanged and removing an earlier
image's, and writes ``oci-layout`` and ``index.json`` last (:func:`write_index`): a reader never
sees an index naming a blob that is not there. An earlier index goes first, before any blob is
removed or placed: while the blobs change no index names an image (skopeo would show an
image whose blobs are half its own and half another's). Reading a layout back is
:mod:`envbuild.oci`'s.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.build.image import Image, blob_role
from envbuild.build.tarwrite import CHUNK
from envbuild.errors import IntegrityError, OutputError
from envbuild.fsio import atomic_writer, compact_json, fsync_dir, write_atomic
from envbuild.oci.layout import OCI_INDEX, OCI_LAYOUT
from envbuild.store.blobs import digest_hex
from envbuild.store.core import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Referrer:
    """An OCI 1.1 artifact about the image (its SBOM): the descriptor ``index.json`` lists after
    the image (with its ``artifactType``, so readers that want the image skip it) and the store
    blobs it is made of."""

    descriptor: dict[str, Any]
    blobs: tuple[str, ...]


def index_json(image: Image, ref_name: str | None, referrers: Sequence[Referrer] = ()) -> bytes:
    """The layout's ``index.json``: the image (named ``ref_name``), then its referrers."""
    manifests = [image.descriptor(ref_name), *(r.descriptor for r in referrers)]
    return compact_json({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests})


def write_oci_layout(
    store: Store,
    image: Image,
    out_dir: Path,
    *,
    ref_name: str | None,
    keep: Callable[[Path], bool] | None = None,
    referrers: Sequence[Referrer] = (),
    index: bool = True,
) -> Path:
    """Write ``image`` as an OCI image layout in ``out_dir`` (blobs hardlinked from the store,
    copied across file systems). Every blob is checked first (:meth:`Store.verified_path`): a
    corrupt one stops the write. A blob already in ``out_dir`` stays when it is the store's own
    file (a hard link) or ``keep(path)`` says it is unchanged since it was written; any other is
    replaced. Blobs of an earlier image in ``blobs/`` are removed; other files in ``out_dir``
    are left alone. ``referrers`` (the SBOM) are store blobs placed and listed the same way.
    An earlier ``index.json`` is removed first; the new one is written last (``index=False``:
    not yet, the caller writes it with :func:`write_index` once all else naming the image is
    written)."""
    out_dir = Path(out_dir)
    blob_dir = out_dir / "blobs" / "sha256"
    try:
        blob_dir.mkdir(parents=True, exist_ok=True)
        if (out_dir / "index.json").exists() or (out_dir / "index.json").is_symlink():
            (out_dir / "index.json").unlink()
            fsync_dir(out_dir)  # gone before any blob changes
    except OSError as exc:
        raise OutputError(f"cannot write {out_dir}: {exc.strerror}") from exc
    wanted = set(image.blobs()) | {d for r in referrers for d in r.blobs}
    for path in blob_dir.iterdir():
        if f"sha256:{path.name}" not in wanted:
            path.unlink()
    for digest in sorted(wanted):
        src = store.verified_path(digest, what=blob_role(image, digest))
        dest = blob_dir / digest_hex(digest)
        if _place_blob(src, dest, digest, keep):
            store.linked(digest)
    if index:
        write_index(out_dir, image, ref_name, referrers)
    return out_dir


def write_index(
    out_dir: Path, image: Image, ref_name: str | None, referrers: Sequence[Referrer] = ()
) -> None:
    """Write the ``oci-layout`` and ``index.json`` of the layout ``out_dir``, whose blobs are
    all in place (each atomically: the index is there whole, or not at all)."""
    write_atomic(Path(out_dir) / "oci-layout", OCI_LAYOUT)
    write_atomic(Path(out_dir) / "index.json", index_json(image, ref_name, referrers))


def _place_blob(src: Path, dest: Path, digest: str, keep: Callable[[Path], bool] | None) -> bool:
    """Put the (checked) store blob ``src`` at ``dest``; True when it was hard-linked now."""
    try:
        st = dest.lstat()
    except FileNotFoundError:
        st = None
    if st is not None:
        if os.path.samestat(st, src.stat()) or (keep is not None and keep(dest)):
            return False
        dest.unlink()
    try:
        os.link(src, dest)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise OutputError(f"cannot write {dest}: {exc.strerror}") from exc
    h = hashlib.sha256()  # the copy reads every byte: hash them on the way
    with atomic_writer(dest, 0o444) as out, src.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            out.write(chunk)
        if f"sha256:{h.hexdigest()}" != digest:
            raise IntegrityError(
                f"store blob {digest} changed while it was copied to {dest}",
                hint="run `envbuild store verify --repair`, then build again",
            )
    return False
