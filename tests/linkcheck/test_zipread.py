"""A wheel member read straight from the zip (:mod:`envbuild.linkcheck.zipread`): what
``ZipFile.read`` gives, and on a cut-short, changed or lying wheel a clean
:class:`zipfile.BadZipFile` or the right bytes, never another exception, and never more memory
than the member states."""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envbuild.errors import InputFileError
from envbuild.installed.venv import VenvTarget
from envbuild.linkcheck.reader import Cache
from envbuild.linkcheck.wheels import Wheel, wheel_entries
from envbuild.linkcheck.zipread import read_member

BODY = b"\x7fELF" + os.urandom(3000) + bytes(5000) + b"tail" * 200


def wheel_bytes(body: bytes = BODY, method: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("pkg/x.py", b"x = 1\n", zipfile.ZIP_DEFLATED)
        zf.writestr("pkg/_a.so", body, method)
    return buf.getvalue()


def read(data: bytes, name: str = "pkg/_a.so", limit: int = 1 << 20) -> bytes | str:
    """The member's bytes, or "bad" for a clean error (any other exception fails the test)."""
    f = io.BytesIO(data)
    try:
        with zipfile.ZipFile(f) as zf:
            return read_member(f, zf, zf.getinfo(name), limit)
    except (zipfile.BadZipFile, KeyError):  # KeyError: the name is not in the directory
        return "bad"


def zipfile_read(data: bytes, name: str = "pkg/_a.so") -> bytes | str:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            return zf.read(name)
    except Exception:  # zipfile's own errors are many: any of them is "bad"
        return "bad"


@pytest.mark.parametrize("method", [zipfile.ZIP_DEFLATED, zipfile.ZIP_STORED, zipfile.ZIP_BZIP2])
def test_a_member_reads_as_zipfile_reads_it(method: int) -> None:
    data = wheel_bytes(method=method)
    assert read(data) == BODY == zipfile_read(data)
    assert read(data, "pkg/x.py") == b"x = 1\n"


def test_an_empty_member_and_the_limit() -> None:
    assert read(wheel_bytes(b"")) == b""
    assert read(wheel_bytes(), limit=len(BODY) - 1) == "bad"
    assert read(wheel_bytes(), limit=len(BODY)) == BODY


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_changed_bytes_give_the_bytes_or_a_clean_error(data: st.DataObject) -> None:
    """Bytes changed anywhere (headers, the deflate stream, the directory): the result is the
    member's bytes as zipfile reads them, or a clean error, never a traceback."""
    blob = bytearray(wheel_bytes())
    for _ in range(data.draw(st.integers(1, 6))):
        blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    got = read(bytes(blob))
    if got != "bad":
        assert got == zipfile_read(bytes(blob))


@settings(max_examples=100, deadline=None)
@given(cut=st.integers(0, len(wheel_bytes()) - 1), method=st.sampled_from([0, 8]))
def test_a_wheel_cut_short_is_a_clean_error(cut: int, method: int) -> None:
    assert read(wheel_bytes(method=method)[:cut]) == "bad"


@settings(max_examples=100, deadline=None)
@given(
    size=st.integers(0, 1 << 40),
    packed=st.integers(0, 1 << 20),
    crc=st.integers(0, 0xFFFFFFFF),
    flags=st.integers(0, 0xFFFF),
)
def test_a_directory_that_lies_is_the_bytes_or_a_clean_error(
    size: int, packed: int, crc: int, flags: int
) -> None:
    """The central directory's sizes, CRC and flags as a hostile wheel states them: the right
    bytes or BadZipFile, and a stated size beyond what deflate can make of the compressed bytes
    is refused before anything is inflated (the limit is far above what the test can hold)."""
    data = wheel_bytes()
    f = io.BytesIO(data)
    with zipfile.ZipFile(f) as zf:
        info = zf.getinfo("pkg/_a.so")
        true = (info.file_size, info.compress_size, info.CRC)
        info.file_size, info.compress_size, info.CRC = size, packed, crc
        info.flag_bits = flags & ~0x1  # encrypted: zipfile's own reader, which asks a password
        try:
            got = read_member(f, zf, info, 1 << 50)
        except zipfile.BadZipFile:
            return
    assert got == BODY and (size, packed, crc) == true


def test_a_deflate_bomb_is_bounded() -> None:
    """A member that inflates to more than it states stops at one byte over, then errors."""
    f = io.BytesIO(wheel_bytes(bytes(64 << 20)))
    with zipfile.ZipFile(f) as zf:
        info = zf.getinfo("pkg/_a.so")
        info.file_size = 1000  # a lie: the stream makes 64 MiB
        with pytest.raises(zipfile.BadZipFile):
            read_member(f, zf, info, 1 << 30)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_a_hostile_wheel_through_the_check_is_exit_2(
    tmp_path_factory: pytest.TempPathFactory, data: st.DataObject
) -> None:
    """The whole path (the map, then the worker's read): a changed deflated wheel gives
    entries or :class:`InputFileError` (exit 2 naming the wheel), nothing else."""
    tmp: Path = tmp_path_factory.mktemp("w")
    blob = bytearray(wheel_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    wheel = tmp / "pkg-1.0-py3-none-any.whl"
    wheel.write_bytes(bytes(blob))
    try:
        entries, _, _ = wheel_entries(
            [Wheel("pkg", "1.0", wheel, "0" * 64)], VenvTarget(), tmp / "work", Cache(None)
        )
    except InputFileError as exc:
        assert "pkg-1.0-py3-none-any.whl" in str(exc)
        return
    for path, _key in entries.values():
        if path is not None:  # not a readable ELF file: written out, as zipfile reads it
            assert Path(path).read_bytes() == zipfile_read(bytes(blob))


def test_a_process_that_keeps_its_heap_reads_the_same() -> None:
    """keep_heap (in a process of its own: it is for the rest of the process) changes where
    buffers come from, not what is read."""
    import subprocess
    import sys

    code = (
        "import sys; from tests.linkcheck import test_zipread as t;"
        "from envbuild.linkcheck.zipread import keep_heap; kept = keep_heap();"
        "assert all(t.read(t.wheel_bytes(b * 40000)) == b * 40000 for b in (b'ab', b'\\x00'));"
        "print(kept)"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() in ("True", "False")  # False: not glibc, nothing changed
