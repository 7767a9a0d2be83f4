"""The snapshot's models of what runs and what is served on the machine: Docker containers,
systemd units and the models in the Hugging Face cache."""

from __future__ import annotations

import logging

from pydantic import Field

from envbuild.snapshot.model.base import Bytes, Skipped, Strict

log = logging.getLogger(__name__)


class Container(Strict):
    name: str
    id: str
    image: str = Field(description="the image reference the container was started from")
    image_id: str
    repo_digests: list[str] = Field(default_factory=list)
    status: str


class DockerSection(Skipped):
    server_version: str | None = None
    containers: list[Container] = Field(default_factory=list)


class Service(Strict):
    unit: str
    load_state: str | None = None
    active_state: str | None = None
    sub_state: str | None = None
    unit_file_state: str | None = None
    fragment_path: str | None = None
    exec_start: list[str] = Field(default_factory=list)
    environment: dict[str, str] = Field(default_factory=dict)


class SystemdSection(Skipped):
    pattern: str
    units: list[Service] = Field(default_factory=list)


class BadBlob(Strict):
    blob: str
    files: list[str] = Field(description="snapshot files that point at the blob")
    actual: str


class ModelRevision(Strict):
    commit: str
    refs: list[str]
    files: int
    size_bytes: Bytes


class ModelRepo(Strict):
    repo_id: str
    repo_type: str
    size_bytes: Bytes
    revisions: list[ModelRevision]
    bad_blobs: list[BadBlob] = Field(default_factory=list)


class HfCacheSection(Skipped):
    path: str
    blobs_checked: bool = False
    repos: list[ModelRepo] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
