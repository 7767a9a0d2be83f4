"""Docker: running containers and the digests of their images, asked of a container engine.

Input: the engine (:mod:`envbuild.engine`) and the redactor; output: the snapshot's Docker section.
Without an engine (no socket, no permission, no SDK) the section says so and the snapshot goes on.
Container environments and registry credentials are never read.
"""

from __future__ import annotations

import logging

from envbuild.engine import ContainerEngine
from envbuild.errors import EngineError, EngineUnreachable, ToolNotFound
from envbuild.snapshot.model.services import Container, DockerSection
from envbuild.snapshot.redact import Redactor

log = logging.getLogger(__name__)


def read_docker(redactor: Redactor, engine: ContainerEngine) -> DockerSection:
    """The Docker section: the engine's version and its running containers, sorted by name."""
    try:
        version = engine.version()
        containers = []
        for c in engine.containers():
            try:
                found = engine.inspect_image(c.image_id) if c.image_id else None
            except EngineUnreachable:
                raise
            except EngineError:
                found = None
            containers.append(
                Container(
                    name=c.name,
                    id=c.id,
                    image=redactor.text(f"docker.containers[{c.name}].image", c.image),
                    image_id=c.image_id,
                    repo_digests=sorted(found.repo_digests) if found is not None else [],
                    status=c.status,
                )
            )
    except ToolNotFound as exc:
        return DockerSection(available=False, reason=f"the docker SDK is not installed ({exc})")
    except EngineError as exc:
        if isinstance(exc, EngineUnreachable):
            reason = f"no Docker engine at {exc.host}: {exc.reason.splitlines()[0]}"
        else:
            reason = f"no Docker engine: {exc.message.splitlines()[0]}"
        log.info("no Docker facts: %s", reason)
        return DockerSection(available=False, reason=reason)
    return DockerSection(
        available=True,
        server_version=version,
        containers=sorted(containers, key=lambda c: c.name),
    )
