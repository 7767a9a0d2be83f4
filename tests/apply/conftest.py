"""Fixtures for the apply tests.

* a local wheel index (session): ``tinydep`` and two versions of a fake ``vllm`` whose console
  script serves /health (tests/cases/apply/fake_vllm.py), served by :mod:`support.pyindex`;
* ``source_index`` (session, reaches PyPI once): the same with F's C-extension fixture as an sdist
  and the setuptools/wheel its build needs, for source builds through apply;
* a local Hugging Face hub (session, :mod:`support.hfhub`) with two tiny models;
* ``experiment``: writes a spec into a repository and locks it with envbuild's own lock stage;
* ``machine``: the CLI works on a root with fake GPUs and a fake systemd that really runs units.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from support import hfhub, pyindex
from support.buildindex import BACKEND, UPLOADED
from support.fakesystemd import FakeSystemd, fake_host
from support.sdists import FIXTURES, pack_sdist
from support.wheels import make_wheel

from envbuild.apply import host as hostmod
from envbuild.apply.paths import HF_HOME, Paths
from envbuild.lock.core import lock_spec
from envbuild.spec import load_spec

CASES = Path(__file__).resolve().parent.parent / "cases" / "apply"
REV_A = "a" * 40
REV_B = "b" * 40
TOKEN = 'hf_secret_token_$with%odd"chars'


@dataclass(frozen=True)
class Index:
    url: str
    root: Path


@pytest.fixture(scope="session")
def uv_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("uv-cache")


def fake_vllm_wheel(directory: Path, version: str) -> Path:
    source = (CASES / "fake_vllm.py").read_text().replace("@VERSION@", version)
    return make_wheel(
        directory,
        "vllm",
        version,
        {"vllm/__init__.py": f'__version__ = "{version}"\n', "vllm/cli.py": source},
        scripts={"vllm": "vllm.cli:main"},
        requires=("tinydep>=1",),
    )


def vllm_that_will_not_load(directory: Path, work: Path) -> Path:
    """The fake vllm 0.0.3 with an extension module that needs a library nobody has (built with
    gcc here against a stub that is then left out): the link check's finding."""
    stub = work / "stub" / "libgone.so.1"
    stub.parent.mkdir(parents=True)
    src = work / "gone.c"
    src.write_text("int gone(void) { return 1; }\n")
    cc = ["gcc", "-shared", "-fPIC"]
    subprocess.run([*cc, "-Wl,-soname,libgone.so.1", "-o", str(stub), str(src)], check=True)
    src.write_text("int gone(void); int PyInit__fast(void) { return gone(); }\n")
    ext = work / "_fast.so"
    subprocess.run(
        [*cc, "-o", str(ext), str(src), f"-L{stub.parent}", "-l:libgone.so.1"], check=True
    )
    source = (CASES / "fake_vllm.py").read_text().replace("@VERSION@", "0.0.3")
    return make_wheel(
        directory,
        "vllm",
        "0.0.3",
        {
            "vllm/__init__.py": '__version__ = "0.0.3"\n',
            "vllm/cli.py": source,
            "vllm/_fast.cpython-311-x86_64-linux-gnu.so": ext.read_bytes(),
        },
        scripts={"vllm": "vllm.cli:main"},
        requires=("tinydep>=1",),
    )


def published_with_a_wrong_record(directory: Path) -> Path:
    """A real-world oddity (seen in pynvvideocodec 2.0.4 on PyPI): a wheel whose file was changed
    after its RECORD was written, so the installed file never matches its RECORD line."""
    wheel = make_wheel(directory, "oddrecord", "1.0", {"oddrecord/_native.py": "BUILD = 1\n"})
    with zipfile.ZipFile(wheel) as zf:
        members = [(info, zf.read(info)) for info in zf.infolist()]
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for info, data in members:
            if info.filename == "oddrecord/_native.py":
                data = b"BUILD = 2  # changed after RECORD was written\n"
            zf.writestr(info, data)
    return wheel


@pytest.fixture(scope="session")
def wheel_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    work = tmp_path_factory.mktemp("apply-index")
    dist = work / "dist"
    files = [
        make_wheel(dist, "tinydep", "1.0", {"tinydep/__init__.py": "VALUE = 1\n"}),
        fake_vllm_wheel(dist, "0.0.1"),
        fake_vllm_wheel(dist, "0.0.2"),
        vllm_that_will_not_load(dist, work / "cc"),
        published_with_a_wrong_record(dist),
        # a wheel with an empty folder (tokenspeed-triton ships tokenspeed_triton/instrumentation/)
        make_wheel(
            dist,
            "emptydir",
            "1.0",
            {"emptydir/__init__.py": ""},
            dirs=("emptydir/instrumentation",),
        ),
        # two distributions that install one path with other bytes (cuda-python and
        # cuda-bindings do, in vLLM 0.33's environment)
        make_wheel(dist, "clash-old", "1.0", {"clash/shared.py": "WHO = 'old'\n"}),
        make_wheel(dist, "clash-new", "1.0", {"clash/shared.py": "WHO = 'new'\n"}),
        # NVIDIA's run-time compiler from a CUDA newer than the fake driver's (13.1)
        make_wheel(dist, "nvidia-nvjitlink", "13.5.37", {"nvidia/nvjitlink/__init__.py": ""}),
    ]
    uploaded = datetime(2025, 6, 1, tzinfo=UTC)
    root = work / "root"
    pyindex.write_index(root, [(f, "simple", uploaded) for f in files])
    with pyindex.serve(root) as url:
        yield Index(url, root)


@pytest.fixture(scope="session")
def source_index(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Index]:
    """tinydep, the fake vllm 0.0.1, ``fixture-cext`` 1.0.0 as an sdist only
    (tests/cases/fixtures-src/cext) and the build backend it needs (from PyPI, once)."""
    work = tmp_path_factory.mktemp("apply-source-index")
    dist = work / "dist"
    files = [
        make_wheel(dist, "tinydep", "1.0", {"tinydep/__init__.py": "VALUE = 1\n"}),
        fake_vllm_wheel(dist, "0.0.1"),
        pack_sdist(FIXTURES / "cext", "fixture-cext", "1.0.0", dist),
    ]
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    argv += ["--only-binary=:all:", "--dest", str(work / "backend"), *BACKEND]
    if cert := os.environ.get("SSL_CERT_FILE"):
        argv += ["--cert", cert]
    subprocess.run(argv, check=True, capture_output=True)
    files += sorted((work / "backend").iterdir())
    root = work / "root"
    pyindex.write_index(root, [(f, "simple", UPLOADED) for f in files])
    with pyindex.serve(root) as url:
        yield Index(url, root)


def model_files(tag: str) -> dict[str, bytes]:
    return {
        "config.json": json.dumps({"model": tag}).encode(),
        "tokenizer.json": b'{"tokens": []}',
        "model.safetensors": (tag.encode() * 2000)[:5000],
        "README.md": b"not fetched: the spec's patterns leave it out",
    }


@pytest.fixture(scope="session")
def hub() -> Iterator[hfhub.Hub]:
    with hfhub.serve() as served:
        served.add("org/tiny-a", REV_A, model_files("a"))
        served.add("org/tiny-b", REV_B, model_files("b"))
        yield served


@pytest.fixture(autouse=True)
def _isolated(
    monkeypatch: pytest.MonkeyPatch, uv_cache: Path, tmp_path: Path, hub: hfhub.Hub
) -> None:
    """uv and huggingface_hub see only the tests' cache, index and hub."""
    monkeypatch.setenv("UV_CACHE_DIR", str(uv_cache))
    monkeypatch.setenv("ENVBUILD_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def hand_edit(path: Path, text: str) -> None:
    """What a person does to a read-only file: make it writable, change it."""
    os.chmod(path.parent, os.stat(path.parent).st_mode | stat.S_IWUSR)
    os.chmod(path, os.stat(path).st_mode | stat.S_IWUSR)
    path.write_text(path.read_text() + text)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


Experiment = Callable[..., Path]


@pytest.fixture
def experiment(repo: Path, wheel_index: Index) -> Experiment:
    """``experiment(name, vllm=..., repo_id=..., extra=[...])`` writes specs/<name>.toml from
    tests/cases/apply/specs/tiny.toml, locks it with ``lock_spec``, and returns its path."""

    def write(  # noqa: PLR0913
        name: str,
        *,
        vllm: str = "0.0.1",
        repo_id: str = "org/tiny-a",
        revision: str = REV_A,
        extra: tuple[str, ...] = (),
        size_gb: float = 0.001,
        port: int | None = None,
        index: str | None = None,
        lock: bool = True,
    ) -> Path:
        text = (CASES / "specs" / "tiny.toml").read_text()
        for key, value in {
            "NAME": name,
            "VLLM": vllm,
            "REPO": repo_id,
            "REV": revision,
            "SIZE_GB": repr(size_gb),
            "PORT": str(port or free_port()),
            "EXTRA": ", ".join(json.dumps(e) for e in extra),
            "INDEX": index or wheel_index.url,
        }.items():
            text = text.replace(f"@{key}@", value)
        path = repo / "specs" / f"{name}.toml"
        path.write_text(text)
        if lock:
            lock_spec(load_spec(path))
        return path

    return write


@dataclass
class Machine:
    root: Path
    options: dict[str, object]

    @property
    def paths(self) -> Paths:
        return Paths(self.root)

    @property
    def systemd(self) -> FakeSystemd:
        return FakeSystemd(self.paths)

    def env(self, **extra: str) -> dict[str, str]:
        """The environment for a CLI subprocess on this machine (tests/support on the path)."""
        env = {**os.environ, **extra}
        tests = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (tests, env.get("PYTHONPATH")) if p)
        env["FAKE_HOST"] = json.dumps(self.options)
        return env

    def spawn(self, *args: str | Path, **env: str) -> subprocess.Popen[str]:
        """``envbuild ARGS`` as a real process on this machine (own session, output piped)."""
        return subprocess.Popen(
            [sys.executable, "-m", "support.apply_main", *map(str, args)],
            env=self.env(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Machine]:
    """A root with fake GPUs and a fake systemd; the CLI (in-process) is pointed at it."""
    m = Machine(tmp_path / "root", {})
    m.root.mkdir()
    monkeypatch.setattr(
        hostmod, "real_host", lambda root, hf_home=HF_HOME: fake_host(root, hf_home, **m.options)
    )
    try:
        yield m
    finally:
        m.systemd.stop_all()
