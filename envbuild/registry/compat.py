"""Which container tools read which layer compression: the rule behind envbuild's messages at
build, push, load and in CI. The facts (first version of each tool that reads zstd layers, with
their sources) live in ``envbuild/spec/engines.toml``.

It offers :func:`reads_zstd` (does this tool at this version read zstd layers),
:func:`compression_note` (the one line said when layers of a compression are pushed or built).
"""

from __future__ import annotations

import functools
import tomllib
from importlib import resources
from typing import Any

from packaging.version import InvalidVersion, Version

ZSTD_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+zstd"


@functools.cache
def _facts() -> dict[str, Any]:
    # through the top package: importing envbuild.spec would build its models (a no-op build
    # prints this note without them)
    facts = resources.files("envbuild").joinpath("spec", "engines.toml")
    text = facts.read_text(encoding="utf-8")
    return tomllib.loads(text)


def zstd_since() -> dict[str, str]:
    """Tool name -> first version that reads zstd layers."""
    return {row["tool"]: row["since"] for row in _facts()["zstd"]}


def reads_zstd(tool: str, version: str) -> bool | None:
    """Whether ``tool`` at ``version`` reads zstd layers; None when envbuild does not know the
    tool or cannot read the version."""
    for build in _facts().get("zstd_builds", []):
        if build["tool"] == tool and build["version"] == version.strip():
            return bool(build["reads"])
    since = zstd_since().get(tool)
    if since is None:
        return None
    try:
        return Version(_release(version)) >= Version(since)
    except InvalidVersion:
        return None


def _release(version: str) -> str:
    """``20.10.24+dfsg1`` -> ``20.10.24``: the leading numeric release of a version string."""
    head = version.strip().split("+")[0].split("~")[0].split("-")[0]
    return head.lstrip("v")


def readers(compression: str) -> str:
    """Who reads layers of ``compression``, in words."""
    if compression != "zstd":
        return "every engine and tool (gzip is read everywhere)"
    since = zstd_since()
    builds = {b["tool"]: b["version"] for b in _facts().get("zstd_builds", []) if b["reads"]}
    return ", ".join(
        f"{tool} >= {since[tool]}" + (f" (and {builds[tool]})" if tool in builds else "")
        for tool in sorted(since)
    )


def compression_note(compression: str) -> str | None:
    """The line to say when an image with ``compression`` layers is built or pushed (None for
    gzip or uncompressed layers, which every tool reads)."""
    if compression != "zstd":
        return None
    old = _facts()["debian12"]
    older = ", ".join(f"{tool} {version}" for tool, version in sorted(old.items()))
    return (
        f"layers are zstd: read by {readers('zstd')}; older tools (Debian 12's {older}, "
        "upstream Docker 20.10) cannot read them: build with --compression gzip for those"
    )
