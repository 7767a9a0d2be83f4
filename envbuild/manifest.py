"""The build's outputs: the image (config, manifest, OCI layout, docker archive) and the build
manifest that records it (``images/<spec>/build-manifest.json``, canonical JSON).

The image stage writes nothing when the output directory already holds the very image (same
build manifest, layout and archive present): a no-op rebuild stays a no-op.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from envbuild import __version__, image, layers
from envbuild.errors import EnvironmentFailure
from envbuild.fsio import canonical_json, write_atomic
from envbuild.plan import Plan
from envbuild.store import Store

log = logging.getLogger("envbuild.manifest")

MANIFEST_FORMAT = 1


@dataclass
class BaseResult:
    """The base stage's answer: its layers, config and history, and what to record about it."""

    layers: list[layers.Layer]
    config: image.ImageConfig
    history: list[image.History]
    info: dict[str, Any] = field(default_factory=dict)


# --- the build manifest -----------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BuiltLayer(_Model):
    name: str
    kind: str
    key: str = Field(description="the derivation key the layer is stored under ('' for a base)")
    digest: str
    diff_id: str
    size: int
    media_type: str
    distributions: list[str] = Field(description="name==version of what the layer holds")
    leaves_out: dict[str, list[str]] = Field(default_factory=dict)


class SourceBuildRecord(_Model):
    """One source build the image holds: its derivation key and inputs, and the audit's facts."""

    dist: str
    version: str
    key: str = Field(description="the source build's derivation key (its input key)")
    sdist: dict[str, str] = Field(description="file name and sha256")
    flags: dict[str, str] = Field(description="the build flags keyed (declared and forced)")
    max_jobs: int | None = Field(description="MAX_JOBS the build ran with")
    builder: dict[str, Any] = Field(
        description="where it ran (host, or a container and its rootfs)"
    )
    toolchain: dict[str, Any] = Field(description="Python and compiler versions")
    wheel: str
    wheel_sha256: str
    origin: str = Field(description="'built', or 'added' with `envbuild store add-wheel`")
    audit: dict[str, Any] = Field(description="SASS/PTX per compiled file (envbuild.audit)")
    target_ccs: list[str] = Field(default_factory=list)

    def audit_sass(self) -> list[str]:
        from envbuild.audit import Audit

        return Audit.model_validate(self.audit).sass


class PatchRecord(_Model):
    """One patched distribution the image holds."""

    dist: str
    version: str = Field(description="the locked (or built) version")
    patched_version: str
    key: str = Field(description="the patch derivation's key")
    source_wheel: dict[str, str] = Field(description="the wheel patched: file name and sha256")
    patches: list[dict[str, str]] = Field(description="path and sha256 of each patch, in order")
    files: list[str] = Field(description="files the patches changed, relative to site-packages")
    wheel: str
    wheel_sha256: str


class BuildManifest(_Model):
    """What ``envbuild build`` made, as ``images/<spec>/build-manifest.json`` (canonical JSON)."""

    format: Literal[1] = 1
    generator: str
    spec: str
    spec_hash: str
    lock_hash: str
    base: dict[str, Any]
    source_date_epoch: int
    layers: list[BuiltLayer]
    overlaps: list[dict[str, Any]] = Field(default_factory=list)
    source_builds: list[SourceBuildRecord] = Field(default_factory=list)
    patches: list[PatchRecord] = Field(default_factory=list)
    config: str = Field(description="digest of the image config")
    image: str = Field(description="digest of the image manifest: the image's digest")
    outputs: dict[str, str] = Field(description="files written, relative to the output dir")


# --- the image --------------------------------------------------------------------------------

OCI_DIR = "oci"
MANIFEST_FILE = "build-manifest.json"


def write_outputs(
    plan: Plan,
    store: Store,
    base: BaseResult,
    built: dict[str, BuiltLayer],
    overlaps: list[dict[str, Any]],
    out: Path,
    *,
    docker_archive: bool = True,
    source_builds: list[SourceBuildRecord] | None = None,
    patches: list[PatchRecord] | None = None,
    created: str | None = None,
) -> BuildManifest:
    ours = [built[layer.name] for layer in plan.layers]
    mine = [stored_layer(store, b) for b in ours]
    config = image.ImageConfig(
        env=plan.config.env,
        cmd=plan.config.cmd,
        entrypoint=plan.config.entrypoint,
        labels=plan.config.labels,
        workdir=plan.config.workdir,
    ).merged_over(base.config)
    history = [
        *base.history,
        *(
            image.History(
                created_by=image.layer_history(f"envbuild {b.kind} {b.name}", b.distributions),
                comment=b.key,
            )
            for b in ours
        ),
    ]
    img = image.write_image(
        store, layers=[*base.layers, *mine], config=config, history=history, created=created
    )
    base_built = [
        BuiltLayer(
            name=f"base-{i}" if len(base.layers) > 1 else "base",
            kind="base",
            key=str(base.info.get("key", "")) if i == 0 else "",
            digest=x.digest,
            diff_id=x.diff_id,
            size=x.size,
            media_type=x.media_type,
            distributions=[],
        )
        for i, x in enumerate(base.layers)
    ]
    outputs = {"oci_layout": OCI_DIR, "manifest": MANIFEST_FILE}
    if docker_archive:
        outputs["docker_archive"] = image.DOCKER_ARCHIVE
    manifest = BuildManifest(
        generator=f"envbuild {__version__}",
        spec=plan.spec,
        spec_hash=plan.spec_hash,
        lock_hash=plan.lock_hash,
        base={"kind": plan.base.kind, "description": plan.base.description, **base.info},
        source_date_epoch=plan.source_date_epoch,
        layers=[*base_built, *ours],
        overlaps=overlaps,
        source_builds=source_builds or [],
        patches=patches or [],
        config=img.config_digest,
        image=img.manifest_digest,
        outputs=outputs,
    )
    if _up_to_date(out, manifest):
        log.debug("%s is up to date", out)
        return manifest
    image.write_oci_layout(store, img, out / OCI_DIR, ref_name=plan.spec)
    archive = out / image.DOCKER_ARCHIVE
    if docker_archive:
        image.write_docker_archive(store, img, archive, repo_tags=[f"envbuild/{plan.spec}:latest"])
    else:
        archive.unlink(missing_ok=True)  # it would hold another image
    write_atomic(out / MANIFEST_FILE, canonical_json(manifest.model_dump(mode="json")))
    return manifest


def _up_to_date(out: Path, manifest: BuildManifest) -> bool:
    """The output dir already holds this very image (a no-op rebuild writes nothing)."""
    try:
        old = json.loads((out / MANIFEST_FILE).read_bytes())
    except (OSError, ValueError):
        return False
    return (
        old == json.loads(canonical_json(manifest.model_dump(mode="json")))
        and (out / OCI_DIR / "index.json").is_file()
        and (out / image.DOCKER_ARCHIVE).is_file() == ("docker_archive" in manifest.outputs)
    )


def stored_layer(store: Store, b: BuiltLayer) -> layers.Layer:
    """The packed layer a built layer names, from its derivation record."""
    drv = store.lookup(b.key)
    if drv is None:
        raise EnvironmentFailure(f"layer {b.name} ({b.key[:12]}) vanished from the store")
    fields = {k: drv.meta[k] for k in layers.Layer.model_fields if k in drv.meta}
    return layers.Layer.model_validate(fields)
