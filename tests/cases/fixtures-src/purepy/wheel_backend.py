"""A minimal PEP 517 backend: packs src/ into a pure-Python wheel (no network, no setuptools)."""

import base64
import hashlib
import zipfile
from pathlib import Path

NAME, VERSION = "fixture_pure", "2.1.0"
HERE = Path(__file__).parent
DIST_INFO = f"{NAME}-{VERSION}.dist-info"


def _record(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    files = {
        p.relative_to(HERE / "src").as_posix(): p.read_bytes()
        for p in sorted((HERE / "src").rglob("*.py"))
    }
    files[f"{DIST_INFO}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: fixture-pure\nVersion: {VERSION}\n\nA patch fixture.\n"
    ).encode()
    files[f"{DIST_INFO}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: wheel_backend\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [_record(n, d) for n, d in files.items()] + [f"{DIST_INFO}/RECORD,,"]
    files[f"{DIST_INFO}/RECORD"] = ("\n".join(record) + "\n").encode()
    name = f"{NAME}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(Path(wheel_directory) / name, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in files.items():
            zf.writestr(zipfile.ZipInfo(member, (1980, 1, 1, 0, 0, 0)), data)
    return name


def build_sdist(sdist_directory, config_settings=None):
    raise NotImplementedError("the tests pack this fixture themselves")
