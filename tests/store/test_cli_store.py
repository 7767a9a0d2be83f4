"""`envbuild store plan/add-wheel/ls/path` on the seed spec and on a fixture spec with a lock."""

from __future__ import annotations

import hashlib
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
from sourcebuild.conftest import cext_lock, store_state, write_cext_spec
from support.sdists import FIXTURES
from support.wheels import make_wheel

from envbuild.lock.core import lock_path
from envbuild.lock.io import dumps
from envbuild.sourcebuild.builder import HostBuilder
from envbuild.sourcebuild.realize import realize
from envbuild.sourcebuild.requests import FileRef, build_requests
from envbuild.spec.load import load_spec
from envbuild.store.core import Store

REPO = FIXTURES.parents[2]


@pytest.mark.network  # the build venv's pins come from the locked wheels' METADATA (PyPI)
def test_plan_shows_flash_attn_flags_and_the_vllm_patch(
    cli: Callable[..., object], tmp_path: Path
) -> None:
    spec = REPO / "specs" / "glm5-gguf.toml"
    res = cli("store", "plan", spec, "--store", tmp_path / "store")
    assert res.exit_code == 0, res.stderr  # type: ignore[attr-defined]
    out = res.stdout  # type: ignore[attr-defined]
    assert (
        "source-build flash-attn: build flash-attn 2.8.3.post2 from flash_attn-2.8.3.post2.tar.gz"
        " with FLASH_ATTENTION_FORCE_BUILD=TRUE FLASH_ATTN_CUDA_ARCHS=120 MAX_JOBS=16"
        " NVCC_THREADS=4 TORCH_CUDA_ARCH_LIST=12.0; archs sm_120; audit for GPUs 12.0"
    ) in out
    assert "patch vllm: patch vllm-0.33.0-" in out
    assert "with specs/patches/vllm-glm-moe-dsa-fp8-kv-sm120.patch (sha256 " in out
    data = cli("store", "plan", spec, "--store", tmp_path / "store", "--json").json()  # type: ignore[attr-defined]
    build, patch = data
    assert build["state"] == patch["state"] == "build"
    assert build["inputs"]["env"]["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"
    assert build["inputs"]["torch"]["version"] and build["inputs"]["target_ccs"] == ["12.0"]
    assert patch["patched_version"].startswith("0.33.0+envbuild.")
    assert patch["patched_version"].endswith(patch["key"][:10])


def _lock_fixture(repo: Path, sdist: FileRef, python: str, greeting: str = "from-the-spec") -> Path:
    spec = write_cext_spec(repo, python, f'env = {{ CEXT_GREETING = "{greeting}" }}\n')
    loaded = load_spec(spec)
    lock = cext_lock(loaded, sdist, python=python, env={"CEXT_GREETING": greeting})
    path = lock_path(loaded)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(lock, spec_file="specs/cext-demo.toml"))
    return spec


@pytest.mark.network
def test_add_wheel_then_ls_and_path(
    cli: Callable[..., object],
    repo: Path,
    tmp_path: Path,
    sdists: Callable[[str], FileRef],
    python_version: str,
) -> None:
    spec = _lock_fixture(repo, sdists("cext"), python_version)
    loaded = load_spec(spec)
    from envbuild.lock.io import read_lock

    (req,) = build_requests(loaded, read_lock(lock_path(loaded)))
    big = Store(tmp_path / "big")
    built = realize(req, HostBuilder(python_version), big)
    wheel = tmp_path / built.wheel
    wheel.write_bytes(big.blob_path(built.wheel_digest).read_bytes())

    here = tmp_path / "here"
    res = cli("store", "add-wheel", spec, "fixture-cext", wheel, "--store", here, "--json")
    assert res.exit_code == 0, res.stderr  # type: ignore[attr-defined]
    added = res.json()  # type: ignore[attr-defined]
    assert added["key"] == built.key and added["origin"] == "added"
    assert realize(req, HostBuilder(python_version), Store(here)).reused

    listed = cli("store", "ls", "--store", here, "--json").json()  # type: ignore[attr-defined]
    assert [(o["dist"], o["kind"], o["origin"], o["wheel"]) for o in listed] == [
        ("fixture-cext", "source-build", "added", built.wheel)
    ]
    res = cli("store", "path", "fixture-cext", "--store", here)
    assert Path(res.stdout.strip()).read_bytes() == wheel.read_bytes()  # type: ignore[attr-defined]
    res = cli("store", "path", "fixture-cext", "--store", here, "--log")
    assert res.exit_code == 2 and "no build log" in res.stderr  # type: ignore[attr-defined]
    res = cli("store", "add-wheel", spec, "flash-attn", wheel, "--store", here)
    assert res.exit_code == 2  # type: ignore[attr-defined]
    assert "builds no flash-attn from source" in res.stderr  # type: ignore[attr-defined]


def _rezip(wheel: Path, out: Path, change: dict[str, bytes | None]) -> Path:
    """``wheel``'s members copied to ``out``, some replaced (bytes) or left out (None)."""
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w") as dst:
        for name in src.namelist():
            data = change.get(name, src.read(name))
            if data is not None:
                dst.writestr(name, data)
        for name, data in change.items():
            if name not in src.namelist() and data is not None:
                dst.writestr(name, data)
    return out


def test_add_wheel_refuses_a_wheel_that_cannot_work(
    cli: Callable[..., object],
    repo: Path,
    tmp_path: Path,
    sdists: Callable[[str], FileRef],
    python_version: str,
) -> None:
    spec = _lock_fixture(repo, sdists("cext"), python_version)
    store = tmp_path / "store"
    good = make_wheel(tmp_path / "good", "fixture-cext", "1.0.0", {"fixture_cext/__init__.py": ""})
    info = "fixture_cext-1.0.0.dist-info"
    bad = tmp_path / "bad"
    bad.mkdir()
    no_info: dict[str, bytes | None] = {
        f"{info}/{m}": None for m in ("METADATA", "WHEEL", "RECORD")
    }
    cases = {
        # the wheel this check was written for: Python 2.7 on Windows, and no .dist-info at all
        _rezip(good, bad / "fixture_cext-1.0.0-cp27-cp27m-win_amd64.whl", no_info): (
            "is tagged cp27-cp27m-win_amd64: it cannot be installed on the target, CPython "
            f"{python_version} on manylinux_2_36_x86_64"
        ),
        _rezip(good, bad / "fixture_cext-1.0.0-py3-none-any.whl", no_info): (
            "has no .dist-info of fixture-cext 1.0.0 (found: none)"
        ),
    }
    for wheel, message in cases.items():
        res = cli("store", "add-wheel", spec, "fixture-cext", wheel, "--store", store)
        assert res.exit_code == 2, res.stderr  # type: ignore[attr-defined]
        assert message in res.stderr, res.stderr  # type: ignore[attr-defined]
        assert "Traceback" not in res.stderr  # type: ignore[attr-defined]
    for change, message in [
        ({"fixture_cext/__init__.py": b"x = 1\n"}, "fixture_cext/__init__.py: RECORD says "),
        ({"fixture_cext/extra.py": b""}, "fixture_cext/extra.py: not in RECORD"),
        ({"fixture_cext/__init__.py": None}, "__init__.py: in RECORD but not in the wheel"),
        ({f"{info}/WHEEL": None}, f"{info} lacks WHEEL"),
    ]:
        wheel = _rezip(good, bad / good.name, change)
        res = cli("store", "add-wheel", spec, "fixture-cext", wheel, "--store", store)
        assert res.exit_code == 2, res.stderr  # type: ignore[attr-defined]
        assert message in res.stderr, res.stderr  # type: ignore[attr-defined]
    # a refused wheel records nothing, and stores no wheel
    assert store_state(Store(store)) == ([], [])

    res = cli("store", "add-wheel", spec, "fixture-cext", good, "--store", store, "--json")
    assert res.exit_code == 0, res.stderr  # type: ignore[attr-defined]
    added = res.json()  # type: ignore[attr-defined]
    assert added["origin"] == "added"
    # the same check sees the one that was accepted: its record, where the store keeps records
    blobs, keys = store_state(Store(store))
    assert keys == [added["key"]] and (store / "drv" / f"{added['key']}.json").is_file()
    assert hashlib.sha256(good.read_bytes()).hexdigest() in blobs


def test_path_names_one_build_or_says_which_it_could_mean(
    cli: Callable[..., object],
    repo: Path,
    tmp_path: Path,
    sdists: Callable[[str], FileRef],
    python_version: str,
) -> None:
    """`store path` takes a dist, a key prefix or a blob digest prefix; one that names several
    is exit 2 naming each candidate, one that names none is exit 2 too."""
    store = tmp_path / "store"
    wheel = make_wheel(tmp_path / "w", "fixture-cext", "1.0.0", {"fixture_cext/__init__.py": ""})
    keys = []
    for greeting in ("hello", "bonjour"):
        spec = _lock_fixture(repo, sdists("cext"), python_version, greeting)
        res = cli("store", "add-wheel", spec, "fixture-cext", wheel, "--store", store, "--json")
        assert res.exit_code == 0, res.stderr  # type: ignore[attr-defined]
        keys.append(res.json()["key"])  # type: ignore[attr-defined]
    assert len(set(keys)) == 2

    res = cli("store", "path", "fixture-cext", "--store", store)
    assert res.exit_code == 2  # type: ignore[attr-defined]
    err = res.stderr  # type: ignore[attr-defined]
    assert "'fixture-cext' names 2 stored builds: " in err
    assert all(f"{k[:12]} (fixture-cext 1.0.0)" in err for k in keys)
    for key in keys:
        res = cli("store", "path", key[:8], "--store", store)
        assert res.exit_code == 0, res.stderr  # type: ignore[attr-defined]
        assert Path(res.stdout.strip()).read_bytes() == wheel.read_bytes()  # type: ignore[attr-defined]
    res = cli("store", "path", "no-such-dist", "--store", store)
    assert res.exit_code == 2 and "names 0 stored builds" in res.stderr  # type: ignore[attr-defined]

    # blobs by digest prefix: add blobs until two share a first digit (the same ones each run)
    s = Store(store)
    digests: list[str] = []
    n = 0
    while len({d[7] for d in digests}) == len(digests):
        digests.append(s.add_bytes(f"blob {n}".encode()))
        n += 1
    first = next(d[7] for d in digests if sum(x[7] == d[7] for x in digests) > 1)
    res = cli("store", "path", f"sha256:{first}", "--store", store)
    assert res.exit_code == 2  # type: ignore[attr-defined]
    for d in s.find(f"sha256:{first}"):
        assert d in res.stderr  # type: ignore[attr-defined]
    res = cli("store", "path", digests[-1][:20], "--store", store)
    assert res.exit_code == 0  # type: ignore[attr-defined]
    assert res.stdout.strip() == str(s.blob_path(digests[-1]))  # type: ignore[attr-defined]


def _cuda_fixture(repo: Path, sdist: FileRef, python: str, env: dict[str, str]) -> Path:
    """The cext-demo spec with build flags ``env`` and ``[cuda] version = "13.1"``, locked."""
    flags = ", ".join(f'{k} = "{v}"' for k, v in env.items())
    spec = write_cext_spec(repo, python, f'env = {{ {flags} }}\n[cuda]\nversion = "13.1"\n')
    loaded = load_spec(spec)
    lock = cext_lock(loaded, sdist, python=python, env=env)
    path = lock_path(loaded)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(lock, spec_file="specs/cext-demo.toml"))
    return spec


def test_store_plan_says_what_a_build_costs_and_whether_it_is_needed(
    cli: Callable[..., object],
    repo: Path,
    tmp_path: Path,
    sdists: Callable[[str], FileRef],
    python_version: str,
    nvcc: str,
) -> None:
    env = {"FLASH_ATTN_CUDA_ARCHS": "120", "MAX_JOBS": "64", "NVCC_THREADS": "4"}
    spec = _cuda_fixture(repo, sdists("cext"), python_version, env)
    store = tmp_path / "store"
    res = cli("store", "plan", spec, "--store", store, "--json")
    assert res.exit_code == 0, res.stderr  # type: ignore[attr-defined]
    (row,) = res.json()  # type: ignore[attr-defined]
    assert row["kind"] == "source-build" and row["state"] == "build"
    assert row["builder"] == {"mode": "host"} and row["python"].startswith(python_version)
    found = row["nvcc"]
    assert found["path"] == nvcc and found["version"] == row["compilers"]["nvcc"]
    assert found["spec_cuda"] == "13.1"
    if found["cuda"] != "13.1":  # this machine's test nvcc is 13.0.88
        assert f"is CUDA {found['cuda']}, but the spec's cuda.version is 13.1" in found["warning"]
        assert found["warning"] in row["warnings"]
    memory = row["memory"]
    assert (memory["max_jobs"], memory["pinned"], memory["nvcc_threads"]) == (64, True, 4)
    assert memory["peak_bytes"] == 64 * memory["per_job_bytes"]
    assert memory["fits"] == (memory["peak_bytes"] <= memory["memory_bytes"])
    too_many = [w for w in row["warnings"] if "MAX_JOBS=64 x NVCC_THREADS=4 needs about" in w]
    assert len(too_many) == (0 if memory["fits"] else 1)
    if too_many:
        assert f"a safe value here is MAX_JOBS={memory['safe_max_jobs']}" in too_many[0]

    text = cli("store", "plan", spec, "--store", store)
    out, err = text.stdout, text.stderr  # type: ignore[attr-defined]
    assert f"  key {row['key']}: to be built" in out
    assert f"  nvcc {nvcc} (CUDA {found['cuda']})" in out
    assert "  memory: MAX_JOBS=64 (pinned by the spec) x NVCC_THREADS=4: about " in out
    # the same warnings; the memory available is read again by this second run, so its figures
    # may differ from the first's
    said = _figures_out(err)
    assert all(f"warning: {_figures_out(w)}" in said for w in row["warnings"])

    # a wheel built elsewhere, added under the key a build here has: the plan says cached
    wheel = make_wheel(tmp_path / "w", "fixture-cext", "1.0.0", {"fixture_cext/__init__.py": ""})
    res = cli("store", "add-wheel", spec, "fixture-cext", wheel, "--store", store, "--json")
    assert res.exit_code == 0, res.stderr  # type: ignore[attr-defined]
    assert res.json()["key"] == row["key"]  # type: ignore[attr-defined]
    (again,) = cli("store", "plan", spec, "--store", store, "--json").json()  # type: ignore[attr-defined]
    assert again["state"] == "cached" and again["key"] == row["key"]
    # MAX_JOBS is not keyed: unpinned, the same derivation is cached; MAX_JOBS is chosen
    spec = _cuda_fixture(repo, sdists("cext"), python_version, {"FLASH_ATTN_CUDA_ARCHS": "120"})
    (free,) = cli("store", "plan", spec, "--store", store, "--json").json()  # type: ignore[attr-defined]
    assert free["key"] == row["key"] and free["state"] == "cached"
    assert not free["memory"]["pinned"] and free["memory"]["fits"]
    assert free["memory"]["max_jobs"] == free["memory"]["safe_max_jobs"]


def test_state_of_asks_the_remote_cache_after_the_store(tmp_path: Path) -> None:
    from envbuild.sourcebuild.stored import state_of

    class Remote(Store):
        def available(self, key: str) -> bool:
            return key == "in-the-cache" or super().available(key)

    store = Remote(tmp_path / "store")
    assert state_of(store, "in-the-cache") == "remote"
    assert state_of(store, "nowhere") == "build"


def _figures_out(text: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "N", text)
