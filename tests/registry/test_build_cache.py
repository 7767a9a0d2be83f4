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


def test_a_cache_that_does_not_answer_is_built_without_but_a_refusal_fails(
    repo: Path,
    registry_auth: Registry,
    registry_tls: Registry,
    docker_config: Path,
    cli: Build,
    tmp_path: Path,
) -> None:
    """No answer at all (nothing listens): a warning, and the build goes on locally to the same
    image. Wrong credentials: exit 3 before anything is built. Right credentials, and TLS with
    the registry's CA: the cache works (entries published)."""
    import socket

    wheels = [ref(make_wheel(repo / "wheels", "helper", "1.0", {"helper.py": "HELP = 1\n"}))]
    spec = write_project(repo, "cached", wheels)

    def build(store: str, *cache: str | Path) -> CliResult:
        out = tmp_path / f"out-{store}"
        return cli("build", "--store", tmp_path / store, "--output", out, "--no-docker-archive",
                   "--json", *cache, spec)  # fmt: skip

    plain = build("plain")
    assert plain.exit_code == 0, plain.stderr
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = build("down", "--cache", f"127.0.0.1:{port}/cache", "--insecure")
    assert down.exit_code == 0, down.stderr
    assert f"cannot reach registry 127.0.0.1:{port}" in down.stderr
    assert down.stderr.count("building without the cache") == 1  # said once
    assert down.json()["image"] == plain.json()["image"]

    registry_auth.write_docker_config(docker_config, password="wrong")
    cache = registry_auth.ref("private/cache")
    refused = build("refused", "--cache", cache, "--insecure")
    assert refused.exit_code == 3
    assert f"registry {registry_auth.host} refused the credentials" in refused.stderr
    assert json.loads(refused.stdout)["error"]["kind"] == "RegistryError"
    drvs = tmp_path / "refused" / "drv"  # nothing built before the cache was asked
    assert not drvs.exists() or not any(drvs.iterdir())
    registry_auth.write_docker_config(docker_config)
    authed = build("authed", "--cache", cache, "--insecure")
    assert authed.exit_code == 0, authed.stderr
    assert authed.json()["image"] == plain.json()["image"]

    assert registry_tls.cert_dir is not None
    tls = build("tls", "--cache", registry_tls.ref("secure/cache"), "--cert-dir",
                registry_tls.cert_dir)  # fmt: skip
    assert tls.exit_code == 0, tls.stderr
    again = build("tls-again", "--cache", registry_tls.ref("secure/cache"), "--cert-dir",
                  registry_tls.cert_dir)  # fmt: skip
    assert again.exit_code == 0, again.stderr
    assert "cache hit" in again.stderr and again.json()["image"] == plain.json()["image"]
