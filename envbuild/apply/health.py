"""Waiting for vLLM to answer ``GET /health`` with 200."""

from __future__ import annotations

import http.client
import logging
import time
import urllib.error
import urllib.request

from envbuild.apply.services import ServiceManager
from envbuild.errors import ServiceFailed

log = logging.getLogger(__name__)


def health_url(host: str, port: int) -> str:
    connect = "127.0.0.1" if host in ("0.0.0.0", "", "::", "[::]") else host
    if ":" in connect and not connect.startswith("["):
        connect = f"[{connect}]"
    return f"http://{connect}:{port}/health"


def probe(url: str, timeout: float = 5.0) -> int | None:
    """The status ``url`` answers with, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, http.client.HTTPException, OSError):
        return None


def wait_healthy(
    url: str,
    services: ServiceManager,
    unit: str,
    *,
    timeout: float,
    interval: float = 0.5,
) -> float:
    """Poll ``url`` until it answers 200; returns the seconds it took. Raises
    :class:`ServiceFailed` with the unit's last log lines when the unit crashes or time runs out."""
    start = time.monotonic()
    deadline = start + timeout
    last: int | None = None
    log.info("waiting up to %.0f s for %s", timeout, url)
    while True:
        last = probe(url)
        if last == 200:
            took = time.monotonic() - start
            log.info("%s is healthy after %.1f s", unit, took)
            return took
        state = services.state(unit)
        if state.crashed or not state.running:
            raise ServiceFailed(
                f"{unit} stopped before it became healthy (state {state.active}"
                + (f"/{state.sub}" if state.sub else "")
                + ")",
                log_tail=services.logs(unit),
            )
        if time.monotonic() >= deadline:
            said = f"last answer: HTTP {last}" if last is not None else "nothing answered"
            raise ServiceFailed(
                f"{unit} did not become healthy within {timeout:.0f} s ({url}: {said})",
                log_tail=services.logs(unit),
                hint="a large model can take long to load: raise --health-timeout",
            )
        time.sleep(interval)
