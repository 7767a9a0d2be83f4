"""The ELF reader on hostile bytes: a real shared object cut short or with bytes changed gives
facts, None or BadElf — never another exception, never an unbounded read."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild.linkcheck.elf import BadElf, read_elf
from envbuild.linkcheck.reader import Cache, read_all

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

SOURCE = """
void c10_foo(void) __asm__("_ZN3c103fooEv");
void c10_bar(void) __asm__("_ZN3c103barEv");
int PyInit_ext(void) { c10_foo(); c10_bar(); return 0; }
"""


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    work = tmp_path_factory.mktemp("elf")
    src = work / "x.c"
    src.write_text(SOURCE)
    out = work / "ext.so"
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-Wl,-rpath,$ORIGIN/lib", "-o", str(out), str(src)], check=True
    )
    return out.read_bytes()


def _read(data: bytes) -> object:
    try:
        return read_elf(io.BytesIO(data))
    except BadElf:
        return "bad"


def test_the_sample_reads(sample: bytes) -> None:
    info = read_elf(io.BytesIO(sample))
    assert info is not None and (info.runpath or info.rpath) == ["$ORIGIN/lib"]
    assert {u.name for u in info.undefined} == {"_ZN3c103fooEv", "_ZN3c103barEv"}
    assert "PyInit_ext" in info.exports


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_changed_bytes_never_raise_anything_else(sample: bytes, data: st.DataObject) -> None:
    blob = bytearray(sample)
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(blob) - 1))
        blob[at] = data.draw(st.integers(0, 255))
    _read(bytes(blob))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cut=st.integers(0, 20000))
def test_a_file_cut_short_never_raises_anything_else(sample: bytes, cut: int) -> None:
    _read(sample[: min(cut, len(sample))])


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=512))
def test_arbitrary_bytes_after_the_magic(data: bytes) -> None:
    _read(b"\x7fELF" + data)


def test_the_reader_names_an_unreadable_file(tmp_path: Path, sample: bytes) -> None:
    bad = tmp_path / "libbad.so"
    bad.write_bytes(sample[:100])
    got = read_all({"/x/libbad.so": (str(bad), None)}, cache=Cache(tmp_path / "cache"))
    assert got.elf == {} and "/x/libbad.so" in got.unreadable
    assert got.unreadable["/x/libbad.so"].startswith("not a readable ELF file")
