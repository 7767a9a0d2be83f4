"""The build manifest: what ``envbuild build`` made, recorded as
``images/<spec>/build-manifest.json`` (canonical JSON), the output folder's commit record
(:mod:`envbuild.build.outputs` writes it last).

It names the image's digest and config, the base (with the setuid and setgid files it keeps,
``base.setid``: path -> octal mode), every layer (the base's and each planned one, with its
derivation key and distributions), the overlaps settled, the source builds and patches with
their inputs and audit, and the files written. Also here: the base stage's answer
(:class:`BaseResult`) and the way from a recorded layer back to its packed blob
(:func:`stored_layer`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from envbuild.build import image, layers
from envbuild.errors import EnvironmentFailure
from envbuild.store.core import Store

log = logging.getLogger(__name__)

MANIFEST_FORMAT = 1
#: The build manifest's file name in an output folder.
MANIFEST_FILE = "build-manifest.json"


@dataclass
class BaseResult:
    """The base stage's answer: its layers, config and history, and what to record about it."""

    layers: list[layers.Layer]
    config: image.OciImageConfig
    history: list[image.History]
    info: dict[str, Any] = field(default_factory=dict)
    #: what else the stage made that the image's root keeps (a Debian resolution)
    keys: list[str] = field(default_factory=list)


# --- the build manifest -----------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BuiltLayer(_Model):
    """One layer of the image as built: its key, digests, size and what it holds."""

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
    audit: dict[str, Any] = Field(
        description="SASS/PTX per compiled file (envbuild.sourcebuild.audit)"
    )
    target_ccs: list[str] = Field(default_factory=list)


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


def stored_layer(store: Store, b: BuiltLayer) -> layers.Layer:
    """The packed layer a built layer names, from its derivation record."""
    drv = store.lookup(b.key)
    if drv is None:
        raise EnvironmentFailure(f"layer {b.name} ({b.key[:12]}) vanished from the store")
    fields = {k: drv.meta[k] for k in layers.Layer.model_fields if k in drv.meta}
    return layers.Layer.model_validate(fields)
