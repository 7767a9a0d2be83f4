"""How envbuild asks a package index for a file: one :func:`open_url` (its User-Agent, TLS that
trusts ``$SSL_CERT_FILE``), used by the lock's closure reader, the build's wheel fetch and adopt's
index pages."""

from __future__ import annotations

import os
import ssl
import urllib.request
from typing import Any

from envbuild import __version__


def _context() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=os.environ.get("SSL_CERT_FILE") or None)


def open_url(url: str, *, timeout: float = 60, accept: str | None = None) -> Any:
    """A response for ``url`` as envbuild asks for files of an index: its User-Agent, and TLS
    that trusts ``$SSL_CERT_FILE`` (a proxy's CA) when set; ``accept``: the Accept header (an
    index page's PEP 691 JSON form). Raises what ``urlopen`` raises."""
    headers = {"User-Agent": f"envbuild/{__version__}"}
    if accept:
        headers["Accept"] = accept
    request = urllib.request.Request(url, headers=headers)
    return urllib.request.urlopen(request, timeout=timeout, context=_context())
