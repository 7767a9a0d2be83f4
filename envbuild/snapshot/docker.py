"""Docker: running containers and the digests of their images, through the ``docker`` SDK.

Without an engine (no socket, no permission, no SDK) the section says so and the snapshot goes on.
Container environments and registry credentials are never read.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from envbuild.snapshot.model.services import Container, DockerSection
from envbuild.snapshot.redact import Redactor

log = logging.getLogger("envbuild.snapshot.docker")


def read_docker(redactor: Redactor, client: Any = None) -> DockerSection:
    try:
        import docker  # type: ignore[import-untyped]
        from docker.errors import DockerException  # type: ignore[import-untyped]
    except ImportError as exc:
        return DockerSection(available=False, reason=f"the docker SDK is not installed ({exc})")
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if client is None and host.startswith("unix://") and not os.path.exists(host[7:]):
        return DockerSection(available=False, reason=f"no Docker engine: no socket at {host[7:]}")
    try:
        if client is None:
            client = docker.from_env(timeout=10, version="1.41")
        version = client.version()
        containers = []
        for c in client.containers.list():
            image = c.attrs.get("Config", {}).get("Image") or ""
            image_id = c.attrs.get("Image") or ""
            try:
                digests = sorted(client.images.get(image_id).attrs.get("RepoDigests") or [])
            except DockerException:
                digests = []
            containers.append(
                Container(
                    name=c.name,
                    id=c.id,
                    image=redactor.text(f"docker.containers[{c.name}].image", image),
                    image_id=image_id,
                    repo_digests=digests,
                    status=c.status,
                )
            )
    except DockerException as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log.info("no Docker facts: %s", reason)
        return DockerSection(available=False, reason=f"no Docker engine: {reason}")
    finally:
        if client is not None:
            client.close()
    return DockerSection(
        available=True,
        server_version=version.get("Version"),
        containers=sorted(containers, key=lambda c: c.name),
    )
