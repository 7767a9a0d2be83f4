"""Whether a lock still matches its spec, and if not, what changed — without resolving again.

The spec hash says *that* something changed; the comparisons below say *what*: a pin the locked
version no longer satisfies, a requirement added or removed, a source build's version or flags,
the target (Python, platform, cutoff, indexes), a patch's content, the base (for a Debian base:
its suite, mirror, variant and requested packages, from which the pinned set was resolved).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from pydantic import BaseModel

from envbuild.fsio import sha256_file
from envbuild.lock.base import lock_base
from envbuild.lock.model import DebianBaseLock, EnvbuildLock, Lock, LockedPatch
from envbuild.lock.resolvetarget import ResolveTarget, requirements_of
from envbuild.spec.load import LoadedSpec
from envbuild.spec.model import SourceBuild


@dataclass(frozen=True)
class Change:
    """One way the lock differs from the spec. ``kind`` is one of: missing, unreadable, format,
    spec-hash, target, pin, requirement, build, patch, base, edited."""

    kind: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message}


@dataclass
class LockCheck:
    spec: str
    lock: str
    changes: list[Change] = field(default_factory=list)
    #: worth knowing, not stale: e.g. a Debian base whose package set the lock does not pin
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.changes

    def as_dict(self) -> dict[str, object]:
        return {
            "spec": self.spec,
            "lock": self.lock,
            "ok": self.ok,
            "changes": [c.as_dict() for c in self.changes],
            "notes": list(self.notes),
        }


def patch_records(loaded: LoadedSpec) -> dict[str, list[LockedPatch]]:
    out: dict[str, list[LockedPatch]] = {}
    for dist, paths in sorted(loaded.patch_files().items()):
        out[canonicalize_name(dist)] = [
            LockedPatch(path=p.resolve().relative_to(loaded.root).as_posix(), sha256=sha256_file(p))
            for p in paths
        ]
    return out


def compare(loaded: LoadedSpec, lock: Lock, target: ResolveTarget) -> list[Change]:
    """Every difference between ``loaded`` and ``lock``."""
    ours = lock.envbuild
    changes: list[Change] = []
    changes += _target(ours, target)
    changes += _pins(loaded, lock)
    changes += _builds(loaded, ours)
    changes += _patches(loaded, ours)
    changes += _base(loaded, ours)
    spec_hash = loaded.spec_hash()
    if spec_hash != ours.spec_hash:
        detail = "" if changes else " (nothing that changes the resolution; relock to record it)"
        changes.insert(
            0,
            Change(
                "spec-hash",
                f"the spec changed since it was locked: spec hash {spec_hash[:12]} in the "
                f"spec, {ours.spec_hash[:12]} in the lock{detail}",
            ),
        )
    return changes


def _target(ours: EnvbuildLock, target: ResolveTarget) -> list[Change]:
    out = []
    pairs = [
        ("python", target.python, ours.python),
        ("platform", target.platform, ours.platform),
        ("exclude-newer", target.cutoff(), _cutoff(ours)),
        (
            "indexes",
            ", ".join(f"{i.name}={i.url}" for i in target.indexes),
            ", ".join(f"{i.name}={i.url}" for i in ours.indexes),
        ),
    ]
    for what, spec, locked in pairs:
        if spec != locked:
            out.append(Change("target", f"{what}: {spec} in the spec, {locked} in the lock"))
    return out


def _cutoff(ours: EnvbuildLock) -> str:
    return ours.exclude_newer.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _pins(loaded: LoadedSpec, lock: Lock) -> list[Change]:
    out = []
    wanted = {canonicalize_name(Requirement(r).name): r for r in requirements_of(loaded)}
    recorded = {canonicalize_name(Requirement(r).name): r for r in lock.envbuild.requirements}
    for name, text in sorted(wanted.items()):
        req = Requirement(text)
        pkg = lock.package(name)
        if pkg is None:
            out.append(Change("pin", f"{name}: {_shown(req)} in the spec, not in the lock"))
            continue
        try:
            fits = req.specifier.contains(Version(pkg.version), prereleases=True)
        except InvalidVersion:
            fits = False
        if not fits:
            out.append(
                Change("pin", f"{name}: {_shown(req)} in the spec, {pkg.version} in the lock")
            )
        elif recorded.get(name) != text:
            before = recorded.get(name)
            out.append(
                Change(
                    "requirement",
                    f"{name}: requirement {text!r} in the spec, "
                    + (f"{before!r} in the lock" if before else "not asked for in the lock"),
                )
            )
    for name in sorted(set(recorded) - set(wanted)):
        out.append(
            Change(
                "requirement",
                f"{name}: {recorded[name]!r} in the lock, no longer asked for by the spec",
            )
        )
    return out


def _shown(req: Requirement) -> str:
    specs = list(req.specifier)
    if len(specs) == 1 and specs[0].operator in ("==", "==="):
        return specs[0].version
    return str(req.specifier) or "any version"


def _builds(loaded: LoadedSpec, ours: EnvbuildLock) -> list[Change]:
    out = []
    spec: dict[str, SourceBuild] = {canonicalize_name(n): b for n, b in loaded.spec.builds.items()}
    locked = {b.name: b for b in ours.builds}
    for name in sorted(set(spec) | set(locked)):
        s, lk = spec.get(name), locked.get(name)
        if s is None:
            out.append(Change("build", f"{name}: a source build in the lock, not in the spec"))
        elif lk is None:
            out.append(Change("build", f"{name}: a source build in the spec, not in the lock"))
        else:
            if s.version != lk.version:
                out.append(
                    Change("build", f"{name}: {s.version} in the spec, {lk.version} in the lock")
                )
            for key in sorted(set(s.env) | set(lk.env)):
                a, b = s.env.get(key), lk.env.get(key)
                if a != b:
                    out.append(
                        Change(
                            "build",
                            f"{name}: env {key}={a if a is not None else '(unset)'} in the "
                            f"spec, {b if b is not None else '(unset)'} in the lock",
                        )
                    )
    return out


def _patches(loaded: LoadedSpec, ours: EnvbuildLock) -> list[Change]:
    out = []
    spec = patch_records(loaded)
    for dist in sorted(set(spec) | set(ours.patches)):
        now, then = spec.get(dist, []), ours.patches.get(dist, [])
        if now == then:
            continue
        paths_now, paths_then = [p.path for p in now], [p.path for p in then]
        if paths_now != paths_then:
            out.append(
                Change(
                    "patch",
                    f"{dist}: patches {paths_now or 'none'} in the spec, "
                    f"{paths_then or 'none'} in the lock",
                )
            )
        else:
            for a, b in zip(now, then, strict=True):
                if a.sha256 != b.sha256:
                    out.append(Change("patch", f"{dist}: {a.path} changed since it was locked"))
    return out


def _base(loaded: LoadedSpec, ours: EnvbuildLock) -> list[Change]:
    now = lock_base(loaded)
    then = ours.base
    if then is None:
        return [Change("base", f"base: {now.kind} in the spec, none in the lock")]
    if isinstance(now, DebianBaseLock) and isinstance(then, DebianBaseLock):
        # what the package set was resolved from; the set itself is mmdebstrap's answer
        pairs = [
            ("suite", now.suite, then.suite),
            ("mirror", now.mirror, then.mirror),
            ("variant", now.variant, then.variant),
            ("packages", _names(now.include), _names(then.include)),
        ]
        return [
            Change("base", f"base {what}: {a} in the spec, {b} in the lock")
            for what, a, b in pairs
            if a != b
        ]
    if now == then:
        return []
    return [Change("base", f"base: {_base_text(now)} in the spec, {_base_text(then)} in the lock")]


def base_notes(ours: EnvbuildLock) -> list[str]:
    """What is worth saying about a current lock's base."""
    base = ours.base
    if isinstance(base, DebianBaseLock) and not base.packages:
        return [
            "the Debian base's package set is not pinned (locked with --python-only?): "
            "`envbuild build` resolves it against the mirror; `envbuild lock` pins it"
        ]
    return []


def _names(names: list[str]) -> str:
    return "[" + ", ".join(names) + "]"


def _base_text(base: object) -> str:
    if not isinstance(base, BaseModel):
        return str(base)
    data = base.model_dump(exclude={"packages"})
    return " ".join(f"{k}={v}" for k, v in data.items())
