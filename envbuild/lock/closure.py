"""The build closure: which locked packages a source build's venv installs, pinned.

A build venv holds the build requirements (:data:`EXTRA_REQUIRES` and the sdist's own) and the
locked torch, with their dependencies. :func:`build_closure` finds the lock's pins of those, and
only those are a source build's ``constraints`` (an input of its key, and the build venv's
``--constraint``), so bumping a package no build can see rebuilds nothing. The lock records no
dependencies (uv's pylock.toml has none): they come from the locked wheels' own METADATA
(:func:`wheel_requires`), recorded in the lock at lock time (:func:`locked_requires` reads them
back). Input: a :class:`~envbuild.lock.model.Lock`; output: ``name==version ; marker`` lines.
"""

from __future__ import annotations

import logging
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from packaging.metadata import parse_email
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from envbuild import scratch
from envbuild.errors import EnvironmentFailure, IntegrityError, ManifestError
from envbuild.fsio import atomic_writer, sha256_file
from envbuild.lock.index import open_url
from envbuild.lock.model import Lock
from envbuild.lock.wheels import WheelRef, marker_env, select_wheels

log = logging.getLogger(__name__)

#: Reads a locked wheel's ``Requires-Dist`` (:func:`wheel_requires`; tests pass their own).
RequiresOf = Callable[[WheelRef], list[str]]
#: Build requirements beyond the sdist's ``[build-system]``: flash-attn has none declared.
EXTRA_REQUIRES: dict[str, list[str]] = {
    "flash-attn": ["ninja", "packaging", "psutil", "setuptools", "wheel"],
}


def build_roots(dist: str, torch: bool) -> list[str]:
    """What a build venv is asked to install before the sdist's own ``[build-system]
    requires`` are known: envbuild's extra build requirements, and the locked torch when ``torch``
    (the lock holds one)."""
    roots = list(EXTRA_REQUIRES.get(canonicalize_name(dist), []))
    return [*roots, "torch"] if torch else roots


def build_closure(lock: Lock, roots: Sequence[str], requires_of: RequiresOf) -> list[str]:
    """The lock's pins (``name==version ; marker``) of ``roots`` and everything they depend on,
    sorted: the locked packages a build venv holding ``roots`` installs, and so the only ones a
    build can see. Dependencies come from each locked wheel's ``Requires-Dist`` (the lock does
    not record them), markers evaluated for the lock's target; a name the lock does not hold is
    not followed (uv resolves it at build time, under the lock's exclude-newer)."""
    if not roots:
        return []
    built = frozenset(canonicalize_name(b.name) for b in lock.envbuild.builds)
    wheels = {w.canonical: w for w in select_wheels(lock, skip=built)}
    env = marker_env(lock.envbuild.python, lock.envbuild.platform)
    seen: set[tuple[str, str]] = set()
    todo = [(_requirement(r, "the build requirements"), "") for r in roots]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({**env, "extra": extra}):
            continue
        name = canonicalize_name(req.name)
        for wanted in ("", *sorted(req.extras)):
            if (name, wanted) in seen or name not in wheels:
                continue
            seen.add((name, wanted))
            wheel = wheels[name]
            todo += [(_requirement(r, wheel.filename), wanted) for r in requires_of(wheel)]
    names = {n for n, _ in seen}
    return sorted(
        f"{p.name}=={p.version}" + (f" ; {p.marker}" if p.marker else "")
        for p in lock.packages
        if canonicalize_name(p.name) in names
    )


def locked_requires(lock: Lock) -> RequiresOf:
    """A wheel's ``Requires-Dist`` as the lock recorded it (format 3), so keying a source build
    needs no index; from the wheel's METADATA (:func:`wheel_requires`) when it recorded none."""
    recorded = lock.envbuild.requires

    def read(wheel: WheelRef) -> list[str]:
        found = recorded.get(wheel.sha256)
        return list(found) if found is not None else wheel_requires(wheel)

    return read


def closures(lock: Lock, dists: Iterable[str], requires_of: RequiresOf) -> dict[str, list[str]]:
    """Each source build's ``constraints`` (:func:`build_closure` of its :func:`build_roots`), by
    distribution; ``requires_of`` is asked once per wheel."""
    torch = lock.package("torch") is not None
    read = _memo(requires_of)
    return {
        canonicalize_name(d): build_closure(lock, build_roots(d, torch), read)
        for d in sorted(dists)
    }


def wheel_requires(wheel: WheelRef) -> list[str]:
    """A locked wheel's ``Requires-Dist``, from its own METADATA: PEP 658's ``<url>.metadata``
    when the index serves it, else the wheel itself (a ``file://`` URL, or downloaded), checked
    against the lock's sha256 first. What came from an index is kept by the wheel's sha256 in
    ``$XDG_CACHE_HOME/envbuild/wheel-metadata`` (a wheel's metadata never changes), so it is
    read once per machine."""
    url = urllib.parse.urlparse(wheel.url)
    if url.scheme in ("file", ""):
        return _requires(_zip_metadata(Path(urllib.request.url2pathname(url.path)), wheel), wheel)
    cache = (
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "envbuild"
        / "wheel-metadata"
        / f"{wheel.sha256}.metadata"
    )
    if cache.is_file():
        return _requires(cache.read_bytes(), wheel)
    data = _http(wheel.url + ".metadata", wheel, optional=True)
    if data is None:
        log.info("%s: the index serves no METADATA file; reading the wheel", wheel.filename)
        with scratch.temp_dir("wheel-") as tmp:
            path = Path(tmp) / wheel.filename
            _http(wheel.url, wheel, into=path)
            data = _zip_metadata(path, wheel)
    with atomic_writer(cache) as f:
        f.write(data)
    return _requires(data, wheel)


def _http(
    url: str, wheel: WheelRef, *, optional: bool = False, into: Path | None = None
) -> bytes | None:
    """``url``'s body (streamed ``into`` a file when given: a wheel can be gigabytes); None for
    an ``optional`` file the index does not have."""
    try:
        with open_url(url, timeout=120) as response:
            if into is None:
                data: bytes = response.read()
                return data
            with into.open("wb") as f:
                shutil.copyfileobj(response, f, 1 << 20)
            return b""
    except urllib.error.HTTPError as exc:
        if optional and 400 <= exc.code < 500:
            return None
        reason: object = f"HTTP {exc.code} {exc.reason}"
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
    raise EnvironmentFailure(
        f"cannot read the dependencies of {wheel.filename} from {url}: {reason}",
        hint="a source build's key holds the locked packages its build venv installs, found from "
        "the locked wheels' METADATA; check the network (proxy, $SSL_CERT_FILE) and rerun",
    )


def _zip_metadata(path: Path, wheel: WheelRef) -> bytes:
    if sha256_file(path) != wheel.sha256:
        raise IntegrityError(
            f"{wheel.filename}: sha256 {sha256_file(path)}, the lock promises {wheel.sha256}",
            hint="the index serves other bytes than when the lock was made; relock",
        )
    name = canonicalize_name(wheel.name)
    try:
        with zipfile.ZipFile(path) as zf:
            member = next(
                (
                    n
                    for n in zf.namelist()
                    if n.count("/") == 1
                    and n.endswith(".dist-info/METADATA")
                    and canonicalize_name(n.split("-", 1)[0]) == name
                ),
                None,
            )
            if member is None:
                raise EnvironmentFailure(f"{wheel.filename} has no .dist-info/METADATA")
            return zf.read(member)
    except (zipfile.BadZipFile, OSError) as exc:
        raise EnvironmentFailure(f"{wheel.filename} is not a readable wheel: {exc}") from None


def _requires(data: bytes, wheel: WheelRef) -> list[str]:
    raw, _ = parse_email(data)
    return [str(r) for r in raw.get("requires_dist", [])]


def _requirement(text: str, whose: str) -> Requirement:
    try:
        return Requirement(text)
    except InvalidRequirement as exc:
        raise ManifestError(f"{whose}: bad requirement {text!r}: {exc}") from None


def _memo(read: RequiresOf) -> RequiresOf:
    done: dict[str, list[str]] = {}

    def get(wheel: WheelRef) -> list[str]:
        if wheel.sha256 not in done:
            done[wheel.sha256] = read(wheel)
        return done[wheel.sha256]

    return get
