"""Real venvs for the snapshot tests: tiny wheels built here, installed by real pip and real uv.

``alpha`` (installed by pip) plays vLLM: it has a model file a debugging session edits. ``beta``
(installed by uv) ships a file at the same path as alpha (``shared/common.py``) with other bytes,
like cuda-bindings and cuda-python do in a vLLM venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.wheels import make_wheel

from envbuild.proc import core as proc

ALPHA_FILES = {
    "alpha/__init__.py": "VERSION = '1.0'\n",
    "alpha/models/__init__.py": "",
    "alpha/models/llama.py": ("def forward(x):\n    h = x * 2\n    return h + 1\n"),
    "shared/common.py": "OWNER = 'alpha'\n",
}
BETA_FILES = {
    "beta/__init__.py": "X = 1\n",
    "shared/common.py": "OWNER = 'beta'  # beta's bytes\n",
}


@pytest.fixture(scope="session")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("wheels")
    make_wheel(d, "alpha", "1.0", ALPHA_FILES)
    make_wheel(d, "alpha", "2.0", {**ALPHA_FILES, "alpha/__init__.py": "VERSION = '2.0'\n" * 50})
    make_wheel(d, "beta", "1.0", BETA_FILES)
    return d


def _env() -> dict[str, str]:
    return proc.child_env({"UV_PYTHON_DOWNLOADS": "never", "PIP_DISABLE_PIP_VERSION_CHECK": "1"})


def pip_install(venv: Path, *args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "-q", "--no-index", "--no-deps", *args],
        check=True, env=_env(),
    )  # fmt: skip


def uv_install(venv: Path, *args: str) -> None:
    subprocess.run(
        [proc.find_uv(), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), *args],
        check=True, env=_env(),
    )  # fmt: skip


@pytest.fixture(scope="session")
def base_venv(tmp_path_factory: pytest.TempPathFactory, wheelhouse: Path) -> Path:
    """alpha by pip, then beta by uv (beta's shared/common.py wins): built once, copied per test."""
    venv = tmp_path_factory.mktemp("base") / "venv"
    subprocess.run(
        [proc.find_uv(), "venv", "-q", "-p", sys.executable, str(venv)], check=True, env=_env()
    )
    pip_install(venv, str(wheelhouse / "alpha-1.0-py3-none-any.whl"))
    uv_install(venv, "--offline", "--no-deps", str(wheelhouse / "beta-1.0-py3-none-any.whl"))
    return venv


@pytest.fixture
def venv(base_venv: Path, tmp_path: Path) -> Path:
    """A private copy of the base venv (symlinks kept, so its python still works)."""
    copy = tmp_path / "venv"
    shutil.copytree(base_venv, copy, symlinks=True)
    cfg = copy / "pyvenv.cfg"
    cfg.write_text(cfg.read_text().replace(str(base_venv), str(copy)))
    return copy


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python*/site-packages"))
    assert len(found) == 1, found
    return found[0]


def later(path: Path) -> None:
    """Make sure an edit's mtime is after the install's (coarse file-system clocks)."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000_000))
