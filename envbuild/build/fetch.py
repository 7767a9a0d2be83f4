"""The fetch stage: each locked wheel downloaded once into the store, checked against the lock.

A wheel's blob is named by the sha256 the lock promises. The download streams into a temporary
file in the store while hashing; only bytes whose size and sha256 match are renamed into place,
so a killed or failed download leaves no blob under a wrong name. ``file://`` URLs (a local
wheel index) are read the same way. Ctrl-C drops the downloads not started and stops those under
way at their next chunk.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from envbuild import progress
from envbuild.errors import EnvironmentFailure, IntegrityError
from envbuild.lock.index import open_url
from envbuild.lock.wheels import WheelRef
from envbuild.store.core import Store

log = logging.getLogger(__name__)

CHUNK = 1 << 20
RETRIES = 3
WORKERS = 4


def fetch_wheels(
    wheels: Sequence[WheelRef],
    store: Store,
    *,
    workers: int = WORKERS,
) -> dict[str, Path]:
    """Every wheel's blob path, by sha256, downloading the ones the store lacks."""
    wanted = {w.sha256: w for w in wheels}
    out: dict[str, Path] = {}
    missing: list[WheelRef] = []
    for sha, wheel in sorted(wanted.items()):
        digest = f"sha256:{sha}"
        path = store.blob_path(digest)
        if path.is_file() and path.stat().st_size == wheel.size and store.check_blob(digest):
            out[sha] = path
        else:
            if path.is_file():
                log.warning(
                    "%s in the store is corrupt (%s); fetching it again", wheel.filename, digest
                )
                store.drop_blob(digest)
            missing.append(wheel)
    if not missing:
        return out
    total = sum(w.size for w in missing)
    log.info("downloading %d wheel(s), %.1f MB", len(missing), total / 1e6)
    stop = threading.Event()
    with (
        progress.task(f"download {len(missing)} wheels", total) as task,
        ThreadPoolExecutor(max_workers=max(1, workers)) as pool,
    ):
        errors: list[Exception] = []
        try:
            futures = [
                pool.submit(_fetch_one, w, store, task.advance, stop)
                for w in _largest_first(missing)
            ]
            for fut in futures:
                try:
                    sha, path = fut.result()
                    out[sha] = path
                except Exception as exc:  # a download's failure: the others still finish
                    errors.append(exc)
        except BaseException:  # Ctrl-C here: the pool's exit would wait for every download
            stop.set()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        if errors:
            raise errors[0]
    return out


def _largest_first(wheels: list[WheelRef]) -> list[WheelRef]:
    return sorted(wheels, key=lambda w: (-w.size, w.filename))


def _fetch_one(
    wheel: WheelRef, store: Store, advance: Callable[[int], None], stop: threading.Event
) -> tuple[str, Path]:
    dest = store.blob_path(f"sha256:{wheel.sha256}")
    for attempt in range(1, RETRIES + 1):
        done = 0
        try:
            return wheel.sha256, _download(wheel, store, dest, advance, stop)
        except _Transient as exc:
            done = exc.done
            if attempt == RETRIES:
                raise EnvironmentFailure(
                    f"downloading {wheel.filename} failed: {exc.reason}",
                    hint=f"check that {_host(wheel.url)} is reachable (proxy, $SSL_CERT_FILE), "
                    "then rerun: finished downloads are kept",
                ) from None
            log.warning("%s: %s; retrying (%d/%d)", wheel.filename, exc.reason, attempt, RETRIES)
            advance(-done)
            time.sleep(attempt)
    raise AssertionError("unreachable")


class _Stopped(Exception):
    """The download was stopped (Ctrl-C in the caller): its temporary blob is discarded."""


class _Transient(Exception):
    def __init__(self, reason: str, done: int) -> None:
        super().__init__(reason)
        self.reason = reason
        self.done = done


def _host(url: str) -> str:
    return urllib.parse.urlparse(url).netloc or url


def _download(
    wheel: WheelRef,
    store: Store,
    dest: Path,
    advance: Callable[[int], None],
    stop: threading.Event,
) -> Path:
    try:
        response = open_url(wheel.url)
    except urllib.error.HTTPError as exc:
        if exc.code >= 500 or exc.code == 429:
            raise _Transient(f"HTTP {exc.code} {exc.reason}", 0) from None
        raise EnvironmentFailure(
            f"downloading {wheel.filename} failed: HTTP {exc.code} {exc.reason} ({wheel.url})",
            hint="the lock names a file the index no longer serves; relock with `envbuild lock`",
        ) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise _Transient(str(getattr(exc, "reason", exc)), 0) from None
    with response, store.blob_writer() as w:
        while True:
            if stop.is_set():
                raise _Stopped(wheel.filename)
            try:
                chunk = response.read(CHUNK)
            except (TimeoutError, ConnectionError, OSError) as exc:
                raise _Transient(str(exc), w.size) from None
            if not chunk:
                break
            w.write(chunk)
            advance(len(chunk))
            if w.size > wheel.size:
                break
        if w.size != wheel.size or w.hexdigest() != wheel.sha256:
            raise IntegrityError(
                f"{wheel.filename}: got {w.size} bytes with sha256 {w.hexdigest()}, the lock "
                f"promises {wheel.size} bytes with sha256 {wheel.sha256}",
                hint=f"{_host(wheel.url)} served other bytes than when the lock was made; "
                "check the index or proxy, or relock",
            )
    log.debug("fetched %s (%d bytes)", wheel.filename, w.size)
    return dest
