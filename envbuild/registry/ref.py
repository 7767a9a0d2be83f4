"""Image references: ``REGISTRY/REPO[:TAG][@DIGEST]``, with the registry always named."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from envbuild.errors import UsageError

_HOST = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.?)+(?::[0-9]+)?|\[[0-9a-fA-F:]+\](?::[0-9]+)?"
)
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[\w][\w.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")

EXAMPLE = "ghcr.io/acme/serving:v1, 127.0.0.1:5000/team/llm@sha256:<64 hex>"


@dataclass(frozen=True)
class ImageRef:
    registry: str  # "ghcr.io", "127.0.0.1:5000"
    repository: str  # "acme/serving"
    tag: str | None = None
    digest: str | None = None

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text

    @property
    def name(self) -> str:
        """Registry and repository, without tag or digest."""
        return f"{self.registry}/{self.repository}"

    @property
    def reference(self) -> str:
        """What the registry API calls the reference: the digest when pinned, else the tag."""
        return self.digest or self.tag or "latest"

    def with_tag(self, tag: str) -> ImageRef:
        return replace(self, tag=tag, digest=None)

    def pinned(self, digest: str) -> ImageRef:
        return replace(self, digest=digest)


def parse_ref(text: str, *, what: str = "image reference", allow_digest: bool = True) -> ImageRef:
    """Parse ``REGISTRY/REPO[:TAG][@DIGEST]``. The registry part is required: envbuild never
    guesses Docker Hub. Raises :class:`UsageError` naming what is wrong."""

    def bad(reason: str) -> UsageError:
        return UsageError(f"{what} {text!r}: {reason}", hint=f"write it like {EXAMPLE}")

    rest, _, digest = text.partition("@")
    if digest and not _DIGEST.fullmatch(digest):
        raise bad("the digest must be sha256:<64 lowercase hex>")
    if digest and not allow_digest:
        raise bad("a digest cannot be given here, only a tag")
    host, slash, path = rest.partition("/")
    if not slash or not path:
        raise bad("name the registry and the repository (REGISTRY/REPO)")
    if not _HOST.fullmatch(host) or not ("." in host or ":" in host or host == "localhost"):
        raise bad(f"{host!r} is not a registry host (it needs a dot, a port, or be localhost)")
    tag = None
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, tag = path.rsplit(":", 1)
        if not _TAG.fullmatch(tag):
            raise bad(f"{tag!r} is not a valid tag")
    for component in path.split("/"):
        if not _COMPONENT.fullmatch(component):
            raise bad(
                f"repository component {component!r} may hold only lowercase letters, digits "
                "and '.', '_', '-'"
            )
    return ImageRef(registry=host, repository=path, tag=tag, digest=digest or None)


def parse_repo(text: str, *, what: str = "repository") -> ImageRef:
    """``REGISTRY/REPO`` with neither tag nor digest (a cache location)."""
    ref = parse_ref(text, what=what, allow_digest=False)
    if ref.tag is not None:
        raise UsageError(
            f"{what} {text!r}: give the repository without a tag",
            hint="e.g. ghcr.io/acme/envbuild-cache",
        )
    return ref
