"""The link check in `envbuild build`: a wheel's extension that needs a library neither the
image's wheels nor its base have stops the build (exit 2), unless the spec accepts it."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import CliResult
from support.project import write_project
from support.wheels import make_wheel, ref

from envbuild.store.core import Store

Build = Callable[..., CliResult]
pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def base_with_libc(repo: Path) -> Path:
    """A merged-/usr rootfs: /lib is a symlink to usr/lib, which holds libc.so.6."""
    path = repo / "libc-rootfs.tar"
    with tarfile.open(path, "w") as tf:
        for d in ("usr", "usr/lib", "usr/lib/x86_64-linux-gnu", "etc"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tf.addfile(info)
        link = tarfile.TarInfo("lib")
        link.type, link.linkname = tarfile.SYMTYPE, "usr/lib"
        tf.addfile(link)
        info = tarfile.TarInfo("usr/lib/x86_64-linux-gnu/libc.so.6")
        info.size, info.mode = 4, 0o755
        tf.addfile(info, io.BytesIO(b"libc"))
    return path


def extension(work: Path) -> bytes:
    """An extension module needing libgone.so.1 (and libc.so.6), built with gcc here."""
    work.mkdir(parents=True, exist_ok=True)
    src = work / "x.c"
    src.write_text("int gone(void) { return 1; }\n")
    cc = ["gcc", "-shared", "-fPIC"]
    subprocess.run([*cc, "-Wl,-soname,libgone.so.1", "-o", str(work / "libgone.so.1"), str(src)],
                   check=True)  # fmt: skip
    src.write_text("int gone(void); int PyInit__fast(void) { return gone(); }\n")
    out = work / "_fast.so"
    subprocess.run([*cc, "-o", str(out), str(src), f"-L{work}", "-l:libgone.so.1"], check=True)
    return out.read_bytes()


def test_a_finding_stops_the_build_unless_the_spec_accepts_it(
    repo: Path, cli: Build, tmp_path: Path
) -> None:
    wheel = make_wheel(
        repo / "wheels",
        "fastext",
        "1.0",
        {
            "fastext/__init__.py": "",
            "fastext/_fast.cpython-311-x86_64-linux-gnu.so": extension(tmp_path / "cc"),
        },
    )
    base = base_with_libc(repo)
    spec = write_project(repo, "links", [ref(wheel)], base=base)
    args = ("build", "--store", repo / "store", "--output", repo / "out")
    result = cli(*args, spec)
    assert result.exit_code == 2, result.stderr
    assert "image links: 1 file will not load" in result.stderr
    assert (
        "fastext: /opt/venv/lib/python3.11/site-packages/fastext/"
        "_fast.cpython-311-x86_64-linux-gnu.so needs libgone.so.1" in result.stderr
    )
    assert "libc.so.6" not in result.stderr  # the base's, through /lib -> usr/lib
    assert '"fastext:libgone.so.1"' in result.stderr
    assert not (repo / "out").exists()

    accepted = write_project(
        repo,
        "links",
        [ref(wheel)],
        '[image.link_findings]\n"fastext:libgone.so.1" = "loaded only by a test that never runs"\n',
        base=base,
    )
    result = cli(*args, accepted)
    assert result.exit_code == 0, result.stderr
    store = Store(repo / "store")
    kinds = [store.lookup(k).kind for k in store.derivations()]  # type: ignore[union-attr]
    assert kinds.count("links") == 1  # the same wheels and base: the report is reused


def test_a_fresh_build_reads_no_wheel_member_in_its_links_stage(
    repo: Path, cli: Build, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The layers stage put the members' facts in the link-check cache from its staging
    trees: the links stage inflates nothing, and reports what reading the wheels reports."""
    from envbuild.linkcheck import zipread

    reads: list[str] = []
    real = zipread.read_member

    def counting(f, zf, info, limit):  # type: ignore[no-untyped-def]
        reads.append(info.filename)
        return real(f, zf, info, limit)

    monkeypatch.setattr(zipread, "read_member", counting)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    wheel = make_wheel(
        repo / "wheels",
        "fastext",
        "1.0",
        {
            "fastext/__init__.py": "",
            "fastext/_fast.cpython-311-x86_64-linux-gnu.so": extension(tmp_path / "cc"),
        },
    )
    spec = write_project(
        repo,
        "links",
        [ref(wheel)],
        '[image.link_findings]\n"fastext:libgone.so.1" = "loaded only by a test that never runs"\n',
        base=base_with_libc(repo),
    )
    args = ("build", "--store", repo / "store", "--output", repo / "out")
    assert cli(*args, spec).exit_code == 0
    assert reads == []
    store = Store(repo / "store")
    (key,) = [k for k in store.derivations() if store.lookup(k).kind == "links"]  # type: ignore[union-attr]
    staged = store.lookup(key).outputs["report"]  # type: ignore[union-attr]
    # the same check from the wheels: the links derivation and the link-check cache forgotten
    (repo / "store" / "drv" / f"{key}.json").unlink()
    shutil.rmtree(tmp_path / "xdg" / "envbuild" / "linkcheck")
    assert cli(*args, spec).exit_code == 0
    assert reads == ["fastext/_fast.cpython-311-x86_64-linux-gnu.so"]
    assert store.lookup(key).outputs["report"] == staged  # type: ignore[union-attr]
    assert b"libgone.so.1" in store.read_blob(staged)
