"""Source builds and patches in `envbuild build`: F's C-extension fixture compiled by gcc and a
patched tiny wheel, installed into the image's top layers (tiny rootfs base, ``file://`` wheels and
sdist, setuptools from a local index)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import CliResult
from support.project import members, write_project
from support.sdists import FIXTURES, pack_sdist
from support.wheels import make_wheel, ref

from envbuild.lock.wheels import WheelRef
from envbuild.store.core import Store

pytestmark = pytest.mark.network  # setuptools for the build venv, once per session

Build = Callable[..., CliResult]
SITE = "opt/venv/lib/python3.11/site-packages"
PATCH = """\
--- a/tinypatch/__init__.py
+++ b/tinypatch/__init__.py
@@ -1,2 +1,2 @@
-GREETING = "as released"
+GREETING = "patched by envbuild"
 VERSION = 1
"""


def spec_extra(greeting: str) -> str:
    return (
        '[builds.fixture-cext]\nversion = "1.0.0"\n'
        f'[builds.fixture-cext.env]\nCEXT_GREETING = "{greeting}"\n'
        '[patches]\ntinypatch = ["patches/tinypatch.patch"]\n'
    )


class Project:
    def __init__(self, repo: Path, index: str) -> None:
        self.repo, self.index = repo, index
        wheels = repo / "wheels"
        self.wheels: list[WheelRef] = [
            ref(make_wheel(wheels, "helper", "1.0", {"helper.py": "HELP = 1\n"})),
            ref(
                make_wheel(
                    wheels,
                    "tinypatch",
                    "1.0",
                    {"tinypatch/__init__.py": 'GREETING = "as released"\nVERSION = 1\n'},
                )
            ),
        ]
        self.sdist = pack_sdist(FIXTURES / "cext", "fixture-cext", "1.0.0", repo)
        (repo / "specs" / "patches").mkdir(parents=True, exist_ok=True)
        (repo / "specs" / "patches" / "tinypatch.patch").write_text(PATCH)

    def write(self, greeting: str) -> Path:
        return write_project(
            self.repo,
            "sources",
            self.wheels,
            spec_extra(greeting),
            builds=[("fixture-cext", "1.0.0", self.sdist)],
            index=self.index,
        )

    def build(self, cli: Build, spec: Path, *args: str) -> tuple[CliResult, dict[str, Any]]:
        out = self.repo / "out"
        got = cli("build", "--store", self.repo / "store", "--output", out, *args, spec)
        assert got.exit_code == 0, got.stderr
        return got, json.loads((out / "build-manifest.json").read_text())


def layer_files(store: Store, manifest: dict[str, Any], name: str) -> dict[str, bytes]:
    layer = next(x for x in manifest["layers"] if x["name"] == name)
    return members(store, layer["digest"], layer["media_type"])


def state_of(stderr: str, name: str) -> str:
    """``rebuilt`` or ``cached``, as the build's text output says for layer ``name``."""
    lines = [ln.split() for ln in stderr.splitlines()]
    (state,) = [w[-1] for w in lines if w[:1] == [name] and w[-1] in ("rebuilt", "cached")]
    return state


def test_a_source_build_and_a_patch_land_in_the_image(
    repo: Path, build_index: str, cli: Build
) -> None:
    project = Project(repo, build_index)
    spec = project.write("bonjour")
    first, manifest = project.build(cli, spec)
    store = Store(repo / "store")
    assert "source-build fixture-cext 1.0.0" in first.stderr and "built" in first.stderr
    # zstd layers (the default): the build says which tools read them and how to get gzip
    assert "layers are zstd: read by containerd >= 1.5, docker >= 23.0" in first.stderr
    assert "build with --compression gzip for those" in first.stderr

    # the manifest records the source build's input key, flags, MAX_JOBS and audit
    (built,) = manifest["source_builds"]
    assert built["dist"] == "fixture-cext" and built["flags"] == {"CEXT_GREETING": "bonjour"}
    assert isinstance(built["max_jobs"], int) and built["max_jobs"] >= 1
    assert built["builder"] == {"mode": "host"}
    assert [f["path"].split("/")[0] for f in built["audit"]["files"]] == ["fixture_cext"]
    drv = store.lookup(built["key"])
    assert drv is not None and drv.kind == "source-build"
    assert drv.outputs["wheel"] == f"sha256:{built['wheel_sha256']}"
    # … and per patch its files with sha256 and the patched version
    (patched,) = manifest["patches"]
    assert store.lookup(patched["key"]) is not None
    assert patched["patches"] == [
        {"path": "specs/patches/tinypatch.patch", "sha256": patched["patches"][0]["sha256"]}
    ]
    assert patched["patched_version"] == f"1.0+envbuild.{patched['key'][:10]}"
    assert patched["files"] == ["tinypatch/__init__.py"]

    # the top layers hold the built extension and the patched file, nothing else of theirs
    names = [x["name"] for x in manifest["layers"]]
    assert names[-2:] == ["tinypatch", "fixture-cext"]
    ext = layer_files(store, manifest, "fixture-cext")
    so = [n for n in ext if n.startswith(f"{SITE}/fixture_cext/_hello") and n.endswith(".so")]
    assert len(so) == 1
    assert f"{SITE}/fixture_cext-1.0.0.dist-info/RECORD" in ext
    top = layer_files(store, manifest, "tinypatch")
    info = f"{SITE}/tinypatch-{patched['patched_version']}.dist-info"
    assert top[f"{SITE}/tinypatch/__init__.py"].startswith(b'GREETING = "patched by envbuild"')
    assert json.loads(top[f"{info}/envbuild-patches.json"])["patches"] == patched["patches"]
    assert b"Version: " + patched["patched_version"].encode() in top[f"{info}/METADATA"]
    assert not any(n.startswith(f"{SITE}/tinypatch") for n in layer_files_below(store, manifest))

    # the image's extension runs and says what the build flag told gcc
    site = repo / "unpacked"
    for name in ("fixture-cext", "tinypatch"):
        for path, data in layer_files(store, manifest, name).items():
            if path.startswith(SITE + "/") and data:
                (site / path).parent.mkdir(parents=True, exist_ok=True)
                (site / path).write_bytes(data)
    code = "import fixture_cext, tinypatch; print(fixture_cext.greeting(), tinypatch.GREETING)"
    ran = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(site / SITE)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert ran.stdout.strip() == "bonjour patched by envbuild"

    # the SBOM names the source build with its inputs and the patch with what it patched
    doc = _sbom(repo / "out")
    cext = _component(doc, "fixture-cext")
    (sdist,) = cext["pedigree"]["ancestors"]
    assert sdist["hashes"] == [{"alg": "SHA-256", "content": built["sdist"]["sha256"]}]
    props = {p["name"]: p["value"] for p in cext["properties"]}
    assert props["envbuild:build:flag:CEXT_GREETING"] == "bonjour"
    assert props["envbuild:build:key"] == built["key"]
    assert cext["hashes"] == [{"alg": "SHA-256", "content": built["wheel_sha256"]}]
    tiny = _component(doc, "tinypatch")
    assert tiny["version"] == patched["patched_version"]
    (source,) = tiny["pedigree"]["ancestors"]
    assert source["version"] == "1.0"
    assert source["hashes"][0]["content"] == patched["source_wheel"]["sha256"]
    assert [x["diff"]["url"] for x in tiny["pedigree"]["patches"]] == [
        "file:specs/patches/tinypatch.patch"
    ]
    sbom_bytes = (repo / "out" / "sbom.cdx.json").read_bytes()

    # a rebuild is a no-op: nothing compiled, patched, installed or packed
    again, same = project.build(cli, spec)
    assert "(0 rebuilt)" in again.stderr
    assert "source-build fixture-cext 1.0.0" in again.stderr and "reused" in again.stderr
    assert same == manifest
    assert again.stdout.strip() == manifest["image"]
    assert (repo / "out" / "sbom.cdx.json").read_bytes() == sbom_bytes

    # a changed flag rebuilds that wheel and its layer only, and says which input changed
    changed, other = project.build(cli, project.write("salut"))
    assert "inputs changed since " + built["key"][:12] in changed.stderr
    assert "env.CEXT_GREETING: 'bonjour' -> 'salut'" in changed.stderr
    assert "(1 rebuilt)" in changed.stderr and state_of(changed.stderr, "fixture-cext") == "rebuilt"
    before = {x["name"]: x["digest"] for x in manifest["layers"]}
    after = {x["name"]: x["digest"] for x in other["layers"]}
    assert {n for n in before if before[n] != after[n]} == {"fixture-cext"}
    assert other["source_builds"][0]["key"] != built["key"]
    assert other["patches"] == manifest["patches"]


def _sbom(out: Path) -> dict[str, Any]:
    """The build's SBOM, checked by the CycloneDX 1.6 JSON schema validator."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    data = (out / "sbom.cdx.json").read_text()
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(data)
    assert error is None, error
    return json.loads(data)


def _component(doc: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [c for c in doc["components"] if c["name"] == name]
    return found


def layer_files_below(store: Store, manifest: dict[str, Any]) -> dict[str, bytes]:
    """Every file of the layers under the top two."""
    out: dict[str, bytes] = {}
    for layer in manifest["layers"][:-2]:
        out.update(members(store, layer["digest"], layer["media_type"]))
    return out


def test_the_dockerfile_installs_the_wheels_envbuild_made(
    repo: Path, build_index: str, cli: Build
) -> None:
    project = Project(repo, build_index)
    spec = project.write("hej")
    refused = cli("dockerfile", spec)
    assert refused.exit_code == 2
    assert f"run `envbuild build {spec}` first" in refused.stderr  # the spec as typed
    _, manifest = project.build(cli, spec)
    dockerfile = repo / "docker" / "Dockerfile"
    made = cli(
        "dockerfile",
        "--build",
        repo / "out",
        "--store",
        repo / "store",
        "-o",
        dockerfile,
        "--json",
        spec,
    )
    assert made.exit_code == 0, made.stderr
    text = dockerfile.read_text()
    assert "COPY envbuild-wheels/ /tmp/envbuild-wheels/" in text
    assert "--find-links /tmp/envbuild-wheels" in text
    built, patched = manifest["source_builds"][0], manifest["patches"][0]
    assert f"fixture-cext==1.0.0 --hash=sha256:{built['wheel_sha256']}" in text
    assert (
        f"tinypatch=={patched['patched_version']} --hash=sha256:{patched['wheel_sha256']}" in text
    )
    assert "CEXT_GREETING=hej" in text and "specs/patches/tinypatch.patch" in text
    assert "tinypatch==1.0 " not in text  # the unpatched wheel is not installed
    assert "FROM scratch AS base\n" in text and "\nADD envbuild-base/rootfs.tar /\n" in text
    assert (repo / "docker" / "envbuild-base" / "rootfs.tar").read_bytes() == (
        repo / "rootfs.tar"
    ).read_bytes()
    copied = sorted(p.name for p in (repo / "docker" / "envbuild-wheels").iterdir())
    assert copied == sorted([built["wheel"], patched["wheel"]])
    with zipfile.ZipFile(repo / "docker" / "envbuild-wheels" / patched["wheel"]) as zf:
        assert b"patched by envbuild" in zf.read("tinypatch/__init__.py")
    assert [w["dist"] for w in made.json()["wheels"]] == ["fixture-cext", "tinypatch"]

    # pip cannot build the sdist the lock pins; `lock --export-wheels` gives what it can install
    export = repo / "export"
    exported = cli("lock", "--export-wheels", export, "--build", repo / "out",
                   "--store", repo / "store", "--json", spec)  # fmt: skip
    assert exported.exit_code == 0, exported.stderr
    reqs = export / "requirements.txt"
    assert exported.json()["requirements"] == str(reqs)
    assert sorted(p.name for p in export.glob("*.whl")) == sorted(
        [built["wheel"], patched["wheel"]]
    )
    assert [x for x in reqs.read_text().splitlines() if not x.startswith("#")] == sorted(
        made.json()["requirements"]
    )  # the Dockerfile's very lines
    venv = repo / "pip-venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    pip = subprocess.run(
        [venv / "bin" / "python", "-m", "pip", "install", "--disable-pip-version-check",
         "--no-deps", "--require-hashes", "--no-index", "--find-links", repo / "wheels",
         "--find-links", export, "-r", reqs],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stdout + pip.stderr
    said = subprocess.run(
        [venv / "bin" / "python", "-c",
         "import fixture_cext, tinypatch; print(fixture_cext.greeting(), tinypatch.GREETING)"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert said.strip() == "hej patched by envbuild"  # the built extension and the patch
