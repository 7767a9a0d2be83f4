"""The link check's rules on small shared objects built with gcc here: RUNPATH with $ORIGIN, a
driver library, versioned symbols, a missing library, missing torch symbols, plugins."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from envbuild.linkcheck.core import Report, check_folder, demangle
from envbuild.linkcheck.elf import read_elf
from envbuild.linkcheck.reader import Cache

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")

SITE = "venv/lib/python3.11/site-packages"


def cc(out: Path, source: str, *args: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_suffix(out.suffix + ".c")
    src.write_text(source)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(out), str(src), *args],
        check=True,
        capture_output=True,
    )
    src.unlink()
    return out


def record(site: Path, dist: str, version: str, *paths: str) -> None:
    info = site / f"{dist}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "RECORD").write_text("".join(f"{p},,\n" for p in paths))


C10_V1 = "C10_1 { global: *; };\n"
C10_SRC = """
void c10_foo(void) __asm__("_ZN3c103fooEv");
void c10_foo(void) {}
"""
C10_BAR = """
void c10_bar(void) __asm__("_ZN3c103barEv");
void c10_bar(void) {}
"""


def make_torch(site: Path, *, with_bar: bool, version_script: str | None = None) -> Path:
    lib = site / "torch" / "lib"
    args = []
    if version_script:
        script = lib / "c10.map"
        lib.mkdir(parents=True, exist_ok=True)
        script.write_text(version_script)
        args = [f"-Wl,--version-script={script}"]
    so = cc(
        lib / "libc10.so", C10_SRC + (C10_BAR if with_bar else ""), "-Wl,-soname,libc10.so", *args
    )
    record(site, "torch", "2.14.0", "torch/lib/libc10.so")
    return so


EXT_SRC = """
void c10_foo(void) __asm__("_ZN3c103fooEv");
void c10_bar(void) __asm__("_ZN3c103barEv");
int PyInit_ext(void) { c10_foo(); c10_bar(); return 0; }
"""


def check(tmp: Path, **kw: object) -> Report:
    return check_folder(
        str(tmp),
        "/venv",
        system_root="/",
        cache=Cache(tmp / "cache"),
        **kw,  # type: ignore[arg-type]
    )


def test_runpath_origin_resolves_and_a_removed_library_is_named(tmp_path: Path) -> None:
    site = tmp_path / SITE
    dep = cc(
        site / "pkg" / "libs" / "libdep.so.1",
        "int dep(void) { return 1; }",
        "-Wl,-soname,libdep.so.1",
    )
    ext = site / "pkg" / "ext.cpython-311-x86_64-linux-gnu.so"
    cc(
        ext,
        "int dep(void); int PyInit_ext(void) { return dep(); }",
        f"-L{dep.parent}",
        "-l:libdep.so.1",
        "-Wl,--enable-new-dtags,-rpath,$ORIGIN/libs",
    )
    record(site, "pkg", "1.0", "pkg/ext.cpython-311-x86_64-linux-gnu.so", "pkg/libs/libdep.so.1")
    with ext.open("rb") as f:
        info = read_elf(f)
    assert info is not None and info.runpath == ["$ORIGIN/libs"] and "libdep.so.1" in info.needed
    assert check(tmp_path).findings == []

    dep.unlink()
    report = check(tmp_path)
    [finding] = report.findings
    assert finding.kind == "library" and finding.missing == ("libdep.so.1",)
    assert finding.dist == "pkg" and finding.file.endswith(
        "pkg/ext.cpython-311-x86_64-linux-gnu.so"
    )
    assert finding.looked_in[0] == "/venv/lib/python3.11/site-packages/pkg/libs"
    assert finding.id == "pkg:libdep.so.1"
    # a spec accepts it by that id, with a reason
    accepted = check(tmp_path, accept={"pkg:libdep.so.1": "loaded by hand"})
    assert accepted.findings == [] and accepted.accepted[0][1] == "loaded by hand"


def test_a_driver_library_is_provided_by_the_host(tmp_path: Path) -> None:
    stub = tmp_path / "stubs" / "libcuda.so.1"
    cc(stub, "int cuInit(unsigned f) { return 0; }", "-Wl,-soname,libcuda.so.1")
    site = tmp_path / SITE
    cc(
        site / "pkg" / "ext.so",
        "int cuInit(unsigned); int PyInit_ext(void) { return cuInit(0); }",
        f"-L{stub.parent}",
        "-l:libcuda.so.1",
    )
    shutil.rmtree(stub.parent)
    assert check(tmp_path).findings == []


def test_a_newer_cuda_major_is_the_cause(tmp_path: Path) -> None:
    site = tmp_path / SITE
    cudart = tmp_path / "stubs" / "libcudart.so.12"
    cc(cudart, "int cudaFree(void *p) { return 0; }", "-Wl,-soname,libcudart.so.12")
    cc(
        site / "nvidia" / "cu13" / "lib" / "libcudart.so.13",
        "int cudaFree(void *p) { return 0; }",
        "-Wl,-soname,libcudart.so.13",
    )
    cc(
        site / "old" / "_C.abi3.so",
        "int cudaFree(void *); int PyInit__C(void) { return cudaFree(0); }",
        f"-L{cudart.parent}",
        "-l:libcudart.so.12",
    )
    shutil.rmtree(cudart.parent)
    [finding] = check(tmp_path).findings
    assert finding.missing == ("libcudart.so.12",)
    assert "built against CUDA 12" in finding.cause and "libcudart.so.13" in finding.cause


def test_missing_torch_symbols_are_named_demangled(tmp_path: Path) -> None:
    site = tmp_path / SITE
    make_torch(site, with_bar=True)
    ext = site / "old" / "_C.abi3.so"
    cc(ext, EXT_SRC, f"-L{site / 'torch' / 'lib'}", "-lc10")
    record(site, "old", "0.3+pt24cu121", "old/_C.abi3.so")
    assert check(tmp_path).findings == []

    make_torch(site, with_bar=False)  # the locked torch no longer has c10::bar()
    [finding] = check(tmp_path).findings
    assert finding.kind == "symbols" and finding.missing == ("_ZN3c103barEv",)
    assert finding.demangled == ("c10::bar()",)
    assert finding.looked_in == ("/venv/lib/python3.11/site-packages/torch/lib/libc10.so",)
    assert "locked 2.14.0" in finding.cause and "pt24cu121" in finding.cause
    assert finding.id == "old:symbols"


def test_a_versioned_reference_needs_that_version(tmp_path: Path) -> None:
    site = tmp_path / SITE
    make_torch(site, with_bar=True, version_script="C10_2 { global: *; };\n")
    cc(site / "old" / "_C.abi3.so", EXT_SRC, f"-L{site / 'torch' / 'lib'}", "-lc10")
    with (site / "old" / "_C.abi3.so").open("rb") as f:
        info = read_elf(f)
    assert info is not None
    assert {(u.name, u.version) for u in info.undefined} >= {("_ZN3c103barEv", "C10_2")}
    assert check(tmp_path).findings == []

    make_torch(site, with_bar=True, version_script=C10_V1)  # same names, another version
    [finding] = check(tmp_path).findings
    assert set(finding.missing) == {"_ZN3c103barEv", "_ZN3c103fooEv"}


def test_a_plugin_no_import_loads_is_optional(tmp_path: Path) -> None:
    site = tmp_path / SITE
    gone = tmp_path / "stubs" / "libibverbs.so.1"
    cc(gone, "int ibv(void) { return 0; }", "-Wl,-soname,libibverbs.so.1")
    cc(
        site / "nvidia" / "lib" / "libplugin_rdma.so.1",
        "int ibv(void); int go(void) { return ibv(); }",
        f"-L{gone.parent}",
        "-l:libibverbs.so.1",
    )
    shutil.rmtree(gone.parent)
    report = check(tmp_path)
    assert report.findings == []
    [optional] = report.optional
    assert optional.missing == ("libibverbs.so.1",) and not optional.loaded


def test_the_cache_answers_the_second_time_and_survives_damage(tmp_path: Path) -> None:
    site = tmp_path / SITE
    make_torch(site, with_bar=False)
    cc(site / "old" / "_C.abi3.so", EXT_SRC, f"-L{site / 'torch' / 'lib'}", "-lc10")
    first = check(tmp_path)
    assert first.cache_misses == 2 and first.cache_hits == 0
    second = check(tmp_path)
    assert second.cache_hits == 2 and second.cache_misses == 0
    assert [f.as_dict() for f in second.findings] == [f.as_dict() for f in first.findings]
    for entry in (tmp_path / "cache").rglob("*.json"):
        if "stat" not in entry.parts:
            entry.write_bytes(entry.read_bytes()[:10])  # cut short
    third = check(tmp_path)
    assert third.cache_misses == 2
    assert [f.as_dict() for f in third.findings] == [f.as_dict() for f in first.findings]


def test_a_changed_file_is_read_again(tmp_path: Path) -> None:
    site = tmp_path / SITE
    make_torch(site, with_bar=True)
    cc(site / "old" / "_C.abi3.so", EXT_SRC, f"-L{site / 'torch' / 'lib'}", "-lc10")
    assert check(tmp_path).findings == []
    make_torch(site, with_bar=False)  # new bytes, same path: the stat memo must not answer
    assert [f.missing for f in check(tmp_path).findings] == [("_ZN3c103barEv",)]


def test_demangle_keeps_what_cxxfilt_cannot_read() -> None:
    assert demangle(["_ZN3c103barEv", "plain"]) == ["c10::bar()", "plain"]
