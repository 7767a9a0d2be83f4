"""`envbuild build` on a broken or hostile rootfs base: exit 2 with one line naming the file and
what is wrong, never an internal error (these were `internal error: EOFError` and exit 3)."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import tarfile
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import CliResult
from support.project import write_project

Build = Callable[..., CliResult]


def _tar() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        info = tarfile.TarInfo("etc/hostname")
        data = b"x\n" * 4000
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _half(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _bad_crc() -> bytes:
    data = bytearray(gzip.compress(_tar(), mtime=0))
    data[-8] ^= 0xFF
    return bytes(data)


def _link_then_below() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        link = tarfile.TarInfo("lnk")
        link.type, link.linkname = tarfile.SYMTYPE, "/tmp"
        tf.addfile(link)
        tf.addfile(tarfile.TarInfo("lnk/x"), io.BytesIO(b""))
    return gzip.compress(buf.getvalue(), mtime=0)


def _zip(size: int) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("etc/hostname", "x" * size)
    return buf.getvalue()


#: Each was "is truncated (a header is cut short …)" or "has a corrupt tar header": now the
#: message says what the file is.
NOT_TARS = [
    ("small-zip.tar", _zip(10), "is not a tar archive: it holds a zip archive"),
    ("zip.tar", _zip(5000), "is not a tar archive: it holds a zip archive"),
    ("twice.tar.gz", gzip.compress(gzip.compress(_tar(), mtime=0), mtime=0), "holds gzip data"),
    ("xz-in-gz.tar.gz", gzip.compress(lzma.compress(_tar()), mtime=0), "holds xz data"),
    ("page.tar", b"<!DOCTYPE html>\n<html><body>Not Found</body></html>\n", "an HTML page"),
    ("notes.tar", b"just some notes\n" * 40, "it holds plain text"),
    ("seven.tar", b"7z\xbc\xaf\x27\x1c\x00\x04" + bytes(40), "it holds a 7z archive"),
    ("bz.tar.gz", gzip.compress(bz2.compress(_tar()), mtime=0), "holds bzip2 data"),
]


@pytest.mark.parametrize(
    ("name", "data", "needle"),
    [
        *NOT_TARS,
        ("cut.tar.gz", _half(gzip.compress(_tar(), mtime=0)), "is truncated or corrupt (gzip"),
        ("cut.tar.xz", _half(lzma.compress(_tar())), "is truncated or corrupt (xz"),
        ("crc.tar.gz", _bad_crc(), "is truncated or corrupt (gzip: CRC check failed"),
        ("evil.tar.gz", _link_then_below(), "lies below 'lnk', which is a symlink"),
    ],
)
def test_a_bad_base_is_a_user_error(
    repo: Path, cli: Build, name: str, data: bytes, needle: str
) -> None:
    base = repo / name
    base.write_bytes(data)
    spec = write_project(repo, "bad-base", [], base=base)
    result = cli("build", "--store", repo / "store", "--output", repo / "out", spec)
    assert result.exit_code == 2, result.stderr
    assert f"{name}: " in result.stderr and needle in result.stderr, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
