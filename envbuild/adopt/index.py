"""What an index publishes of one distribution at one version: its wheels and sdist.

Input: an index's simple URL (PyPI's, or the one the user names) and a distribution's name and
version. Output: the :class:`Published` files of that version, each with its URL, size, sha256
and upload time, read from the project page in its PEP 691 JSON form (PEP 700 sizes and upload
times). Pages are fetched through :func:`envbuild.lock.index.open_url` (envbuild's User-Agent,
``$SSL_CERT_FILE``), a few at a time.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from envbuild.errors import EnvironmentFailure
from envbuild.lock.index import open_url

JSON_TYPE = "application/vnd.pypi.simple.v1+json"
PYPI = "https://pypi.org/simple"
WORKERS = 4


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None
    size: int | None
    upload_time: datetime | None


@dataclass(frozen=True)
class Published:
    """The files of ``name`` ``version`` on the index (none: not published there)."""

    name: str
    version: str
    wheels: list[IndexFile] = field(default_factory=list)
    sdist: IndexFile | None = None


def _same_version(a: str, b: str) -> bool:
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def parse_page(page: dict[str, object], page_url: str, name: str, version: str) -> Published:
    """The files of ``version`` on a PEP 691 project page. Yanked files count: the environment
    may hold a release yanked since, and an exact pin still installs it (PEP 592)."""
    wheels: list[IndexFile] = []
    sdist: IndexFile | None = None
    files = page.get("files")
    for entry in files if isinstance(files, list) else []:
        if not isinstance(entry, dict):
            continue
        filename = str(entry.get("filename", ""))
        hashes = entry.get("hashes")
        sha = hashes.get("sha256") if isinstance(hashes, dict) else None
        size = entry.get("size")
        found = IndexFile(
            filename,
            urllib.parse.urljoin(page_url, str(entry.get("url", ""))),
            str(sha) if sha else None,
            size if isinstance(size, int) else None,
            _time(entry.get("upload-time")),
        )
        try:
            if filename.endswith(".whl"):
                _n, v, _b, _t = parse_wheel_filename(filename)
                if _same_version(str(v), version):
                    wheels.append(found)
            else:
                _n, v = parse_sdist_filename(filename)
                if _same_version(str(v), version) and sdist is None:
                    sdist = found
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
    return Published(
        canonicalize_name(name), version, sorted(wheels, key=lambda f: f.filename), sdist
    )


def published(index_url: str, name: str, version: str) -> Published:
    """What ``index_url`` (a simple index) publishes of ``name`` ``version``. A project the index
    does not have is :class:`Published` with no files; an index that cannot be reached is
    :class:`EnvironmentFailure`."""
    page_url = f"{index_url.rstrip('/')}/{canonicalize_name(name)}/"
    try:
        with open_url(page_url, accept=JSON_TYPE) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return Published(canonicalize_name(name), version)
        raise EnvironmentFailure(
            f"the index answered HTTP {exc.code} for {page_url}",
            hint="check --index and the network",
        ) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
        raise EnvironmentFailure(
            f"cannot reach the index at {page_url}: {getattr(exc, 'reason', exc)}",
            hint="check --index and the network (HTTPS goes through $https_proxy)",
        ) from None
    try:
        page = json.loads(body)
    except ValueError:
        raise EnvironmentFailure(
            f"{page_url} is not a PEP 691 JSON project page",
            hint="name a simple index that serves JSON (PyPI's https://pypi.org/simple does)",
        ) from None
    if not isinstance(page, dict):
        raise EnvironmentFailure(f"{page_url} is not a PEP 691 JSON project page")
    return parse_page(page, page_url, name, version)


def published_all(index_url: str, dists: Iterable[tuple[str, str]]) -> dict[str, Published]:
    """:func:`published` of every ``(name, version)``, by canonical name, a few at a time."""
    wanted = sorted(set(dists))
    with ThreadPoolExecutor(WORKERS) as pool:
        found = list(pool.map(lambda d: published(index_url, d[0], d[1]), wanted))
    return {p.name: p for p in found}
