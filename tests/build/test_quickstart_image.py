"""The quickstart image, built for real: Debian base (mmdebstrap), wheels from PyPI, uv, zstd.

One session build into store A is shared by the tests; the reproducibility test builds again into
store B in a subprocess with another umask, TZ, HOME and cwd, later in time, and compares digests.
The image is checked with skopeo, umoci and a private dockerd (``docker run --network none``).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, CliResult

from envbuild.lock.core import lock_spec
from envbuild.spec import load_spec

pytestmark = [pytest.mark.network, pytest.mark.slow]

SPEC = REPO / "specs" / "quickstart.toml"
#: umoci 0.4 (Debian's) reads no zstd layers, so these images are built with gzip layers.
GZIP = ("--compression", "gzip")


@dataclass
class Built:
    store: Path
    output: Path
    manifest: dict[str, Any]
    seconds: float


def envbuild(
    *args: str | Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    umask: str | None = None,
) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "envbuild", *map(str, args)]
    if umask:
        argv = ["sh", "-c", f'umask {umask} && exec "$@"', "sh", *argv]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)


def build_into(
    store: Path,
    output: Path,
    *,
    spec: Path = SPEC,
    compression: tuple[str, ...] = GZIP,
    **kw: Any,
) -> Built:
    start = time.perf_counter()
    done = envbuild(
        "build", *compression, "--store", store, "--output", output, "--json", spec, **kw
    )
    took = time.perf_counter() - start
    assert done.returncode == 0, done.stderr
    return Built(store, output, json.loads(done.stdout), took)


@pytest.fixture(scope="session")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Built:
    work = tmp_path_factory.mktemp("quickstart")
    return build_into(work / "store-a", work / "out-a")


def layer_digests(manifest: dict[str, Any]) -> dict[str, str]:
    return {layer["name"]: layer["digest"] for layer in manifest["layers"]}


def test_the_build_writes_layout_archive_and_manifest(quickstart: Built) -> None:
    m = quickstart.manifest
    out = quickstart.output
    assert (out / "oci" / "oci-layout").is_file()
    index = json.loads((out / "oci" / "index.json").read_text())
    assert index["manifests"][0]["digest"] == m["image"]
    assert (out / "docker-archive.tar").is_file()
    on_disk = json.loads((out / "build-manifest.json").read_text())
    assert on_disk == m
    assert (out / "build-manifest.json").read_text().endswith("}\n")
    kinds = [layer["kind"] for layer in m["layers"]]
    assert kinds[0] == "base" and "venv" in kinds
    held = {d for layer in m["layers"] for d in layer["distributions"]}
    assert "rich==13.9.4" in held and "requests==2.32.3" in held
    lock_bytes = (REPO / "lockfiles" / "pylock.quickstart.toml").read_bytes()
    assert m["lock_hash"] == hashlib.sha256(lock_bytes).hexdigest()
    assert m["spec_hash"] == load_spec(SPEC).spec_hash()


def test_the_sbom_is_valid_cyclonedx_and_names_everything_in_the_image(quickstart: Built) -> None:
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    from envbuild.build import sbom
    from envbuild.lock.io import read_lock

    out, m = quickstart.output, quickstart.manifest
    data = (out / "sbom.cdx.json").read_bytes()
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(data.decode())
    assert error is None, error
    doc = json.loads(data)
    assert doc["bomFormat"] == "CycloneDX" and doc["specVersion"] == "1.6"
    subject = doc["metadata"]["component"]
    assert subject["type"] == "container" and subject["version"] == m["image"]
    from packageurl import PackageURL

    assert PackageURL.from_string(subject["purl"]).to_dict() == {
        **PackageURL("oci", name="quickstart", version=m["image"]).to_dict()
    }
    pypi = {c["name"]: c for c in doc["components"] if c["purl"].startswith("pkg:pypi/")}
    held = {d for layer in m["layers"] for d in layer["distributions"]}
    assert {f"{c['name']}=={c['version']}" for c in pypi.values()} == held
    lock = read_lock(REPO / "lockfiles" / "pylock.quickstart.toml")
    for package in lock.packages:
        shas = {w.hashes.sha256 for w in package.wheels}
        (h,) = pypi[package.name]["hashes"]
        assert h["alg"] == "SHA-256" and h["content"] in shas  # the wheel installed
    assert "MIT" in json.dumps(pypi["rich"]["licenses"])  # rich's METADATA declares MIT
    debs = {c["name"]: c for c in doc["components"] if c["purl"].startswith("pkg:deb/debian/")}
    base = lock.envbuild.base
    assert {(p.name, p.version) for p in base.packages} == {  # type: ignore[union-attr]
        (c["name"], c["version"]) for c in debs.values()
    }
    assert "distro=debian-12" in debs["python3"]["purl"]
    # in the layout, a referrer whose subject is the image (OCI 1.1)
    assert sbom.read_attached(out / "oci") == data
    index = json.loads((out / "oci" / "index.json").read_text())
    (art,) = [e for e in index["manifests"] if e.get("artifactType") == sbom.MEDIA_TYPE]
    manifest = json.loads((out / "oci/blobs/sha256" / art["digest"][7:]).read_text())
    assert manifest["subject"]["digest"] == m["image"]


def somewhere_else(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """Another working folder and environment: TZ=Asia/Tokyo, another HOME, the C locale, no
    ENVBUILD_STORE (a build's output must depend on none of them)."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "TZ": "Asia/Tokyo", "HOME": str(elsewhere), "LC_ALL": "C"}
    env.pop("ENVBUILD_STORE", None)
    env["PYTHONPATH"] = str(REPO)
    return elsewhere, env


def same_outputs(a: Built, b: Built) -> None:
    """Every blob of the two OCI layouts and the two docker archives, byte for byte."""
    blobs_a = sorted(p.name for p in (a.output / "oci/blobs/sha256").iterdir())
    blobs_b = sorted(p.name for p in (b.output / "oci/blobs/sha256").iterdir())
    assert blobs_a == blobs_b
    for name in blobs_a:
        assert (a.output / "oci/blobs/sha256" / name).read_bytes() == (
            b.output / "oci/blobs/sha256" / name
        ).read_bytes()
    assert (a.output / "docker-archive.tar").read_bytes() == (
        b.output / "docker-archive.tar"
    ).read_bytes()


def test_two_builds_anywhere_give_one_digest(quickstart: Built, tmp_path: Path) -> None:
    """Another store, later, with umask 077, TZ=Asia/Tokyo, another HOME and cwd."""
    elsewhere, env = somewhere_else(tmp_path)
    second = build_into(
        tmp_path / "store-b", tmp_path / "out-b", cwd=elsewhere, env=env, umask="077"
    )
    assert second.manifest["image"] == quickstart.manifest["image"]
    assert layer_digests(second.manifest) == layer_digests(quickstart.manifest)
    assert second.manifest == quickstart.manifest
    sboms = [b.output / "sbom.cdx.json" for b in (quickstart, second)]
    assert sboms[0].read_bytes() == sboms[1].read_bytes()  # and same_outputs: its OCI artifact
    same_outputs(quickstart, second)


def _zstd_project(quickstart: Built, top: Path) -> Path:
    """The quickstart spec over the session build's Debian base, as a rootfs tarball (its base
    layer, decompressed) in a new repository, with the quickstart lock re-pinned to it: a second
    compression needs no second mmdebstrap run (the Debian base's key includes the compression)."""
    from envbuild.fsio import sha256_file
    from envbuild.lock.core import lock_path
    from envbuild.lock.io import dumps, read_lock
    from envbuild.lock.model import RootfsBaseLock
    from envbuild.store.core import Store

    (top / ".git").mkdir(parents=True)
    (top / "specs").mkdir()
    (base,) = [x for x in quickstart.manifest["layers"] if x["kind"] == "base"]
    assert base["media_type"].endswith("+gzip")
    rootfs = top / "rootfs.tar"
    with (
        gzip.open(Store(quickstart.store).blob_path(base["digest"])) as src,
        rootfs.open("wb") as dst,
    ):
        shutil.copyfileobj(src, dst)
    text = SPEC.read_text()
    debian = text[text.index("[base]\n") : text.index("[python]")]
    spec = top / "specs" / "quickstart.toml"
    pinned = f'sha256 = "{sha256_file(rootfs)}"\n'
    spec.write_text(
        text.replace(debian, f'[base]\nkind = "rootfs"\npath = "../rootfs.tar"\n{pinned}\n')
    )
    loaded = load_spec(spec)
    lock = read_lock(REPO / "lockfiles" / "pylock.quickstart.toml")
    ours = lock.tool.envbuild.model_copy(
        update={
            "spec_hash": loaded.spec_hash(),
            "base": RootfsBaseLock(kind="rootfs", path="rootfs.tar", sha256=sha256_file(rootfs)),
        }
    )
    relocked = lock.model_copy(update={"tool": lock.tool.model_copy(update={"envbuild": ours})})
    lock_path(loaded).parent.mkdir()
    lock_path(loaded).write_text(dumps(relocked, spec_file="specs/quickstart.toml"))
    return spec


def test_two_zstd_builds_anywhere_give_one_digest(quickstart: Built, tmp_path: Path) -> None:
    """The default compression (zstd) is as reproducible: two builds into two stores, the
    second with umask 077, TZ=Asia/Tokyo, another HOME and cwd. Both start from the session
    build's base as a rootfs tarball rather than a second mmdebstrap run (~70 s on 2 cores)."""
    spec = _zstd_project(quickstart, tmp_path / "project")
    zstd = ("--compression", "zstd")
    first = build_into(tmp_path / "store-c", tmp_path / "out-c", spec=spec, compression=zstd)
    elsewhere, env = somewhere_else(tmp_path)
    second = build_into(
        tmp_path / "store-d", tmp_path / "out-d", spec=spec, compression=zstd, cwd=elsewhere,
        env=env, umask="077",
    )  # fmt: skip
    media = {layer["media_type"] for layer in first.manifest["layers"]}
    assert media == {"application/vnd.oci.image.layer.v1.tar+zstd"}, media
    assert second.manifest == first.manifest
    assert second.manifest["image"] == first.manifest["image"]
    # the same files as the gzip image, in other layers' bytes
    gz = {x["name"]: x["diff_id"] for x in quickstart.manifest["layers"] if x["kind"] != "base"}
    zs = {x["name"]: x["diff_id"] for x in first.manifest["layers"] if x["kind"] != "base"}
    assert zs == gz
    assert layer_digests(first.manifest) != layer_digests(quickstart.manifest)
    same_outputs(first, second)


def test_a_no_op_rebuild_repacks_nothing(quickstart: Built, cli: Callable[..., CliResult]) -> None:
    drv = quickstart.store / "drv"
    before = {p.name: p.stat().st_mtime_ns for p in drv.iterdir()}
    blobs = sorted(p.name for p in (quickstart.store / "blobs/sha256").iterdir())
    start = time.perf_counter()
    again = cli("build", *GZIP, "--store", quickstart.store, "--output", quickstart.output, SPEC)
    took = time.perf_counter() - start
    assert again.exit_code == 0, again.stderr
    assert again.stdout.strip().splitlines()[-1] == quickstart.manifest["image"]
    assert "(0 rebuilt)" in again.stderr
    assert {p.name: p.stat().st_mtime_ns for p in drv.iterdir()} == before
    assert sorted(p.name for p in (quickstart.store / "blobs/sha256").iterdir()) == blobs
    assert took < 10, f"a no-op rebuild took {took:.1f} s"


def test_skopeo_and_umoci_accept_the_image(quickstart: Built, tmp_path: Path) -> None:
    for tool in ("skopeo", "umoci"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is not installed (scripts/test installs it)")
    layout = quickstart.output / "oci"
    raw = subprocess.run(
        ["skopeo", "inspect", "--raw", f"oci:{layout}:quickstart"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"sha256:{hashlib.sha256(raw.encode()).hexdigest()}" == quickstart.manifest["image"]
    info = json.loads(
        subprocess.run(
            ["skopeo", "inspect", f"oci:{layout}:quickstart"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    assert info["Labels"]["dev.envbuild.spec"] == "quickstart"
    assert info["Labels"]["dev.envbuild.lock-hash"] == quickstart.manifest["lock_hash"]
    bundle = tmp_path / "bundle"
    subprocess.run(
        ["umoci", "unpack", "--image", f"{layout}:quickstart", str(bundle)],
        capture_output=True,
        text=True,
        check=True,
    )
    rootfs = bundle / "rootfs"
    script = rootfs / "opt/venv/bin/pygmentize"
    assert script.read_text().startswith("#!/opt/venv/bin/python\n")
    assert os.readlink(rootfs / "opt/venv/bin/python") == "/usr/bin/python3"
    assert (rootfs / "usr/bin/python3").exists()
    cfg = (rootfs / "opt/venv/pyvenv.cfg").read_text()
    assert "home = /usr/bin" in cfg
    assert "command" not in cfg  # no `python -m venv` ran: envbuild wrote it


@pytest.mark.docker
def test_docker_runs_the_image_offline(
    quickstart: Built,
    docker_host: str,
    cli: Callable[..., CliResult],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DOCKER_HOST", docker_host)
    loaded = cli("load", quickstart.output)
    assert loaded.exit_code == 0, loaded.stderr
    env = {**os.environ, "DOCKER_HOST": docker_host}

    def run(*argv: str) -> str:
        done = subprocess.run(
            ["docker", "run", "--rm", "--network", "none", "envbuild/quickstart:latest", *argv],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "quickstart ok" in run()
    out = run(
        "sh",
        "-c",
        "pygmentize -V && python -c "
        "'import sys, requests, rich; print(sys.prefix, requests.__version__)'",
    )
    lines = out.strip().splitlines()
    assert lines[0].startswith("Pygments version 2.19.1")
    assert lines[1].split() == ["/opt/venv", "2.32.3"]

    # what a docker user reads: a real date (the lock's cutoff) and the packages of each layer
    def docker(*argv: str) -> str:
        done = subprocess.run(
            ["docker", *argv], capture_output=True, text=True, env=env, check=False
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    (inspected,) = json.loads(docker("image", "inspect", "envbuild/quickstart:latest"))
    cutoff = tomllib.loads((REPO / "lockfiles" / "pylock.quickstart.toml").read_text())
    expected = cutoff["tool"]["envbuild"]["exclude-newer"].strftime("%Y-%m-%dT%H:%M:%SZ")
    assert inspected["Created"] == expected
    fmt = "{{.CreatedBy}}\t{{.CreatedAt}}"
    rows = docker("history", "--no-trunc", "--format", fmt, "envbuild/quickstart:latest")
    history = [row.split("\t") for row in rows.strip().splitlines()]
    assert len(history) == len(quickstart.manifest["layers"])
    assert all(at != "N/A" and not at.startswith("0001") for _, at in history)
    by = "\n".join(created_by for created_by, _ in history)
    assert "rich==13.9.4" in by and "requests==2.32.3" in by
    assert "debian bookworm" in by and " more)" in by  # the base: its first packages, a count


def test_bumping_one_small_package_rebuilds_only_its_layer(
    quickstart: Built, repo: Path, cli: Callable[..., CliResult]
) -> None:
    spec = repo / "specs" / "quickstart.toml"
    spec.write_text(SPEC.read_text().replace('rich = "==13.9.4"', 'rich = "==13.9.3"'))
    loaded = load_spec(spec)
    lock_spec(loaded)
    out = repo / "images" / "bumped"
    result = cli("build", *GZIP, "--store", quickstart.store, "--output", out, "--json", spec)
    assert result.exit_code == 0, result.stderr
    bumped = result.json()
    old, new = layer_digests(quickstart.manifest), layer_digests(bumped)
    assert old.keys() == new.keys()
    changed = sorted(name for name in old if old[name] != new[name])
    holding = [
        layer["name"] for layer in bumped["layers"] if "rich==13.9.3" in layer["distributions"]
    ]
    assert changed == holding and len(holding) == 1
    assert bumped["image"] != quickstart.manifest["image"]


def test_a_verbose_build_shows_each_stage_and_the_wall_time(quickstart: Built) -> None:
    """The printed time is the wall time; the stage times (which overlap) are shown by -v."""
    done = envbuild(
        "-v", "build", *GZIP, "--store", quickstart.store, "--output", quickstart.output, SPEC
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in done.stderr.splitlines() if "stages: " in x)
    for name in ("plan", "layers", "image", "root"):
        assert f"{name} " in line, line
    assert "; wall " in line
    assert done.stdout.strip() == quickstart.manifest["image"]
