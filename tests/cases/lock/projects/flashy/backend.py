"""A PEP 517 backend that can only make an sdist.

The sdist carries PKG-INFO with Metadata-Version 2.1 (so no installer may trust it without a
build) declaring ``torch`` and ``beta``. Building a wheel, or preparing its metadata, fails: a
lock that tries it fails with the message below.
"""

import io
import tarfile

NAME, VERSION = "flashy", "1.0.0"
PKG_INFO = f"""\
Metadata-Version: 2.1
Name: {NAME}
Version: {VERSION}
Summary: an sdist-only test distribution (stands in for flash-attn)
Requires-Python: >=3.8
Requires-Dist: torch
Requires-Dist: beta
"""
REFUSAL = "flashy: this sdist must not be built at lock time"


def build_sdist(sdist_directory, config_settings=None):
    filename = f"{NAME}-{VERSION}.tar.gz"
    with open(__file__, "rb") as f:
        backend = f.read()
    members = {
        "PKG-INFO": PKG_INFO.encode(),
        "backend.py": backend,
        "pyproject.toml": PYPROJECT.encode(),
    }
    with tarfile.open(f"{sdist_directory}/{filename}", "w:gz") as tar:
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(f"{NAME}-{VERSION}/{name}")
            info.size, info.mtime, info.mode = len(data), 1700000000, 0o644
            tar.addfile(info, io.BytesIO(data))
    return filename


def get_requires_for_build_wheel(config_settings=None):
    raise RuntimeError(REFUSAL)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    raise RuntimeError(REFUSAL)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    raise RuntimeError(REFUSAL)


PYPROJECT = """\
[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]
"""
