"""What a source build's key holds: the locked packages its build venv can see and no others, what
a rebuild says changed, and the flags that must be counts. No compiler runs here: the builder is
a subclass of :class:`Builder` that records each job and returns a ready wheel."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest
from sourcebuild.conftest import cext_lock, request, store_state, write_cext_spec
from support.recordingbuilder import RecordingBuilder
from support.wheels import make_wheel

from envbuild.errors import UserError
from envbuild.lock.closure import build_closure, build_roots, wheel_requires
from envbuild.lock.core import closure_requires
from envbuild.lock.model import (
    Hashes,
    Lock,
    LockedFile,
    LockedPackage,
)
from envbuild.sourcebuild.builder import Toolchain
from envbuild.sourcebuild.inputs import build_key, diff_inputs, inputs_of
from envbuild.sourcebuild.realize import realize
from envbuild.sourcebuild.requests import FileRef, SourceBuildRequest, build_requests
from envbuild.spec.load import LoadedSpec, load_spec
from envbuild.store.core import Store, derivation_key

#: torch and what it needs (one dependency only on aarch64, one only for an extra), plus
#: packages no build venv installs: tqdm and what only tqdm needs.
PACKAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "torch": (
        "2.14.0",
        (
            "filelock",
            "sympy>=1.13",
            "triton==3.8.0 ; platform_machine == 'aarch64'",
            "pytest ; extra == 'dev'",
        ),
    ),
    "sympy": ("1.14.0", ("mpmath<1.4,>=1.1.0",)),
    "mpmath": ("1.3.0", ()),
    "filelock": ("3.20.0", ()),
    "triton": ("3.8.0", ()),
    "pytest": ("9.0.0", ()),
    "tqdm": ("4.70.1", ("colorama ; platform_system == 'Windows'",)),
    "colorama": ("0.4.6", ()),
}
SEEN = ["filelock==3.20.0", "mpmath==1.3.0", "sympy==1.14.0", "torch==2.14.0"]
TOOLCHAIN = Toolchain(python="3.11.9", compilers={"gcc": "12.2.0", "g++": "12.2.0"})


def builder_for(wheel: Path) -> RecordingBuilder:
    return RecordingBuilder(wheel, TOOLCHAIN)


def locked(where: Path, name: str, version: str, requires: tuple[str, ...]) -> LockedPackage:
    wheel = make_wheel(where / f"{name}-{version}", name, version, {}, requires=requires)
    data = wheel.read_bytes()
    file = LockedFile(
        name=wheel.name,
        url=wheel.as_uri(),
        size=len(data),
        hashes=Hashes(sha256=hashlib.sha256(data).hexdigest()),
    )
    return LockedPackage(name=name, version=version, wheels=[file])


@pytest.fixture
def demo(repo: Path) -> LoadedSpec:
    return load_spec(write_cext_spec(repo))


@pytest.fixture
def lock_with(
    tmp_path: Path, demo: LoadedSpec, sdists: Callable[[str], FileRef]
) -> Callable[..., Lock]:
    """``lock_with(sympy=("1.15.0", (…)))``: the demo's lock, some packages bumped."""
    sdist = sdists("cext")

    def make(**bumped: tuple[str, tuple[str, ...]]) -> Lock:
        packages = {**PACKAGES, **bumped}
        return cext_lock(
            demo,
            sdist,
            requires_python="==3.11.*",
            packages=[locked(tmp_path / "wheels", n, *packages[n]) for n in sorted(packages)],
            requirements=["torch", "tqdm"],
        )

    return make


def key_of(req: SourceBuildRequest) -> str:
    builder = builder_for(Path())
    key = build_key(req, TOOLCHAIN, builder)
    # the key every lookup asks about is the store's key of the inputs a build records
    assert key == derivation_key("source-build", inputs_of(req, TOOLCHAIN, builder))
    return key


def changed(old: SourceBuildRequest, new: SourceBuildRequest) -> list[str]:
    """What a rebuild of ``new`` after ``old`` says changed."""
    builder = builder_for(Path())
    before, after = inputs_of(old, TOOLCHAIN, builder), inputs_of(new, TOOLCHAIN, builder)
    return [c.render() for c in diff_inputs(before, after)]


def only_request(demo: LoadedSpec, lock: Lock) -> SourceBuildRequest:
    (req,) = build_requests(demo, lock)
    return req


def test_the_key_holds_only_the_packages_the_build_venv_installs(
    demo: LoadedSpec, lock_with: Callable[..., Lock]
) -> None:
    req = only_request(demo, lock_with())
    assert req.constraints == SEEN  # not tqdm, colorama, triton (aarch64) or pytest (an extra)
    key = key_of(req)

    unrelated = only_request(demo, lock_with(tqdm=("4.71.0", ()), colorama=("0.4.7", ())))
    assert unrelated.constraints == SEEN and key_of(unrelated) == key

    deeper = only_request(demo, lock_with(mpmath=("1.3.1", ())))  # sympy's, so torch's
    assert key_of(deeper) != key
    assert changed(req, deeper) == ["constraints: mpmath==1.3.0 -> mpmath==1.3.1"]

    torch = PACKAGES["torch"][1]
    newer = only_request(demo, lock_with(torch=("2.14.1", (*torch, "networkx"))))
    assert key_of(newer) != key  # networkx is not locked: uv picks it at build time
    rendered = changed(req, newer)
    assert rendered[0] == "constraints: torch==2.14.0 -> torch==2.14.1"
    assert [r.split(":")[0] for r in rendered[1:]] == [
        "torch.sha256",
        "torch.version",
        "torch.wheel",
    ]
    assert rendered[2] == "torch.version: '2.14.0' -> '2.14.1'"


def test_roots_are_the_extra_build_requirements_and_torch(lock_with: Callable[..., Lock]) -> None:
    lock = lock_with(packaging=("26.3", ()), psutil=("7.2.2", ()))
    roots = build_roots("flash-attn", torch=False)
    assert roots == ["ninja", "packaging", "psutil", "setuptools", "wheel"]
    assert build_closure(lock, roots, wheel_requires) == ["packaging==26.3", "psutil==7.2.2"]
    assert build_closure(lock, build_roots("fixture-cext", torch=False), wheel_requires) == []
    both = build_closure(lock, [*roots, "torch"], wheel_requires)
    assert both == sorted([*SEEN, "packaging==26.3", "psutil==7.2.2"])
    dev = build_closure(lock, ["torch[dev]"], wheel_requires)
    assert dev == sorted([*SEEN, "pytest==9.0.0"])  # an extra's dependencies, when asked for


def test_the_lock_records_what_the_closure_reads_and_a_build_reads_it_back(
    demo: LoadedSpec, lock_with: Callable[..., Lock], tmp_path: Path
) -> None:
    """`envbuild lock` records the Requires-Dist of exactly the wheels the build closure follows
    (envbuild.lock.closure, the lock's only use of sourcebuild), and a request keyed from
    that record alone, its wheels gone, has the constraints reading the wheels gave."""
    lock = lock_with()
    recorded = closure_requires(demo, lock)
    names = {p.name for p in lock.packages for w in p.wheels if w.hashes.sha256 in recorded}
    assert sorted(names) == [c.split("==")[0] for c in SEEN]
    meta = lock.envbuild.model_copy(update={"requires": recorded})
    offline = lock.model_copy(update={"tool": lock.tool.model_copy(update={"envbuild": meta})})
    for wheel in (tmp_path / "wheels").rglob("*.whl"):
        wheel.unlink()
    assert only_request(demo, offline).constraints == SEEN


def test_a_bump_no_build_can_see_reuses_the_build(
    demo: LoadedSpec, lock_with: Callable[..., Lock], tmp_path: Path
) -> None:
    store = Store(tmp_path / "store")
    builder = builder_for(make_wheel(tmp_path / "out", "fixture-cext", "1.0.0", {}))
    first = realize(only_request(demo, lock_with()), builder, store)
    (job,) = builder.jobs
    assert job.constraints == SEEN  # the build venv is pinned to exactly what the key holds
    assert job.requires == ["setuptools>=61", "wheel", "torch==2.14.0"]

    again = realize(only_request(demo, lock_with(tqdm=("4.71.0", ()))), builder, store)
    assert again.reused and again.key == first.key and len(builder.jobs) == 1

    bumped = realize(only_request(demo, lock_with(sympy=("1.15.0", ("mpmath",)))), builder, store)
    assert not bumped.reused and bumped.previous == first.key and len(builder.jobs) == 2
    assert [c.render() for c in bumped.changes] == ["constraints: sympy==1.14.0 -> sympy==1.15.0"]


def test_list_inputs_are_compared_item_by_item() -> None:
    old = {"constraints": ["a==1", "b==1 ; sys_platform == 'linux'", "c==1"], "requires": []}
    new = {"constraints": ["a==2", "b==1 ; sys_platform == 'linux'", "d==1"], "requires": ["x"]}
    changes = diff_inputs(old, new)
    assert [c.render() for c in changes] == [
        "constraints: a==1 -> a==2",
        "constraints: removed c==1",
        "constraints: added d==1",
        "requires: added x",
    ]
    assert changes[0].model_dump() == {
        "key": "constraints",
        "old": "a==1",
        "new": "a==2",
        "item": True,
    }
    long_old, long_new = "x" * 100 + "1", "x" * 100 + "2"  # they differ past 80 characters
    (change,) = diff_inputs({"env": {"F": long_old}}, {"env": {"F": long_new}})
    assert change.render() == f"env.F: {long_old!r} -> {long_new!r}"


@pytest.mark.parametrize(
    ("env", "shown"),
    [
        ({"MAX_JOBS": "lots"}, "MAX_JOBS must be a positive whole number, not 'lots'"),
        ({"MAX_JOBS": "0"}, "MAX_JOBS must be a positive whole number, not '0'"),
        ({"NVCC_THREADS": "4.5"}, "NVCC_THREADS must be a positive whole number, not '4.5'"),
        ({"NVCC_THREADS": ""}, "NVCC_THREADS must be a positive whole number, not ''"),
    ],
)
def test_flags_that_are_not_counts_are_the_specs_mistake(
    sdists: Callable[[str], FileRef], tmp_path: Path, env: dict[str, str], shown: str
) -> None:
    store = Store(tmp_path / "store")
    before = store_state(store)
    builder = builder_for(make_wheel(tmp_path / "out", "fixture-cext", "1.0.0", {}))
    req = request(sdists("cext"), "fixture-cext", env=env, where="specs/x.toml:7")
    with pytest.raises(UserError) as err:  # not a ValueError: exit 2, not 4
        realize(req, builder, store)
    var = next(iter(env))
    assert err.value.message == f"specs/x.toml:7: builds.fixture-cext.env.{shown}"
    assert err.value.hint and err.value.hint.startswith(f'write it like {var} = "8"')
    assert builder.jobs == [] and store_state(store) == before


def test_dependencies_come_over_http_once_then_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wheel on an index that serves no PEP 658 ``.metadata`` file: the wheel itself is
    fetched (checked against the lock's sha256) and its METADATA kept, so the next look needs
    no index at all. A wheel whose bytes are not the locked ones is refused."""
    from support import pyindex

    from envbuild.errors import IntegrityError
    from envbuild.lock.wheels import WheelRef

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "index"
    (root / "files").mkdir(parents=True)
    wheel = make_wheel(root / "files", "sympy", "1.14.0", {}, requires=("mpmath<1.4,>=1.1.0",))
    data = wheel.read_bytes()
    with pyindex.serve(root) as url:
        ref = WheelRef(
            name="sympy", version="1.14.0", filename=wheel.name, url=f"{url}/files/{wheel.name}",
            sha256=hashlib.sha256(data).hexdigest(), size=len(data),
        )  # fmt: skip
        assert wheel_requires(ref) == ["mpmath<1.4,>=1.1.0"]
        lying = dataclasses.replace(ref, sha256="0" * 64)
        with pytest.raises(IntegrityError, match="the lock promises"):
            wheel_requires(lying)
        # an index that serves PEP 658's file: that is read, not the wheel
        other = make_wheel(root / "files", "filelock", "3.20.0", {})
        (root / "files" / f"{other.name}.metadata").write_text(
            "Metadata-Version: 2.1\nName: filelock\nVersion: 3.20.0\nRequires-Dist: served\n"
        )
        blob = other.read_bytes()
        served = WheelRef(
            name="filelock", version="3.20.0", filename=other.name,
            url=f"{url}/files/{other.name}", sha256=hashlib.sha256(blob).hexdigest(),
            size=len(blob),
        )  # fmt: skip
        assert wheel_requires(served) == ["served"]
    assert wheel_requires(ref) == ["mpmath<1.4,>=1.1.0"]  # the server is gone: from the cache
    kept = sorted(p.name for p in (tmp_path / "cache" / "envbuild" / "wheel-metadata").iterdir())
    assert kept == sorted(f"{r.sha256}.metadata" for r in (ref, served))
