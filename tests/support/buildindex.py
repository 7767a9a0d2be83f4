"""A local package index holding what the source-build fixtures need to build (setuptools and
wheel, fetched from PyPI once per session), served on 127.0.0.1: source builds in tests then
reach no other index, on the host or in a builder container on the host's network."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest

from support import pyindex

#: What tests/cases/fixtures-src/cext's [build-system] asks for, pinned.
BACKEND = ("setuptools==75.8.0", "wheel==0.45.1")
UPLOADED = datetime(2024, 6, 1, tzinfo=UTC)  # before the test locks' exclude-newer


@pytest.fixture(scope="session")
def build_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a simple index serving setuptools and wheel (marks its users ``network``)."""
    root = tmp_path_factory.mktemp("build-index")
    download = root / "download"
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    argv += ["--only-binary=:all:", "--dest", str(download), *BACKEND]
    if cert := os.environ.get("SSL_CERT_FILE"):
        argv += ["--cert", cert]
    subprocess.run(argv, check=True, capture_output=True)
    files = [(p, "simple", UPLOADED) for p in sorted(download.iterdir())]
    pyindex.write_index(root / "index", files)
    with pyindex.serve(root / "index") as url:
        yield f"{url}/simple"
