"""What ``envbuild adopt`` did, as data: the files it wrote and everything it could not adopt.

Nothing of the environment is dropped silently: every distribution is pinned (from its
published wheel) or a build ("rebuild needed"), every file that differs from its RECORD is in
a patch or in ``not_adopted`` with the reason, and every file no RECORD lists is a new file
of its distribution's patch (``new``) or in ``unrecorded``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envbuild.adopt.builds import Rebuild


@dataclass(frozen=True)
class Pinned:
    name: str
    version: str
    wheel: str  # the published wheel whose RECORD matched
    sha256: str


@dataclass(frozen=True)
class PatchWritten:
    dist: str
    path: str  # relative to the repository
    files: list[str]  # site-packages paths it changes
    new: list[str] = field(default_factory=list)  # of those, the files it creates (unrecorded)


@dataclass(frozen=True)
class NotAdopted:
    dist: str
    path: str
    reason: str


@dataclass
class Adopted:
    name: str
    spec: str  # relative to the repository
    lock: str
    pinned: list[Pinned] = field(default_factory=list)
    rebuild: list[Rebuild] = field(default_factory=list)
    patches: list[PatchWritten] = field(default_factory=list)
    not_adopted: list[NotAdopted] = field(default_factory=list)
    unrecorded: list[str] = field(default_factory=list)  # site-packages paths
    notes: list[str] = field(default_factory=list)
    host: dict[str, Any] | None = None
    serve: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    flags_from: str | None = None
    lock_packages: int = 0
    lock_added: list[str] = field(default_factory=list)  # locked, not installed

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "spec": self.spec,
            "lock": self.lock,
            "pinned": [vars(p) for p in self.pinned],
            "rebuild_needed": [r.as_dict() for r in self.rebuild],
            "patches": [vars(p) for p in self.patches],
            "not_adopted": [vars(n) for n in self.not_adopted],
            "unrecorded": self.unrecorded,
            "host": self.host,
            "serve": self.serve,
            "model": self.model,
            "serve_flags_from": self.flags_from,
            "lock_packages": self.lock_packages,
            "lock_added": self.lock_added,
            "notes": self.notes,
        }

    def lines(self) -> list[str]:
        out = [
            f"adopted {self.name}: {self.spec}, {self.lock} ({self.lock_packages} packages)",
            f"pinned from published wheels: {len(self.pinned)}",
        ]
        for p in self.patches:
            shown = [f"{f} (new: in no RECORD)" if f in p.new else f for f in p.files]
            out.append(f"patch {p.path} ({p.dist}): {', '.join(shown)}")
        for r in self.rebuild:
            archs = ", ".join(r.sass + r.ptx) or "no GPU code"
            torch = f", links torch {r.torch}" if r.torch else ""
            out.append(f"rebuild needed: {r.name} {r.version} ({r.reason}; {archs}{torch})")
        for n in self.not_adopted:
            out.append(f"not adopted: {n.path} ({n.dist}): {n.reason}")
        for path in self.unrecorded:
            out.append(f"unrecorded (in no RECORD, not adopted): {path}")
        if self.serve is not None:
            out.append(f"[serve] and [model] from the unit, read with {self.flags_from}")
        for note in self.notes:
            out.append(f"note: {note}")
        for name in self.lock_added:
            out.append(f"note: the lock adds {name}, a dependency the environment does not have")
        return out
