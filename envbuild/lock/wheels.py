"""Choosing the lock's wheels for the image: per locked package that applies to the image's
CPython and platform (its markers), the wheel whose tag the target accepts best.

Input: a lock; output: :class:`~envbuild.lock.wheels.WheelRef` per package, in name order.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from packaging.markers import InvalidMarker, Marker
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

from envbuild.errors import ManifestError
from envbuild.lock.model import Lock

log = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class WheelRef:
    """One locked wheel: what to install and how to check it."""

    name: str
    version: str
    filename: str
    url: str
    sha256: str
    size: int

    @property
    def canonical(self) -> str:
        return canonicalize_name(self.name)

    def key(self) -> dict[str, object]:
        return {
            "name": self.canonical,
            "version": self.version,
            "filename": self.filename,
            "sha256": self.sha256,
            "size": self.size,
        }


def target_tags(python_version: str, platform: str) -> list[Tag]:
    """Wheel tags the image's CPython accepts on ``platform``, best first."""
    major, minor = (int(x) for x in python_version.split(".")[:2])
    platforms = _platforms(platform)
    tags = list(cpython_tags((major, minor), platforms=platforms))
    tags += list(compatible_tags((major, minor), platforms=platforms))
    return tags


def _platforms(platform: str) -> list[str]:
    if platform.startswith("manylinux_"):
        _, glibc_major, glibc_minor, arch = platform.split("_", 3)
        out = [f"manylinux_{glibc_major}_{m}_{arch}" for m in range(int(glibc_minor), 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        for m, name in legacy.items():
            if m <= int(glibc_minor):
                out.append(f"{name}_{arch}")
        return [*out, f"linux_{arch}"]
    return [platform]


def marker_env(python_version: str, platform: str) -> dict[str, str]:
    """The environment markers of the image's CPython on ``platform`` (PEP 508)."""
    arch = "aarch64" if platform.endswith("aarch64") else "x86_64"
    return {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": arch,
        "extra": "",
    }


def select_wheels(lock: Lock, *, skip: frozenset[str] = frozenset()) -> list[WheelRef]:
    """One wheel per locked package that applies to the lock's target, best tag first.

    ``skip`` names distributions built from source (their wheel comes from the build stage).
    """
    meta = lock.envbuild
    tags = {t: i for i, t in enumerate(target_tags(meta.python, meta.platform))}
    env = marker_env(meta.python, meta.platform)
    out: list[WheelRef] = []
    for pkg in sorted(lock.packages, key=lambda p: p.name):
        name = canonicalize_name(pkg.name)
        if name in skip:
            continue
        if pkg.marker:
            try:
                if not Marker(pkg.marker).evaluate(env):
                    continue
            except InvalidMarker as exc:
                raise ManifestError(f"lock: {pkg.name}: bad marker {pkg.marker!r}: {exc}") from None
        best: tuple[int, str] | None = None
        chosen = None
        for f in pkg.wheels:
            try:
                _, _, _, wtags = parse_wheel_filename(f.name)
            except InvalidWheelFilename:
                raise ManifestError(f"lock: {pkg.name}: {f.name!r} is not a wheel name") from None
            rank = min((tags[t] for t in wtags if t in tags), default=None)
            if rank is not None and (best is None or (rank, f.name) < best):
                best, chosen = (rank, f.name), f
        if chosen is None:
            raise ManifestError(
                f"lock: {pkg.name} {pkg.version} has no wheel for CPython {meta.python} on "
                f"{meta.platform}",
                hint="relock (`envbuild lock`), or build it from source under [builds]",
            )
        out.append(
            WheelRef(name, pkg.version, chosen.name, chosen.url, chosen.hashes.sha256, chosen.size)
        )
    return out
