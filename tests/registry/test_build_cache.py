"""`envbuild build --cache`: two stores sharing a loopback registry as their build cache. The
second machine compiles nothing: the source build, the patched wheel, the base and every layer
come from the cache (gcc runs there only to tell its version, which is part of the key)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import CliResult
from support.buildindex import build_index  # noqa: F401
from support.project import write_project
from support.registry import Registry
from support.sdists import FIXTURES, pack_sdist
from support.wheels import make_wheel, ref

pytestmark = [pytest.mark.registry, pytest.mark.network]

Build = Callable[..., CliResult]
PATCH = """\
--- a/tinypatch/__init__.py
+++ b/tinypatch/__init__.py
@@ -1 +1 @@
-GREETING = "as released"
+GREETING = "patched"
"""


def recording_cc(folder: Path, name: str) -> tuple[Path, Path]:
    """A C compiler that writes each of its command lines to a file, then runs the real one."""
    real = shutil.which(name)
    assert real is not None
    folder.mkdir(parents=True, exist_ok=True)
    record = folder / f"{name}.calls"
    wrapper = folder / name
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> "{record}"\nexec "{real}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, record


def test_a_second_machine_builds_nothing(
    repo: Path,
    registry: Registry,
    build_index: str,  # noqa: F811
    cli: Build,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wheels = [
        ref(make_wheel(repo / "wheels", "helper", "1.0", {"helper.py": "HELP = 1\n"})),
        ref(
            make_wheel(
                repo / "wheels",
                "tinypatch",
                "1.0",
                {"tinypatch/__init__.py": 'GREETING = "as released"\n'},
            )
        ),
    ]
    (repo / "specs" / "patches").mkdir()
    (repo / "specs" / "patches" / "tiny.patch").write_text(PATCH)
    sdist = pack_sdist(FIXTURES / "cext", "fixture-cext", "1.0.0", repo)
    extra = (
        '[builds.fixture-cext]\nversion = "1.0.0"\n'
        '[builds.fixture-cext.env]\nCEXT_GREETING = "cached"\n'
        '[patches]\ntinypatch = ["patches/tiny.patch"]\n'
    )
    spec = write_project(
        repo, "shared", wheels, extra, builds=[("fixture-cext", "1.0.0", sdist)], index=build_index
    )
    cache = registry.ref("cache/builds")

    def build(machine: str) -> tuple[CliResult, dict[str, object], Path]:
        cc, calls = recording_cc(repo / f"cc-{machine}", "gcc")
        monkeypatch.setenv("CC", str(cc))
        out = repo / f"out-{machine}"
        got = cli(
            "build", "--store", repo / f"store-{machine}", "--output", out,
            "--cache", cache, "--insecure", spec,
        )  # fmt: skip
        assert got.exit_code == 0, got.stderr
        return got, json.loads((out / "build-manifest.json").read_text()), calls

    first, made, calls_a = build("a")
    assert "fixture-cext 1.0.0: no earlier build, building" in first.stderr
    compiled = [c for c in calls_a.read_text().splitlines() if "_hello.c" in c]
    assert compiled, "machine A compiled the extension"
    assert "derivation(s) pulled" in first.stderr and " 0 derivation(s) pulled" in first.stderr

    second, same, calls_b = build("b")
    assert "(0 rebuilt)" in second.stderr
    assert "source-build fixture-cext 1.0.0" in second.stderr
    assert "building" not in second.stderr
    assert calls_b.read_text().splitlines() == ["-dumpfullversion -dumpversion"]  # the probe only
    assert "0 published" in second.stderr
    assert same == made
    assert second.stdout.strip() == first.stdout.strip()
