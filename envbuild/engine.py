"""The container engine: the few operations envbuild asks of one, behind one narrow interface.

:class:`ContainerEngine` names them — load an image archive, inspect an image, list the running
containers, run a throwaway container and collect its output, push, pull and save an image, the
engine's version — and :class:`DockerEngine` does them through the docker SDK. The core takes an
engine as an argument and never builds a client or reads ``$DOCKER_HOST``: the command line names
the engine (``envbuild.cli.engineopts``) and passes it in; tests that cannot have an engine pass
a subclass.

One policy for every operation: the Docker API version is fixed at :data:`API_VERSION` (asking the
engine for its version inside the SDK's constructor leaks the socket when that fails); a unix
socket is probed before a client is made (the SDK leaks the socket of a failed connection too);
each operation opens its own client and closes it after. Queries (version, inspect, list) wait
:data:`QUERY_TIMEOUT` seconds for an answer, work (load, run, push, pull, save) waits
:data:`WORK_TIMEOUT`: a load into a vfs engine answers only when it is done, and a build in a
container may print nothing while one nvcc job runs. Every SDK or transport failure becomes an
:class:`~envbuild.errors.EngineError`: callers never import the SDK.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from envbuild.errors import ContainerStartFailed, EngineError, EngineUnreachable, ToolNotFound

log = logging.getLogger(__name__)

#: The engine when nothing names one.
DEFAULT_HOST = "unix:///var/run/docker.sock"
#: Docker 20.10's API, served by every later engine.
API_VERSION = "1.41"
#: Seconds a query (version, inspect, list) may wait for the engine's answer.
QUERY_TIMEOUT = 10.0
#: Seconds an operation that waits on the engine's work (load, run, push, pull, save) may wait
#: for the next bytes of its answer.
WORK_TIMEOUT = 7 * 24 * 3600.0
#: Seconds to wait for a unix socket to accept a connection.
CONNECT_TIMEOUT = 10.0

#: A registry's credentials as an engine takes them (``username``, ``password``).
Auth = Mapping[str, str]


@dataclass(frozen=True)
class LoadedImage:
    """An image an engine loaded from an archive: its ID (the config digest) and tags."""

    id: str
    tags: list[str]


@dataclass(frozen=True)
class ImageInfo:
    """What envbuild reads of an image in an engine."""

    id: str
    repo_digests: list[str]


@dataclass(frozen=True)
class ContainerInfo:
    """A container an engine runs: ``image`` as it was asked for, ``image_id`` what it runs."""

    name: str
    id: str
    image: str
    image_id: str
    status: str


@dataclass(frozen=True)
class Mount:
    """A folder or file of this machine bind-mounted into a container."""

    source: Path
    target: str
    read_only: bool = True


@dataclass(frozen=True)
class Finished:
    """A container that ran to its end: its exit status and its output (stdout and stderr)."""

    exit_code: int
    output: str


@dataclass(frozen=True)
class RunRequest:
    """A throwaway container: ``command`` run by ``entrypoint`` in ``image``.

    ``network`` is an engine network (``none``, ``host``, a named one); ``user`` is ``UID:GID``;
    ``labels`` mark the container for whoever lists the engine's containers.
    """

    image: str
    command: Sequence[str]
    entrypoint: Sequence[str] | None = None
    environment: Mapping[str, str] = field(default_factory=dict)
    mounts: Sequence[Mount] = ()
    network: str = "none"
    user: str | None = None
    workdir: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)


class ContainerEngine(ABC):
    """The operations envbuild needs of a container engine.

    Every method raises :class:`~envbuild.errors.EngineUnreachable` when no engine answers at
    :attr:`host` and :class:`~envbuild.errors.EngineError` when it refuses the operation.
    """

    host: str

    @abstractmethod
    def version(self) -> str | None:
        """The engine's version (Docker's ``Version``), None when it does not say."""

    def available(self) -> bool:
        """Whether an engine answers at :attr:`host`."""
        try:
            self.version()
        except (EngineError, ToolNotFound):
            return False
        return True

    @abstractmethod
    def load(self, archive: Path) -> LoadedImage:
        """``docker load`` the archive at ``archive`` (Docker's ``manifest.json`` form); the
        first image it holds."""

    @abstractmethod
    def inspect_image(self, ref: str) -> ImageInfo | None:
        """The image ``ref`` (an ID, a name) names in the engine, None when it has none."""

    @abstractmethod
    def containers(self) -> list[ContainerInfo]:
        """The running containers, in the engine's order."""

    @abstractmethod
    def run(
        self, request: RunRequest, *, on_output: Callable[[str], None] | None = None
    ) -> Finished:
        """Create the container ``request`` describes, start it, collect its output (each piece
        also to ``on_output`` as it comes) until it exits, and remove it. Raises
        :class:`~envbuild.errors.ContainerStartFailed` when the engine cannot start it."""

    @abstractmethod
    def push(self, name: str, tag: str | None, auth: Auth | None) -> Iterator[dict[str, Any]]:
        """Push ``name:tag`` (every tag of ``name`` without one); yields the engine's progress
        messages (an ``error`` key is a failure the caller explains)."""

    @abstractmethod
    def pull(self, name: str, tag: str | None, auth: Auth | None) -> Iterator[dict[str, Any]]:
        """Pull ``name`` at ``tag`` (a tag or a digest); yields the progress messages."""

    @abstractmethod
    def save(self, ref: str, out: IO[bytes]) -> None:
        """Write ``docker save`` of the image ``ref`` to ``out``."""


def _sdk() -> tuple[Any, tuple[type[BaseException], ...]]:
    """The docker SDK, and the exceptions its calls raise."""
    try:
        import docker  # type: ignore[import-untyped]
        import docker.errors  # type: ignore[import-untyped]
        import requests
    except ImportError as exc:  # pragma: no cover - docker is a dependency
        raise ToolNotFound("the docker SDK", hint="pip install docker") from exc
    return docker, (docker.errors.DockerException, requests.exceptions.RequestException)


def _probe(host: str) -> None:
    """Fail early and cleanly when a unix socket does not answer."""
    if not host.startswith("unix://"):
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(CONNECT_TIMEOUT)
            probe.connect(host.removeprefix("unix://"))
    except OSError as exc:
        raise EngineUnreachable(host, exc.strerror or str(exc)) from exc


class DockerEngine(ContainerEngine):
    """A Docker engine at ``host`` (``unix:///…``, ``tcp://…``), through the docker SDK."""

    def __init__(self, host: str = DEFAULT_HOST) -> None:
        self.host = host

    def __repr__(self) -> str:
        return f"DockerEngine({self.host!r})"

    @contextlib.contextmanager
    def _client(self, timeout: float, doing: str) -> Iterator[Any]:
        """A client for one operation, closed after it; SDK failures inside the block become
        :class:`EngineError` naming ``doing``."""
        docker, failures = _sdk()
        _probe(self.host)
        client = None
        try:
            client = docker.DockerClient(base_url=self.host, version=API_VERSION, timeout=timeout)
            client.ping()
        except failures as exc:
            if client is not None:
                client.close()
            raise EngineUnreachable(self.host, str(exc)) from exc
        try:
            yield client
        except failures as exc:
            explanation = getattr(exc, "explanation", None) or exc
            raise EngineError(f"{doing} failed: {explanation}", host=self.host) from exc
        finally:
            client.close()

    def version(self) -> str | None:
        with self._client(QUERY_TIMEOUT, "asking the engine's version") as client:
            return str(client.version().get("Version") or "") or None

    def load(self, archive: Path) -> LoadedImage:
        with self._client(WORK_TIMEOUT, f"loading {archive}") as client, archive.open("rb") as f:
            images = client.images.load(f)
        if not images:
            raise EngineError(f"the engine loaded no image from {archive}", host=self.host)
        return LoadedImage(str(images[0].id), sorted(images[0].tags))

    def inspect_image(self, ref: str) -> ImageInfo | None:
        docker, _ = _sdk()
        with self._client(QUERY_TIMEOUT, f"inspecting {ref}") as client:
            try:
                attrs = client.images.get(ref).attrs
            except docker.errors.ImageNotFound:
                return None
        return ImageInfo(str(attrs.get("Id") or ""), list(attrs.get("RepoDigests") or []))

    def containers(self) -> list[ContainerInfo]:
        with self._client(QUERY_TIMEOUT, "listing the containers") as client:
            return [
                ContainerInfo(
                    name=c.name,
                    id=c.id,
                    image=c.attrs.get("Config", {}).get("Image") or "",
                    image_id=c.attrs.get("Image") or "",
                    status=c.status,
                )
                for c in client.containers.list()
            ]

    def run(
        self, request: RunRequest, *, on_output: Callable[[str], None] | None = None
    ) -> Finished:
        docker, failures = _sdk()
        volumes = {
            str(m.source): {"bind": m.target, "mode": "ro" if m.read_only else "rw"}
            for m in request.mounts
        }
        with self._client(WORK_TIMEOUT, f"a container of {request.image}") as client:
            container = client.containers.create(
                request.image,
                entrypoint=list(request.entrypoint) if request.entrypoint is not None else None,
                command=list(request.command),
                environment=dict(request.environment),
                volumes=volumes,
                network_mode=request.network,
                user=request.user,
                working_dir=request.workdir,
                labels=dict(request.labels),
            )
            try:
                try:
                    container.start()
                except docker.errors.APIError as exc:
                    raise ContainerStartFailed(
                        self.host, request.image, str(exc.explanation or exc)
                    ) from exc
                parts: list[str] = []
                stream = container.logs(stream=True, follow=True, stdout=True, stderr=True)
                try:
                    for chunk in stream:
                        text = chunk.decode("utf-8", "replace")
                        parts.append(text)
                        if on_output is not None:
                            on_output(text)
                finally:
                    stream.close()
                status = container.wait()
                return Finished(int(status.get("StatusCode", 1)), "".join(parts))
            finally:
                try:
                    container.remove(force=True)
                except failures:
                    log.warning("could not remove the container %s", container.id[:12])

    def push(self, name: str, tag: str | None, auth: Auth | None) -> Iterator[dict[str, Any]]:
        with self._client(WORK_TIMEOUT, f"pushing {name}:{tag}") as client:
            yield from client.api.push(
                name, tag=tag, stream=True, decode=True, auth_config=dict(auth) if auth else None
            )

    def pull(self, name: str, tag: str | None, auth: Auth | None) -> Iterator[dict[str, Any]]:
        with self._client(WORK_TIMEOUT, f"pulling {name}@{tag}") as client:
            yield from client.api.pull(
                name, tag=tag, stream=True, decode=True, auth_config=dict(auth) if auth else None
            )

    def save(self, ref: str, out: IO[bytes]) -> None:
        with self._client(WORK_TIMEOUT, f"saving {ref}") as client:
            for chunk in client.api.get_image(ref):
                out.write(chunk)
