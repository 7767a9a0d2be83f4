"""Resolving a spec's Python side with uv.

uv runs as ``uv pip compile`` on a temporary project written from the spec and writes PEP 751
(``--format pylock.toml``); its packages, file URLs, sizes and sha256 digests are taken as they
are and parsed into :class:`~envbuild.lock.model.LockedPackage`. Nothing the user configured can
change the answer: uv runs in :func:`envbuild.proc.core.uv_env` (no configuration files, no ``UV_*``
variable that steers resolution, Python never downloaded), and the target (Python version,
platform, cutoff, indexes) is passed explicitly.

Nothing is built at lock time. Every distribution must come as a wheel (``--only-binary
:all:``), except the spec's source builds, which are locked as sdists (``--no-binary NAME``)
with their dependencies given to uv statically (``dependency-metadata``, read from the sdist's
PKG-INFO by :mod:`envbuild.lock.sdist`), so uv never runs their setup.py.
"""

from __future__ import annotations

import logging
import tomllib
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from pydantic import ValidationError

from envbuild import scratch
from envbuild.errors import EnvironmentFailure, ResolutionFailed, ToolFailed
from envbuild.hints import failure_hint
from envbuild.lock.model import Hashes, LockedBuild, LockedFile, LockedPackage
from envbuild.lock.resolvetarget import ResolveTarget, build_names, expand_url, requirements_of
from envbuild.lock.sdist import SdistMetadata, sdist_metadata
from envbuild.proc import core as proc
from envbuild.spec.load import LoadedSpec

log = logging.getLogger(__name__)

#: Packages that must come from the spec's torch index when it has one (and the spec asks for
#: them directly): their CUDA variant must match torch's.
TORCH_FAMILY = ("torch", "torchaudio", "torchvision")

_PACKAGE_KEYS = frozenset({"name", "version", "marker", "requires-python", "wheels", "sdist"})
_TIMEOUT = 1800.0


@dataclass(frozen=True)
class Resolution:
    packages: list[LockedPackage]
    builds: list[LockedBuild]


def resolve(loaded: LoadedSpec, target: ResolveTarget) -> Resolution:
    """Resolve ``loaded`` for ``target``. Raises :class:`ResolutionFailed` (a user error) when uv
    proves the requirements unsatisfiable, :class:`ToolFailed` for any other uv failure."""
    requirements = requirements_of(loaded)
    builds = build_names(loaded)
    versions: dict[str, str] = {
        canonicalize_name(n): b.version for n, b in loaded.spec.builds.items()
    }
    label = loaded.display(loaded.path)
    metadata: dict[str, SdistMetadata] = {}
    sdists: dict[str, LockedFile] = {}
    if builds:
        log.info("locating the sdists of the source builds: %s", ", ".join(builds))
        wanted = [r for r in requirements if canonicalize_name(Requirement(r).name) in builds]
        empty = {b: SdistMetadata([], None) for b in builds}
        found = _compile(target, wanted, builds, versions, empty, label, no_deps=True)
        for name in builds:
            pkg = next((p for p in found if p.name == name), None)
            if pkg is None or pkg.sdist is None:
                raise ResolutionFailed(
                    f"{label}: source build {name}=={versions[name]} has no sdist on the index",
                    "",
                    hint="a source build needs an sdist; check the version in [builds]",
                )
            sdists[name] = pkg.sdist
            metadata[name] = sdist_metadata(pkg.sdist)
    log.info(
        "resolving %d requirements for Python %s on %s (exclude-newer %s)",
        len(requirements),
        target.python,
        target.platform,
        target.cutoff(),
    )
    packages = _compile(target, requirements, builds, versions, metadata, label, no_deps=False)
    locked_builds = []
    for name in builds:
        pkg = next((p for p in packages if p.name == name), None)
        if pkg is None or pkg.sdist != sdists[name]:
            raise EnvironmentFailure(
                f"uv resolved source build {name} to another file than the one it located first",
                hint="the index changed during the lock; run it again",
            )
        env = next(b.env for n, b in loaded.spec.builds.items() if canonicalize_name(n) == name)
        locked_builds.append(
            LockedBuild(
                name=name,
                version=pkg.version,
                sdist=sdists[name],
                env=dict(sorted(env.items())),
                requires_dist=metadata[name].requires_dist,
            )
        )
    return Resolution(packages, locked_builds)


def _compile(
    target: ResolveTarget,
    requirements: Sequence[str],
    builds: Sequence[str],
    versions: Mapping[str, str],
    metadata: Mapping[str, SdistMetadata],
    label: str,
    *,
    no_deps: bool,
) -> list[LockedPackage]:
    with scratch.temp_dir("lock-") as tmp:
        work = Path(tmp)
        _write_project(work, target, requirements)
        _write_config(work, versions, metadata)
        argv: list[proc.Arg] = [
            proc.find_uv(),
            "pip",
            "compile",
            "pyproject.toml",
            "--config-file",
            "uv.toml",
            "--format",
            "pylock.toml",
            "--output-file",
            "pylock.toml",
            "--no-header",
            "--color",
            "never",
            "--no-progress",
            f"--python-version={target.python}",
            f"--python-platform={target.uv_platform()}",
            f"--exclude-newer={target.cutoff()}",
            "--index-strategy",
            "first-index",
            "--only-binary",
            ":all:",
        ]
        default, *extras = [expand_url(i.url) for i in target.indexes if i.name != "torch"]
        # spec values as --opt=value, never read as an option of their own; a URL holding a
        # secret stays one redacted argument after its option (its grammar starts it http/file)
        argv += proc.option("--default-index", default)
        for index in extras:
            argv += proc.option("--index", index)
        argv += [f"--no-binary={name}" for name in builds]
        if no_deps:
            argv.append("--no-deps")
        done = proc.run(argv, tool="uv", cwd=work, env=proc.uv_env(), check=False, timeout=_TIMEOUT)
        secrets: list[str | proc.Secret] = [a for a in argv if isinstance(a, proc.Secret)]
        if target.torch_index:
            secrets.append(expand_url(target.torch_index))
        said = _explanation(done.stderr, secrets)
        if done.returncode != 0:
            if "No solution found" in said or "unsatisfiable" in said:
                raise ResolutionFailed(
                    f"{label}: the requirements cannot be satisfied; uv says:",
                    said,
                    hint=f"change the pins in {label} (or its resolution.exclude_newer)",
                )
            raise ToolFailed(
                "uv",
                done.argv,
                done.returncode,
                said,
                hint=failure_hint(done.returncode, said)
                or "check the network and the index URLs in the spec; rerun with -v for uv's log",
            )
        for line in said.splitlines():
            log.debug("uv: %s", line)
        return parse_pylock((work / "pylock.toml").read_text(encoding="utf-8"), target)


def _explanation(stderr: str, secrets: Sequence[str | proc.Secret] = ()) -> str:
    """uv's stderr without the notice that it builds nothing with the host's Python, and with
    the expanded value of every secret index URL redacted."""
    keep = [
        line
        for line in stderr.rstrip().splitlines()
        if not line.startswith("warning: The requested Python version")
    ]
    text = "\n".join(keep)
    for secret in secrets:
        if isinstance(secret, proc.Secret):
            text = text.replace(secret.reveal(), str(secret))
    return text


def _write_project(work: Path, target: ResolveTarget, requirements: Sequence[str]) -> None:
    project: dict[str, Any] = {
        "project": {"name": "envbuild-lock-target", "version": "0", "dependencies": requirements}
    }
    if target.torch_index:
        names = {canonicalize_name(Requirement(r).name) for r in requirements}
        sources = {n: {"index": "torch"} for n in TORCH_FAMILY if n in names}
        url = expand_url(target.torch_index)
        project["tool"] = {
            "uv": {
                "sources": sources,
                "index": [{"name": "torch", "url": _reveal(url), "explicit": True}],
            }
        }
    (work / "pyproject.toml").write_text(tomli_w.dumps(project), encoding="utf-8")


def _write_config(
    work: Path, versions: Mapping[str, str], metadata: Mapping[str, SdistMetadata]
) -> None:
    entries = []
    for name, meta in sorted(metadata.items()):
        entry: dict[str, Any] = {
            "name": name,
            "version": versions[name],
            "requires-dist": meta.requires_dist,
        }
        if meta.requires_python:
            entry["requires-python"] = meta.requires_python
        entries.append(entry)
    config = {"dependency-metadata": entries} if entries else {}
    (work / "uv.toml").write_text(tomli_w.dumps(config), encoding="utf-8")


def _reveal(value: str | proc.Secret) -> str:
    return value.reveal() if isinstance(value, proc.Secret) else value


# --- uv's pylock.toml -> our packages --------------------------------------------------------


def parse_pylock(text: str, target: ResolveTarget) -> list[LockedPackage]:
    """The packages of a pylock.toml that uv wrote, with file names filled in, credentials
    stripped from URLs, the index noted where it is certain, and a stable order."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise EnvironmentFailure(f"uv wrote a pylock.toml that is not TOML: {exc}") from None
    non_torch = [i.url for i in target.indexes if i.name != "torch"]
    out = []
    for entry in raw.get("packages", []):
        unknown = set(entry) - _PACKAGE_KEYS
        name = canonicalize_name(str(entry.get("name", "?")))
        if unknown:
            raise EnvironmentFailure(
                f"uv locked {name} in a form envbuild does not handle "
                f"({', '.join(sorted(unknown))})",
                hint="lock only index packages: no direct URL, path or VCS requirements",
            )
        index = None
        if target.torch_index and name in TORCH_FAMILY:
            index = target.torch_index
        elif len(non_torch) == 1:
            index = non_torch[0]
        try:
            out.append(
                LockedPackage(
                    name=name,
                    version=str(entry["version"]),
                    marker=entry.get("marker"),
                    requires_python=entry.get("requires-python"),
                    index=index,
                    sdist=_file(entry["sdist"], name) if "sdist" in entry else None,
                    wheels=sorted(
                        (_file(w, name) for w in entry.get("wheels", [])), key=lambda f: f.name
                    ),
                )
            )
        except (KeyError, ValidationError) as exc:
            raise EnvironmentFailure(
                f"uv's entry for {name} cannot be read as a locked package: {exc}"
            ) from None
    return sorted(out, key=lambda p: (p.name, p.version))


def _file(entry: dict[str, Any], package: str) -> LockedFile:
    url = entry.get("url")
    if not isinstance(url, str):
        raise EnvironmentFailure(
            f"uv locked a file of {package} without a URL ({entry.get('path', '?')})",
            hint="lock against an index (a simple API URL), not a local directory",
        )
    name = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
    sha256 = entry.get("hashes", {}).get("sha256")
    if not sha256 or "size" not in entry:
        missing = "a sha256" if not sha256 else "a size"
        raise EnvironmentFailure(
            f"the index lists {name} without {missing}; envbuild locks every file with both",
            hint="use an index that serves PEP 691 JSON with hashes and sizes (PyPI does)",
        )
    return LockedFile(
        name=name,
        url=_strip_credentials(url),
        size=entry["size"],
        upload_time=entry.get("upload-time"),
        hashes=Hashes(sha256=sha256),
    )


def _strip_credentials(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if not (parts.username or parts.password):
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=host))
