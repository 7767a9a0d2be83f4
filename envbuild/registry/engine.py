"""The Docker-engine transport: push and pull through a Docker daemon with the docker SDK, for
machines without skopeo.

An engine does not copy an OCI layout byte for byte. ``docker load`` unpacks the layers and
``docker push`` compresses them again, so the manifest the registry stores has other layer
digests than the layout. What stays is the image config (Docker's image ID), which pins every
layer's uncompressed digest (``rootfs.diff_ids``); :mod:`envbuild.registry` therefore checks the
config digest after an engine push, and after an engine pull checks every (uncompressed) layer
against those diff_ids. Which layers the registry already had comes from the engine's own
progress messages ("Layer already exists", "Mounted from").

The engine must trust the registry itself: ``127.0.0.0/8`` is insecure by default, other plain
HTTP registries need ``insecure-registries`` in daemon.json, a private CA goes into
``/etc/docker/certs.d/HOST/ca.crt`` on the engine's host.
"""

from __future__ import annotations

import io
import json
import logging
import tarfile
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from envbuild import scratch
from envbuild.engine import ContainerEngine
from envbuild.errors import ToolFailed
from envbuild.fsio import compact_json
from envbuild.oci.compression import compression_of, open_uncompressed
from envbuild.oci.layout import (
    OCI_CONFIG,
    OCI_MANIFEST,
    REF_NAME,
    Compression,
    Descriptor,
    LayoutImage,
)
from envbuild.registry.api import Endpoint
from envbuild.registry.auth import Credentials
from envbuild.registry.layout import add_blob
from envbuild.registry.ref import ImageRef
from envbuild.registry.transport import Copied, Transport, classify

log = logging.getLogger(__name__)

OCI_LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
EXISTS = ("Layer already exists", "Mounted from")


def _auth(creds: Credentials | None) -> dict[str, str] | None:
    if creds is None:
        return None
    return {"username": creds.username, "password": creds.password.reveal()}


def _messages(
    stream: Iterable[Any], what: str, registry: str, creds: Credentials | None
) -> list[dict[str, Any]]:
    """Drain an engine's JSON progress stream; an error message becomes a typed error."""
    seen: list[dict[str, Any]] = []
    for msg in stream:
        if not isinstance(msg, dict):
            continue
        if "error" in msg:
            detail = str(msg.get("error"))
            failed = ToolFailed("docker", [what], 1, detail)
            raise classify(failed, registry, creds)
        seen.append(msg)
    return seen


class EngineTransport(Transport):
    """Copies through a container engine (:mod:`envbuild.engine`)."""

    name = "docker"
    preserves_digests = False

    def __init__(self, engine: ContainerEngine) -> None:
        self.engine = engine

    # -- push ---------------------------------------------------------------------------------
    def _archive(self, image: LayoutImage, repo_tag: str, folder: Path) -> Path:
        """A ``docker load`` archive (Docker's manifest.json form, read by every engine since
        1.10): zstd layers are stored uncompressed (engines before 23 cannot read zstd)."""
        path = folder / "image.tar"
        names = []
        with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar, ExitStack() as stack:
            config = image.blob_path(image.config)
            tar.add(config, arcname=f"{image.config.hex}.json")
            for i, desc in enumerate(image.layers):
                src = image.blob_path(desc)
                if compression_of(desc.media_type) is Compression.ZSTD:
                    plain = folder / f"layer{i}.tar"
                    with (
                        open_uncompressed(src, desc.media_type) as f,
                        plain.open("wb") as out,
                    ):
                        while chunk := f.read(1 << 20):
                            out.write(chunk)
                    src = plain
                    stack.callback(plain.unlink)
                name = f"layers/{i}-{desc.hex}.tar"
                tar.add(src, arcname=name)
                names.append(name)
            manifest = compact_json(
                [{"Config": f"{image.config.hex}.json", "RepoTags": [repo_tag], "Layers": names}]
            )
            info = tarfile.TarInfo("manifest.json")
            info.size = len(manifest)
            tar.addfile(info, io.BytesIO(manifest))
        return path

    def push(
        self, image: LayoutImage, target: ImageRef, endpoint: Endpoint, creds: Credentials | None
    ) -> Copied:
        repo_tag = f"{target.name}:{target.tag}"
        with scratch.temp_dir("engine-") as tmp:
            self.engine.load(self._archive(image, repo_tag, Path(tmp)))
        log.debug("loaded %s into the engine", repo_tag)
        stream = self.engine.push(target.name, target.tag, _auth(creds))
        msgs = _messages(stream, f"docker push {repo_tag}", target.registry, creds)
        digest = next((str(m["aux"]["Digest"]) for m in msgs if "Digest" in m.get("aux", {})), "")
        state: dict[str, bool] = {}
        for m in msgs:
            status, ident = str(m.get("status", "")), str(m.get("id", ""))
            if status == "Pushed":
                state[ident] = True
            elif status.startswith(EXISTS):
                state.setdefault(ident, False)
        return Copied(digest, uploaded_by_diff_id=state)

    # -- pull ---------------------------------------------------------------------------------
    def pull(
        self,
        source: ImageRef,
        dest: Path,
        endpoint: Endpoint,
        creds: Credentials | None,
        tag: str | None,
    ) -> None:
        pinned = f"{source.name}@{source.digest}"
        with scratch.temp_dir("engine-") as tmp:
            stream = self.engine.pull(source.name, source.digest, _auth(creds))
            _messages(stream, f"docker pull {pinned}", source.registry, creds)
            saved = Path(tmp) / "saved"
            archive = Path(tmp) / "image.tar"
            with archive.open("wb") as out:
                self.engine.save(pinned, out)
            with tarfile.open(archive) as tar:
                tar.extractall(saved, filter="data")
            _to_layout(saved, dest, tag)


def _to_layout(saved: Path, dest: Path, tag: str | None) -> None:
    """Turn what ``docker save`` wrote (manifest.json, a config, layer tars) into an OCI layout
    with uncompressed layers: each layer's digest is then its diff_id."""
    (entry,) = json.loads((saved / "manifest.json").read_bytes())
    config = (saved / entry["Config"]).read_bytes()
    config_desc = add_blob(dest, config, OCI_CONFIG)
    layer_descs = [add_blob(dest, saved / name, OCI_LAYER_TAR) for name in entry["Layers"]]
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config_desc.to_json(),
        "layers": [d.to_json() for d in layer_descs],
    }
    desc = add_blob(dest, compact_json(manifest), OCI_MANIFEST)
    annotations = {REF_NAME: tag} if tag else {}
    index = {
        "schemaVersion": 2,
        "manifests": [Descriptor(OCI_MANIFEST, desc.digest, desc.size, annotations).to_json()],
    }
    (dest / "oci-layout").write_bytes(compact_json({"imageLayoutVersion": "1.0.0"}))
    (dest / "index.json").write_bytes(compact_json(index))
