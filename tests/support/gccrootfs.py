"""A Debian bookworm rootfs tarball with Python and gcc (mmdebstrap, minbase): the base of the
builder-container tests. Made once per session, and kept between sessions under
``$XDG_CACHE_HOME/envbuild-tests/`` (a few minutes on 2 cores; CI starts without it)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from support.mmdebstrap import need_mmdebstrap

PACKAGES = ("g++", "gcc", "libc6-dev", "python3", "python3-dev")
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"


def _cache_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "envbuild-tests"


@pytest.fixture(scope="session")
def gcc_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tarball's path (``--include`` of :data:`PACKAGES`)."""
    recipe = f"{SUITE} minbase {','.join(PACKAGES)} {MIRROR}"
    name = f"rootfs-{hashlib.sha256(recipe.encode()).hexdigest()[:12]}.tar"
    cached = _cache_dir() / name
    if cached.is_file():
        return cached
    need_mmdebstrap()
    work = tmp_path_factory.mktemp("gcc-rootfs")
    out = work / name
    argv = ["mmdebstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES)]
    argv += ["--quiet", SUITE, str(out), MIRROR]
    env = {**os.environ, "SOURCE_DATE_EPOCH": "0", "TMPDIR": str(work)}
    subprocess.run(argv, check=True, env=env, capture_output=True)
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(".tmp")
        shutil.copyfile(out, tmp)
        tmp.replace(cached)
        return cached
    except OSError:
        return out
