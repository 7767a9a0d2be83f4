"""`envbuild ci`: what a CI job does with every spec — check its lock is current, build its image,
push it, and write a markdown summary.

Each spec is taken on its own: a stale lock or a failed build is reported in the summary and in
the exit code, and the other specs still run. The lock is checked before anything is built (a
build from a stale lock would not be the image the spec describes). Pushing goes through
:func:`envbuild.registry.core.push_image`, so the summary says how many of each image's blobs the
registry already had. With a remote cache the store is a
:class:`~envbuild.store.remote.CachedStore`:
layers and source builds another machine made are pulled, not rebuilt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from envbuild.errors import EnvbuildError, ExitCode, UsageError
from envbuild.oci.blobs import verify_layout
from envbuild.oci.layout import open_layout
from envbuild.registry.api import Endpoint
from envbuild.registry.core import get_transport, push_image
from envbuild.registry.ref import ImageRef
from envbuild.registry.transport import Transport
from envbuild.spec import LoadedSpec, load_spec
from envbuild.store.core import Store

log = logging.getLogger(__name__)


class BuildOutput(Protocol):
    """What the CI needs of a build's result (:class:`envbuild.pipeline.core.ImageBuild`)."""

    @property
    def output(self) -> Path | None: ...
    @property
    def reused(self) -> list[str]: ...
    @property
    def rebuilt(self) -> list[str]: ...


BuildFn = Callable[[LoadedSpec, Store], BuildOutput]


def default_build(loaded: LoadedSpec, store: Store) -> BuildOutput:
    from envbuild.pipeline.core import build

    return build(loaded, store=store)


def default_check(loaded: LoadedSpec) -> list[str]:
    """What changed since the lock was written (empty: the lock is current)."""
    from envbuild.lock.core import check_lock

    return [c.message for c in check_lock(loaded).changes]


@dataclass
class SpecOutcome:
    spec: str  # as given on the command line
    name: str | None = None
    lock: str = "not checked"  # "current", "stale", "not checked"
    lock_changes: list[str] = field(default_factory=list)
    image: str | None = None  # manifest digest
    size: int | None = None  # bytes of manifest, config and layers
    layers_reused: int = 0
    layers_new: int = 0
    pushed: str | None = None  # REGISTRY/REPO:TAG
    blobs_uploaded: int = 0
    blobs_skipped: int = 0
    bytes_uploaded: int = 0
    bytes_skipped: int = 0
    error: list[str] = field(default_factory=list)
    exit_code: int = ExitCode.OK

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class CiReport:
    outcomes: list[SpecOutcome]
    cache: dict[str, Any] | None = None

    @property
    def exit_code(self) -> int:
        return max((o.exit_code for o in self.outcomes), default=ExitCode.OK)

    def as_dict(self) -> dict[str, Any]:
        return {
            "specs": [o.as_dict() for o in self.outcomes],
            "cache": self.cache,
            "exit_code": self.exit_code,
        }


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")


def summary_markdown(report: CiReport) -> str:
    """The summary table (stable: no times, no host paths)."""
    lines = [
        "# envbuild images",
        "",
        "| spec | lock | image digest | size | layers reused | layers new | pushed |",
        "|---|---|---|---|---:|---:|---|",
    ]
    for o in report.outcomes:
        digest = f"`{o.image}`" if o.image else "—"
        size = human_size(o.size) if o.size is not None else "—"
        if o.pushed:
            pushed = (
                f"`{o.pushed}`: {o.blobs_uploaded} blobs uploaded "
                f"({human_size(o.bytes_uploaded)}), {o.blobs_skipped} already there "
                f"({human_size(o.bytes_skipped)})"
            )
        else:
            pushed = "—"
        built = o.image is not None
        reused = str(o.layers_reused) if built else "—"
        new = str(o.layers_new) if built else "—"
        lines.append(
            f"| {o.name or o.spec} | {o.lock} | {digest} | {size} | {reused} | {new} | {pushed} |"
        )
    problems = [o for o in report.outcomes if o.error or o.lock_changes]
    if problems:
        lines += ["", "## Problems", ""]
        for o in problems:
            for text in o.lock_changes + o.error:
                lines.append(f"- **{o.name or o.spec}**: {text}")
    if report.cache is not None:
        c = report.cache
        lines += [
            "",
            f"Remote cache: {len(c['hits'])} derivations pulled, {len(c['published'])} "
            f"published, {len(c['misses'])} not in the cache.",
        ]
        if c.get("unreachable"):
            lines.append(f"The cache did not answer ({c['unreachable']}): built without it.")
    return "\n".join(lines) + "\n"


def _layout_dir(result: BuildOutput) -> Path:
    out = result.output
    if out is None:
        raise UsageError("the build wrote no image")
    for candidate in (out, out / "oci"):
        if (candidate / "oci-layout").is_file():
            return candidate
    raise UsageError(f"{out}: the build left no OCI image layout there")


def _one(
    path: Path,
    outcome: SpecOutcome,
    *,
    store: Store,
    push: ImageRef | None,
    endpoint: Endpoint,
    transport: Callable[[], Transport],
    build_fn: BuildFn,
    check_fn: Callable[[LoadedSpec], list[str]],
) -> None:
    loaded = load_spec(path)
    outcome.name = loaded.name
    changes = check_fn(loaded)
    outcome.lock = "stale" if changes else "current"
    if changes:
        outcome.lock_changes = changes
        outcome.exit_code = ExitCode.DIFFERENT
        log.warning("%s: the lock is not current; not building it", loaded.name)
        return
    log.info("%s: lock current; building", loaded.name)
    result = build_fn(loaded, store)
    outcome.layers_reused, outcome.layers_new = len(result.reused), len(result.rebuilt)
    image = open_layout(_layout_dir(result))
    verify_layout(image)
    outcome.image, outcome.size = image.manifest.digest, image.size
    if push is None:
        return
    target = push.with_tag(loaded.name)
    pushed = push_image(image, target, endpoint=endpoint, transport=transport())
    outcome.pushed = pushed.ref
    outcome.blobs_uploaded, outcome.blobs_skipped = len(pushed.uploaded), len(pushed.skipped)
    outcome.bytes_uploaded, outcome.bytes_skipped = pushed.bytes_uploaded, pushed.bytes_skipped


def run_ci(
    specs: Sequence[Path],
    *,
    store: Store,
    push: ImageRef | None = None,
    endpoint: Endpoint | None = None,
    transport: Transport | None = None,
    build_fn: BuildFn = default_build,
    check_fn: Callable[[LoadedSpec], list[str]] = default_check,
) -> CiReport:
    """Check, build and (with ``push``, a ``REGISTRY/REPO``) push every spec; images are tagged
    with the spec's name. ``store`` may be a :class:`~envbuild.store.remote.CachedStore`."""
    endpoint = endpoint or Endpoint()
    chosen: list[Transport] = [transport] if transport else []

    def get() -> Transport:
        if not chosen:
            chosen.append(get_transport())
        return chosen[0]

    outcomes: list[SpecOutcome] = []
    for path in specs:
        outcome = SpecOutcome(spec=str(path))
        outcomes.append(outcome)
        try:
            _one(
                Path(path), outcome, store=store, push=push, endpoint=endpoint,
                transport=get, build_fn=build_fn, check_fn=check_fn,
            )  # fmt: skip
        except EnvbuildError as exc:
            outcome.error = exc.lines()
            outcome.exit_code = exc.exit_code
            log.error("%s: %s", outcome.name or outcome.spec, exc.message)
    remote = getattr(store, "remote", None)
    cache = remote.stats.as_dict() if remote is not None else None
    return CiReport(outcomes, cache)


def discover_specs(root: Path) -> list[Path]:
    """Every experiment spec of a repository: ``specs/*.toml`` (not the shared bases below)."""
    found = sorted((root / "specs").glob("*.toml"))
    if not found:
        raise UsageError(f"no specs found in {root / 'specs'}", hint="name the specs to build")
    return found
