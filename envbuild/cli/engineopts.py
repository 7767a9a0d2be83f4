"""The container engine a command talks to: the one place envbuild reads ``$DOCKER_HOST``.

Every command that loads, builds in, snapshots or copies through an engine gets it here and passes
it to the core; nothing below the command line reads the variable.
"""

from __future__ import annotations

import logging
import os

from envbuild.engine import DEFAULT_HOST, DockerEngine

log = logging.getLogger(__name__)


def docker_engine(host: str | None = None) -> DockerEngine:
    """The Docker engine at ``host`` (``--host``), else ``$DOCKER_HOST``, else the default
    socket. Nothing is asked of it until a command needs it."""
    return DockerEngine(host or os.environ.get("DOCKER_HOST") or DEFAULT_HOST)
