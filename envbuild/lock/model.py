"""The lock: the subset of PEP 751 (``pylock.toml``) that envbuild writes and reads, plus
envbuild's own ``[tool.envbuild]`` table.

Keys are spelled as in the file (``lock-version``, ``upload-time``); attributes use underscores.
Every model is strict and rejects unknown keys, so a hand-edited or foreign lock is an error, not
a silent guess. The format has two versions: PEP 751's ``lock-version`` (major must be 1) and
envbuild's ``tool.envbuild.format`` (:data:`LOCK_FORMAT`; older formats are converted by
:data:`CONVERTERS`, newer ones are refused — see :mod:`envbuild.lock.io`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

from envbuild.spec.scalars import (
    IMAGE_NAME,
    DebianPackage,
    DebianPackageName,
    DebianSuite,
    DebianVersion,
    EnvName,
    IndexUrl,
    MirrorUrl,
    Text,
)

#: envbuild's own format version of ``[tool.envbuild]``. Bump it when a change would make an
#: older envbuild misread a lock, and add a converter from the previous format.
LOCK_FORMAT = 3
#: The PEP 751 version envbuild writes. Readers accept any 1.x (a newer minor with a warning).
PEP751_VERSION = "1.0"
CREATED_BY = "envbuild"

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def _kebab(name: str) -> str:
    return name.replace("_", "-")


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, strict=True, alias_generator=_kebab, populate_by_name=True
    )


class Hashes(_Model):
    sha256: Sha256


class LockedFile(_Model):
    """One wheel or sdist: where it is, how big, and its digest."""

    name: str = Field(description="the file name (the last part of the URL)")
    url: str
    size: NonNegativeInt
    upload_time: datetime | None = Field(None, description="as the index reports it")
    hashes: Hashes


class LockedPackage(_Model):
    """A ``[[packages]]`` entry: one distribution at one version and the files that provide it."""

    name: str = Field(description="normalized distribution name (PEP 503)")
    version: str
    marker: str | None = Field(None, description="when the package is needed (PEP 508)")
    requires_python: str | None = None
    index: str | None = Field(None, description="the index it came from, when known")
    sdist: LockedFile | None = None
    wheels: list[LockedFile] = Field(default_factory=list)

    def files(self) -> list[LockedFile]:
        return [*self.wheels, *([self.sdist] if self.sdist else [])]


class Index(_Model):
    name: str = Field(description="'default', 'extra-N' or 'torch'")
    url: IndexUrl = Field(description="as the spec writes it; ${VAR} references stay unexpanded")


class LockedBuild(_Model):
    """A source build: a distribution locked as its sdist, built later by envbuild, never by uv."""

    name: str
    version: str
    sdist: LockedFile
    env: dict[EnvName, Text] = Field(default_factory=dict, description="build flags from the spec")
    requires_dist: list[str] = Field(
        default_factory=list,
        description="the sdist's declared dependencies (PKG-INFO), used for the resolution",
    )


class LockedPatch(_Model):
    path: str = Field(description="relative to the repository root")
    sha256: Sha256


class DebianPackageLock(_Model):
    # the same grammars as the spec's: these go into apt's preferences and mmdebstrap's argv
    name: DebianPackageName
    version: DebianVersion
    arch: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]
    sha256: Sha256


class DebianBaseLock(_Model):
    """A Debian base: what the spec asks for (suite, mirror, variant, ``include``) and the exact
    package set mmdebstrap installed for it (``packages``, each .deb by its sha256). An empty
    ``packages`` means the set is not pinned: the build resolves it against the mirror."""

    kind: Literal["debian"]
    suite: DebianSuite
    mirror: MirrorUrl
    variant: Literal["essential", "apt", "required", "minbase"]
    include: list[DebianPackage] = Field(
        default_factory=list,
        description="the spec's base.packages (mmdebstrap --include), sorted, without duplicates",
    )
    packages: list[DebianPackageLock] = Field(
        default_factory=list,
        description="the resolved package set, sorted by name (empty: not pinned)",
    )


class ImageBaseLock(_Model):
    kind: Literal["image"]
    ref: Annotated[str, Field(pattern=f"^{IMAGE_NAME.pattern}$")] = Field(
        description="the reference without its digest (repository[:tag])"
    )
    digest: Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


class OciLayoutBaseLock(_Model):
    kind: Literal["oci-layout"]
    path: str = Field(description="relative to the repository root")
    digest: Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


class RootfsBaseLock(_Model):
    kind: Literal["rootfs"]
    path: str = Field(description="relative to the repository root")
    sha256: Sha256


BaseLock = Annotated[
    DebianBaseLock | ImageBaseLock | OciLayoutBaseLock | RootfsBaseLock,
    Field(discriminator="kind"),
]


class EnvbuildLock(_Model):
    """``[tool.envbuild]``: what envbuild itself needs beyond PEP 751."""

    format: int = LOCK_FORMAT
    spec: str = Field(description="the spec's name")
    spec_hash: Sha256 = Field(description="LoadedSpec.spec_hash() of the spec this was locked from")
    python: str = Field(description="target Python version, MAJOR.MINOR")
    platform: str = Field(description="target wheel platform tag, e.g. manylinux_2_36_x86_64")
    exclude_newer: datetime
    indexes: list[Index]
    requirements: list[str] = Field(description="what was handed to the resolver, sorted")
    builds: list[LockedBuild] = Field(default_factory=list)
    patches: dict[str, list[LockedPatch]] = Field(
        default_factory=dict, description="normalized distribution name -> its patches, in order"
    )
    base: BaseLock | None = None
    requires: dict[Sha256, list[str]] = Field(
        default_factory=dict,
        description="Requires-Dist of each locked wheel a source build's closure reads, by the "
        "wheel's sha256: read from the wheels' METADATA at lock time, so keying a source build "
        "(apply, apply --dry-run) needs no index",
    )


class ToolTable(_Model):
    envbuild: EnvbuildLock


class Lock(_Model):
    """A whole ``pylock.<spec>.toml``."""

    lock_version: str = PEP751_VERSION
    environments: list[str] = Field(default_factory=list)
    requires_python: str
    created_by: str = CREATED_BY
    packages: list[LockedPackage]
    tool: ToolTable

    @property
    def envbuild(self) -> EnvbuildLock:
        return self.tool.envbuild

    def package(self, name: str) -> LockedPackage | None:
        """The locked package called ``name`` (any spelling), or None."""
        wanted = canonicalize_name(name)
        return next((p for p in self.packages if p.name == wanted), None)

    def build(self, name: str) -> LockedBuild | None:
        wanted = canonicalize_name(name)
        return next((b for b in self.envbuild.builds if b.name == wanted), None)
