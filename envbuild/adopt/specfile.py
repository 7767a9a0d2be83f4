"""The adopted spec as TOML, the files adopt writes, and the serving unit it reads.

Input: the tables the other stages found. Output: ``specs/<name>.toml`` (validated by
:func:`envbuild.spec.validate.validate` before it takes its place), ``patches/<name>/<dist>.patch``
and the lock (:func:`envbuild.lock.core.lock_spec`, envbuild's own lock stage: uv resolves the pins
against the index). Nothing else is written. A spec that does not validate (the environment does
not fit together by the knowledge base: a GGUF model without the plugin, say) is written but not
locked, and its problems (file, line, key, fix) are the error; patch files of an earlier adopt of
this name that are no longer needed are removed from ``patches/<name>/``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w

from envbuild.errors import EnvironmentFailure, InputFileError, UsageError
from envbuild.fsio import write_atomic
from envbuild.lock.core import LockResult, lock_path, lock_spec
from envbuild.snapshot import systemd
from envbuild.snapshot.redact import Redactor
from envbuild.spec.validate import validate

if TYPE_CHECKING:
    from envbuild.adopt.builds import Rebuild

HEADER = (
    "# Adopted by `envbuild adopt` from a hand-built environment: every distribution pinned at\n"
    "# its installed version, hand edits as declared patches. Edit it like any spec, then\n"
    "# relock with `envbuild lock`.\n"
)


@dataclass(frozen=True)
class Outputs:
    repo: Path
    name: str

    @property
    def spec(self) -> Path:
        return self.repo / "specs" / f"{self.name}.toml"

    @property
    def lock(self) -> Path:
        return self.repo / "lockfiles" / f"pylock.{self.name}.toml"

    @property
    def patch_dir(self) -> Path:
        return self.repo / "patches" / self.name

    def patch(self, dist: str) -> Path:
        return self.patch_dir / f"{dist}.patch"

    def patch_ref(self, dist: str) -> str:
        """The patch's path as the spec names it (relative to the spec's folder)."""
        return os.path.relpath(self.patch(dist), self.spec.parent).replace(os.sep, "/")

    def shown(self, path: Path) -> str:
        return path.relative_to(self.repo).as_posix()

    def check(self, force: bool) -> None:
        if self.spec.exists() and not force:
            raise UsageError(
                f"{self.shown(self.spec)} exists already",
                hint="pass --name for another spec, or --force to replace it",
            )

    def write(self, spec: dict[str, Any], patches: dict[str, str]) -> LockResult:
        """The patches, then the spec (once it validates), then its lock."""
        self.spec.parent.mkdir(parents=True, exist_ok=True)
        if self.patch_dir.is_dir():
            for old in self.patch_dir.glob("*.patch"):
                if old.stem not in patches:
                    old.unlink()
        for dist, text in sorted(patches.items()):
            self.patch_dir.mkdir(parents=True, exist_ok=True)
            write_atomic(self.patch(dist), text)
        write_atomic(self.spec, HEADER + tomli_w.dumps(spec))
        # a spec the stack checks refuse (the hand-built environment does not fit together) is
        # kept, so its problems name lines the user can fix; it is not locked
        loaded = validate(self.spec, root=self.repo).loaded
        assert lock_path(loaded) == self.lock
        return lock_spec(loaded)


def spec_data(  # noqa: PLR0913
    *,
    name: str,
    python: dict[str, Any],
    base: dict[str, Any],
    host: dict[str, Any] | None,
    cuda: dict[str, Any] | None,
    pinned: list[tuple[str, str]],
    builds: dict[str, Rebuild],
    patches: dict[str, str],
    serve: dict[str, Any] | None,
    model: dict[str, Any] | None,
    index_url: str,
    cutoff: datetime,
) -> dict[str, Any]:
    """The spec's tables, in the order docs/spec.md gives them."""
    spec: dict[str, Any] = {
        "name": name,
        "description": f"adopted from a hand-built Python {python['version']} environment",
    }
    if host:
        spec["host"] = host
    if cuda:
        spec["cuda"] = cuda
    spec["base"] = base
    spec["python"] = python
    versions = dict(pinned)
    if "vllm" in versions:
        spec["vllm"] = {"version": versions.pop("vllm")}
    if builds:
        spec["builds"] = {
            n: {"version": b.version, **({"env": b.env} if b.env else {})}
            for n, b in sorted(builds.items())
        }
    if versions:
        spec["packages"] = {n: f"=={v}" for n, v in sorted(versions.items())}
    if patches:
        spec["patches"] = {d: [ref] for d, ref in sorted(patches.items())}
    if model:
        spec["model"] = model
    if serve:
        spec["serve"] = serve
    spec["resolution"] = {"exclude_newer": cutoff, "index_url": index_url}
    return spec


def read_unit(unit: str) -> tuple[list[str], dict[str, str]]:
    """``ExecStart``'s argv and the ``Environment`` of a unit: a unit file, or a unit systemd
    runs (``systemctl show``). Secrets are redacted as the snapshot redacts them."""
    redactor = Redactor()
    path = Path(unit)
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputFileError(path, f"cannot read the unit file: {exc}") from None
        argv: list[str] = []
        env: dict[str, str] = {}
        for line in text.splitlines():
            key, sep, value = line.strip().partition("=")
            if not sep:
                continue
            if key == "ExecStart" and not argv:
                argv = systemd.parse_exec_start(value.lstrip("-@+!:"))
            elif key == "Environment":
                env.update(systemd.parse_environment(value))
        if not argv:
            raise InputFileError(path, "has no ExecStart=", hint="name the vLLM unit's file")
        return redactor.argv("unit", argv), redactor.environment("unit", env)
    section = systemd.read_units(unit, redactor)
    if not section.available:
        raise EnvironmentFailure(
            f"cannot read the unit {unit}: {section.reason}",
            hint="run on the machine whose systemd runs it, or pass the unit file's path",
        )
    for service in section.units:
        if service.unit in (unit, f"{unit}.service") and service.exec_start:
            return service.exec_start, service.environment
    raise UsageError(f"--unit {unit}: systemd has no such unit with an ExecStart")
