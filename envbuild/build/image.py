"""Images: the OCI image config and manifest of a list of layers, written into the store.

Use::

    config = OciImageConfig(env={"PATH": ...}, cmd=[...], labels={...})
    image = write_image(store, layers=[*base.layers, *mine], config=config,
                        history=[*base.history, History(created_by="envbuild: torch 2.9")])
    image.manifest_digest          # "sha256:…": the image digest a build prints
    image.blobs()                  # every blob the image needs: give them to store.set_root

Every JSON document is compact canonical JSON (sorted keys, no whitespace), so the same inputs
give the same digests. Times are inputs: a build dates its image with :func:`created_for`
(the plan's ``SOURCE_DATE_EPOCH``, else the lock's cutoff); without ``created`` nothing is
dated. Where the image goes next: :mod:`envbuild.build.ocilayout` (an OCI image layout) and
:mod:`envbuild.build.dockerarchive` (a ``docker load`` tar).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from envbuild.build.layers import Layer
from envbuild.errors import ManifestError
from envbuild.fsio import compact_json
from envbuild.oci.layout import OCI_CONFIG, OCI_MANIFEST, REF_NAME
from envbuild.store.core import Store

log = logging.getLogger(__name__)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class History(_Model):
    """One entry of the config's history; ``empty_layer`` entries name no layer."""

    created_by: str = ""
    comment: str = ""
    empty_layer: bool = False
    created: str | None = None  # kept from a base image; ours come from SOURCE_DATE_EPOCH

    def as_json(self, created: str | None) -> dict[str, Any]:
        """The entry as the config holds it, dated ``created`` unless it has its own date."""
        out: dict[str, Any] = {}
        if self.created_by:
            out["created_by"] = self.created_by
        if self.comment:
            out["comment"] = self.comment
        if self.empty_layer:
            out["empty_layer"] = True
        if self.created or created:
            out["created"] = self.created or created
        return out


class OciImageConfig(_Model):
    """What the container runs with (the ``config`` part of an OCI image config), a base
    image's merged with the plan's (:class:`envbuild.build.plan.ImageConfig`, the part
    envbuild decides)."""

    architecture: str = "amd64"
    os: str = "linux"
    variant: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    workdir: str = "/"
    user: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    exposed_ports: list[str] = Field(default_factory=list)
    stop_signal: str | None = None

    def merged_over(self, base: OciImageConfig) -> OciImageConfig:
        """This config on top of a base image's: env and labels merged (ours win), the rest
        ours when set."""
        return self.model_copy(
            update={
                "env": {**base.env, **self.env},
                "labels": {**base.labels, **self.labels},
                "entrypoint": self.entrypoint if self.entrypoint is not None else base.entrypoint,
                "cmd": self.cmd if self.cmd is not None else base.cmd,
                "user": self.user or base.user,
                "exposed_ports": sorted({*base.exposed_ports, *self.exposed_ports}),
            }
        )

    @classmethod
    def from_oci(cls, doc: dict[str, Any]) -> OciImageConfig:
        """The parts of an OCI/Docker image config envbuild keeps from a base image."""
        c = doc.get("config") or {}
        env = {}
        for item in c.get("Env") or []:
            key, _, value = str(item).partition("=")
            env[key] = value
        return cls(
            architecture=doc.get("architecture", "amd64"),
            os=doc.get("os", "linux"),
            variant=doc.get("variant"),
            env=env,
            entrypoint=c.get("Entrypoint"),
            cmd=c.get("Cmd"),
            workdir=c.get("WorkingDir") or "/",
            user=c.get("User") or "",
            labels=c.get("Labels") or {},
            exposed_ports=sorted(c.get("ExposedPorts") or {}),
            stop_signal=c.get("StopSignal"),
        )


class Image(_Model):
    """An image whose config and manifest blobs are in the store."""

    manifest_digest: str
    manifest_size: int
    config_digest: str
    config_size: int
    architecture: str
    os: str
    layers: list[Layer]

    def blobs(self) -> list[str]:
        """Every blob the image needs: manifest, config, layers (sorted, once each)."""
        return sorted({self.manifest_digest, self.config_digest, *(x.digest for x in self.layers)})

    def descriptor(self, ref_name: str | None = None) -> dict[str, Any]:
        """The manifest's descriptor as an index lists it (named ``ref_name`` when given)."""
        desc: dict[str, Any] = {
            "mediaType": OCI_MANIFEST,
            "digest": self.manifest_digest,
            "size": self.manifest_size,
            "platform": {"architecture": self.architecture, "os": self.os},
        }
        if ref_name:
            desc["annotations"] = {REF_NAME: ref_name}
        return desc


def epoch_time(epoch: int | None) -> str | None:
    """``SOURCE_DATE_EPOCH`` (read into the plan) as RFC 3339; None when it is not set."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def created_for(cutoff: datetime, epoch: str | None) -> str:
    """An image's ``created``: ``epoch`` (the plan's SOURCE_DATE_EPOCH as RFC 3339) when set,
    else the lock's cutoff (``exclude_newer``: nothing in the image is newer), so the time is
    an input, never the clock's, and ``docker images`` shows a real date instead of N/A."""
    return epoch or cutoff.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: Longest ``created_by`` a layer's history entry gets; past it the names end with "(+N more)".
HISTORY_MAX = 200


def layer_history(label: str, distributions: Sequence[str], *, limit: int = HISTORY_MAX) -> str:
    """``created_by`` for a layer: ``label`` and the distributions it holds (``name==version``,
    as given), cut at a name boundary with the count of those left out when past ``limit``
    (the first is always named)."""
    if not distributions:
        return label
    text = f"{label}: {distributions[0]}"
    for i, dist in enumerate(distributions[1:], 1):
        left = len(distributions) - i  # this one included
        longer = f"{text}, {dist}"
        if len(longer) + (len(f" (+{left - 1} more)") if left > 1 else 0) > limit:
            return f"{text} (+{left} more)"
        text = longer
    return text


def config_json(
    layers: Sequence[Layer],
    config: OciImageConfig,
    history: Sequence[History],
    *,
    created: str | None = None,
) -> bytes:
    """The OCI image config document, compact and canonical. ``created`` (RFC 3339) dates the
    image and every history entry without its own; without it, none is dated."""
    non_empty = sum(1 for h in history if not h.empty_layer)
    if history and non_empty != len(layers):
        raise ValueError(f"history names {non_empty} layers but the image has {len(layers)}")
    inner: dict[str, Any] = {
        "Env": [f"{k}={v}" for k, v in sorted(config.env.items())],
        "WorkingDir": config.workdir,
    }
    if config.entrypoint is not None:
        inner["Entrypoint"] = config.entrypoint
    if config.cmd is not None:
        inner["Cmd"] = config.cmd
    if config.user:
        inner["User"] = config.user
    if config.labels:
        inner["Labels"] = dict(sorted(config.labels.items()))
    if config.exposed_ports:
        inner["ExposedPorts"] = {p: {} for p in sorted(config.exposed_ports)}
    if config.stop_signal:
        inner["StopSignal"] = config.stop_signal
    doc: dict[str, Any] = {
        "architecture": config.architecture,
        "os": config.os,
        "config": inner,
        "rootfs": {"type": "layers", "diff_ids": [x.diff_id for x in layers]},
        "history": [h.as_json(created) for h in history],
    }
    if config.variant:
        doc["variant"] = config.variant
    if created:
        doc["created"] = created
    return compact_json(doc)


def manifest_json(config_digest: str, config_size: int, layers: Sequence[Layer]) -> bytes:
    """The OCI image manifest document of a config and ``layers``, compact and canonical."""
    return compact_json(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_CONFIG, "digest": config_digest, "size": config_size},
            "layers": [
                {"mediaType": x.media_type, "digest": x.digest, "size": x.size} for x in layers
            ],
        }
    )


def write_image(
    store: Store,
    *,
    layers: Sequence[Layer],
    config: OciImageConfig,
    history: Sequence[History] = (),
    created: str | None = None,
) -> Image:
    """Write the config and manifest blobs of an image of ``layers`` (bottom first)."""
    for layer in layers:
        if not store.has_blob(layer.digest):
            raise ManifestError(f"layer {layer.digest} is not in the store {store.root}")
    cfg = config_json(layers, config, history, created=created)
    config_digest = store.add_bytes(cfg)
    man = manifest_json(config_digest, len(cfg), layers)
    return Image(
        manifest_digest=store.add_bytes(man),
        manifest_size=len(man),
        config_digest=config_digest,
        config_size=len(cfg),
        architecture=config.architecture,
        os=config.os,
        layers=list(layers),
    )


def blob_role(image: Image, digest: str) -> str:
    """What ``digest`` is to ``image``, for an error about its store blob."""
    if digest == image.manifest_digest:
        return "the image manifest"
    if digest == image.config_digest:
        return "the image config"
    if digest in image.blobs():
        return "a layer"
    return "the SBOM"
