"""Registry credentials from the places Docker and the containers tools keep them.

Looked up in this order (the first that knows the registry wins):

1. ``$REGISTRY_AUTH_FILE`` (the containers tools' auth.json),
2. ``$XDG_RUNTIME_DIR/containers/auth.json`` (``podman login``, ``skopeo login``),
3. ``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json`` (``docker login``), including its
   ``credHelpers``/``credsStore`` (``docker-credential-<helper> get``).

Passwords are held in :class:`~envbuild.proc.core.Secret` and reach a child only through a private
auth file (mode 0600 in a private temporary folder), never its command line.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild import scratch
from envbuild.errors import InputFileError, RegistryError, ToolFailed
from envbuild.proc import core as proc

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Credentials:
    username: str
    password: proc.Secret
    source: str  # where they were found, for messages ("~/.docker/config.json")

    def basic(self) -> str:
        """The value of an ``Authorization: Basic`` header (keep it out of logs)."""
        raw = f"{self.username}:{self.password.reveal()}".encode()
        return "Basic " + base64.b64encode(raw).decode()


def config_files() -> list[Path]:
    """The credential files consulted, in order (whether or not they exist)."""
    files: list[Path] = []
    if value := os.environ.get("REGISTRY_AUTH_FILE"):
        files.append(Path(value))
    if runtime := os.environ.get("XDG_RUNTIME_DIR"):
        files.append(Path(runtime) / "containers" / "auth.json")
    docker = os.environ.get("DOCKER_CONFIG")
    files.append(
        Path(docker) / "config.json" if docker else Path.home() / ".docker" / "config.json"
    )
    return files


def _normalize(key: str) -> str:
    """``https://host/v1/`` and ``host`` name the same registry."""
    for prefix in ("https://", "http://"):
        if key.startswith(prefix):
            key = key[len(prefix) :]
            return key.split("/", 1)[0]
    return key.rstrip("/")


def _read(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputFileError(path, f"cannot read credentials: {exc.strerror}") from exc
    try:
        data = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        raise InputFileError(path, f"is not JSON: {exc.msg} (line {exc.lineno})") from exc
    if not isinstance(data, dict):
        raise InputFileError(path, "is not a JSON object")
    return data


def _from_entry(entry: Any, path: Path) -> Credentials | None:
    if not isinstance(entry, dict):
        return None
    if entry.get("identitytoken"):
        raise RegistryError(
            f"{path}: identity tokens are not supported",
            hint="log in with a user name and a password or access token",
        )
    if auth := entry.get("auth"):
        try:
            user, sep, password = base64.b64decode(auth, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise InputFileError(path, "an 'auth' entry is not base64 of user:password") from exc
        if not sep:
            raise InputFileError(path, "an 'auth' entry is not base64 of user:password")
        return Credentials(user, proc.Secret(password), str(path))
    if entry.get("username") and entry.get("password"):
        return Credentials(str(entry["username"]), proc.Secret(str(entry["password"])), str(path))
    return None


def _helper(name: str, registry: str, path: Path) -> Credentials | None:
    tool = f"docker-credential-{name}"
    try:
        done = proc.run([tool, "get"], tool=tool, input=registry, env=proc.child_env())
    except ToolFailed as exc:
        if "not found" in exc.output_tail.lower():
            return None
        raise
    data = json.loads(done.stdout)
    if data.get("Username") == "<token>":
        raise RegistryError(f"{tool}: identity tokens are not supported")
    return Credentials(str(data["Username"]), proc.Secret(str(data["Secret"])), f"{path} ({tool})")


def find_credentials(registry: str, repository: str = "") -> Credentials | None:
    """Credentials for ``registry`` (most specific ``host/repo`` entry first), or None."""
    wanted = [registry]
    parts = repository.split("/") if repository else []
    wanted = [f"{registry}/{'/'.join(parts[:i])}" for i in range(len(parts), 0, -1)] + wanted
    for path in config_files():
        data = _read(path)
        if data is None:
            continue
        helpers = data.get("credHelpers") or {}
        if isinstance(helpers, dict) and registry in helpers:
            return _helper(str(helpers[registry]), registry, path)
        auths = {_normalize(k): v for k, v in (data.get("auths") or {}).items()}
        for key in wanted:
            if (found := _from_entry(auths.get(key), path)) is not None:
                log.debug("credentials for %s from %s", registry, path)
                return found
        store = data.get("credsStore")
        if store and (found := _helper(str(store), registry, path)) is not None:
            return found
    return None


@contextmanager
def auth_file(registry: str, creds: Credentials | None) -> Iterator[Path]:
    """A private auth.json holding ``creds`` for ``registry`` (empty without credentials, so the
    child sees exactly what envbuild saw), removed when the block ends."""
    with scratch.temp_dir("auth-") as tmp:
        path = Path(tmp) / "auth.json"
        auths: dict[str, dict[str, str]] = {}
        if creds is not None:
            raw = f"{creds.username}:{creds.password.reveal()}".encode()
            auths[registry] = {"auth": base64.b64encode(raw).decode()}
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"auths": auths}, f)
        yield path
