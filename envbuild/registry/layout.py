"""Small OCI layouts written for push, pull and the remote cache: blobs added to a layout's
``blobs/`` and an artifact manifest listed in its ``index.json``.

Reading a layout is :mod:`envbuild.oci`'s; writing an image's layout is
:mod:`envbuild.build.ocilayout`'s.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from envbuild.fsio import compact_json, sha256_bytes, sha256_file, write_atomic
from envbuild.oci.layout import OCI_LAYOUT, OCI_MANIFEST, REF_NAME, Descriptor

log = logging.getLogger(__name__)


def add_blob(root: Path, source: Path | bytes, media_type: str, **annotations: str) -> Descriptor:
    """Put ``source`` (a file, linked when it can be, or bytes) into ``root/blobs/sha256``."""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)
    if isinstance(source, bytes):
        hexdigest = sha256_bytes(source)
        target = blobs / hexdigest
        if not target.exists():
            write_atomic(target, source)
        size = len(source)
    else:
        hexdigest = sha256_file(source)
        target = blobs / hexdigest
        if not target.exists():
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)
        size = target.stat().st_size
    return Descriptor(media_type, f"sha256:{hexdigest}", size, dict(annotations))


def write_artifact(
    root: Path,
    *,
    artifact_type: str,
    config: bytes,
    layers: Sequence[Descriptor],
    annotations: dict[str, str],
    tag: str,
) -> Descriptor:
    """Write an OCI artifact manifest (config of type ``artifact_type``, ``layers`` already added
    with :func:`add_blob`) and an ``index.json`` naming it ``tag``. Returns the manifest's
    descriptor."""
    config_desc = add_blob(root, config, artifact_type)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": config_desc.to_json(),
        "layers": [d.to_json() for d in layers],
        "annotations": dict(sorted(annotations.items())),
    }
    desc = add_blob(root, compact_json(manifest), OCI_MANIFEST)
    desc = Descriptor(OCI_MANIFEST, desc.digest, desc.size, {REF_NAME: tag})
    write_atomic(root / "oci-layout", OCI_LAYOUT)
    write_atomic(
        root / "index.json", compact_json({"schemaVersion": 2, "manifests": [desc.to_json()]})
    )
    return desc
