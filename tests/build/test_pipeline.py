"""The whole build pipeline offline: a tiny rootfs tarball base, real tiny wheels served as
``file://`` URLs from a lock written with the lock's own models, real uv, tar and zstd.

Covers what needs no network: overlaps refused and resolved, a hash mismatch stopping the fetch
stage with the store left clean, one big distribution giving one layer digest in two images, and
a no-op rebuild that packs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import CliResult
from support.project import members, write_project
from support.wheels import make_wheel, ref

from envbuild.build.plan import BIG_BYTES
from envbuild.lock.wheels import WheelRef
from envbuild.store.core import Store
from envbuild.store.gc import collect

Build = Callable[..., CliResult]


@pytest.fixture
def overlapping(repo: Path) -> list[WheelRef]:
    d = repo / "wheels"
    return [
        ref(make_wheel(d, "cuda-bindings", "13.5.0", {"cuda/bindings.py": "NEW = 13\n"})),
        ref(make_wheel(d, "cuda-python", "12.6.2", {"cuda/bindings.py": "OLD = 12\n"})),
        ref(
            make_wheel(
                d,
                "hello-tool",
                "1.0",
                {"hello_tool.py": "def main(): pass\n"},
                scripts={"hello": "hello_tool:main"},
            )
        ),
    ]


def build(cli: Build, repo: Path, spec: Path, *args: str) -> CliResult:
    return cli("build", "--store", repo / "store", "--output", repo / "out", *args, spec)


def test_an_unresolved_overlap_stops_the_build(
    repo: Path, overlapping: list[WheelRef], cli: Build
) -> None:
    spec = write_project(repo, "clash", overlapping)
    result = build(cli, repo, spec)
    assert result.exit_code == 2
    assert "fetch: cuda-bindings and cuda-python both install 1 path(s)" in result.stderr
    assert "lib/python3.11/site-packages/cuda/bindings.py" in result.stderr
    assert '[image.overlaps] "cuda-bindings" = "cuda-python"' in result.stderr
    store = Store(repo / "store")
    assert not [k for k in store.derivations() if store.lookup(k).kind == "layer"]  # type: ignore[union-attr]
    assert not (repo / "out").exists()


def test_the_spec_decides_which_distribution_wins(
    repo: Path, overlapping: list[WheelRef], cli: Build
) -> None:
    spec = write_project(
        repo, "settled", overlapping, '[image.overlaps]\n"cuda-python" = "cuda-bindings"\n'
    )
    result = build(cli, repo, spec, "--json")
    assert result.exit_code == 0, result.stderr
    manifest = result.json()
    assert manifest["overlaps"] == [
        {
            "distributions": ["cuda-bindings", "cuda-python"],
            "paths": ["lib/python3.11/site-packages/cuda/bindings.py"],
            "winner": "cuda-bindings",
        }
    ]
    store = Store(repo / "store")
    path = "opt/venv/lib/python3.11/site-packages/cuda/bindings.py"
    holders = {}
    for layer in manifest["layers"]:
        files = members(store, layer["digest"], layer["media_type"])
        if path in files:
            holders[layer["name"]] = files[path]
        if "hello-tool==1.0" in layer["distributions"]:
            assert files["opt/venv/bin/hello"].startswith(b"#!/opt/venv/bin/python\n")
        if layer["kind"] == "base":
            assert "etc/hostname" in files
    assert list(holders.values()) == [b"NEW = 13\n"]
    loser = next(x for x in manifest["layers"] if "cuda-python==12.6.2" in x["distributions"])
    assert loser["leaves_out"] == {"cuda-python": ["lib/python3.11/site-packages/cuda/bindings.py"]}


def test_a_hash_mismatch_fails_the_fetch_and_leaves_the_store_clean(
    repo: Path, overlapping: list[WheelRef], cli: Build
) -> None:
    spec = write_project(repo, "liar", overlapping[2:], lie="hello-tool")
    result = build(cli, repo, spec)
    assert result.exit_code == 3
    assert "\nerror: fetch: hello_tool-1.0-py3-none-any.whl: got " in result.stderr
    store = Store(repo / "store")
    assert not list(store.tmp.iterdir())
    assert not store.blob_path("sha256:" + "0" * 64).exists()


def test_a_big_distribution_is_one_layer_in_every_image(repo: Path, cli: Build) -> None:
    d = repo / "wheels"
    # incompressible content so the wheel is big, as torch's is
    big = ref(make_wheel(d, "bigdist", "2.0", {"bigdist/blob.bin": _random(BIG_BYTES + 1024)}))
    a = ref(make_wheel(d, "only-a", "1.0", {"only_a.py": "A = 1\n"}))
    b = ref(make_wheel(d, "only-b", "1.0", {"only_b.py": "B = 1\n"}))
    first = build(cli, repo, write_project(repo, "img-a", [big, a]), "--json")
    assert first.exit_code == 0, first.stderr
    second = build(cli, repo, write_project(repo, "img-b", [big, b]), "--json")
    assert second.exit_code == 0, second.stderr
    layer_a = next(x for x in first.json()["layers"] if x["name"] == "bigdist")
    layer_b = next(x for x in second.json()["layers"] if x["name"] == "bigdist")
    assert layer_a == layer_b
    assert first.json()["image"] != second.json()["image"]
    # the second image found the layer in the store: a no-op rebuild of it packs nothing
    again = build(cli, repo, write_project(repo, "img-b", [big, b]))
    assert again.exit_code == 0, again.stderr
    assert "(0 rebuilt)" in again.stderr
    assert again.stdout.strip() == second.json()["image"]


def _random(n: int) -> bytes:
    import random

    return random.Random(0).randbytes(n)


def test_the_docker_archive_can_be_left_out(
    repo: Path, overlapping: list[WheelRef], cli: Build
) -> None:
    spec = write_project(repo, "lean", overlapping[2:])
    lean = build(cli, repo, spec, "--json", "--no-docker-archive")
    assert lean.exit_code == 0, lean.stderr
    assert "docker_archive" not in lean.json()["outputs"]
    assert not (repo / "out" / "docker-archive.tar").exists()
    full = build(cli, repo, spec, "--json")
    assert full.exit_code == 0, full.stderr
    assert full.json()["outputs"]["docker_archive"] == "docker-archive.tar"
    assert (repo / "out" / "docker-archive.tar").is_file()
    assert full.json()["image"] == lean.json()["image"]


def test_gc_keeps_what_the_image_needs(repo: Path, overlapping: list[WheelRef], cli: Build) -> None:
    spec = write_project(
        repo, "kept", overlapping, '[image.overlaps]\n"cuda-python" = "cuda-bindings"\n'
    )
    first = build(cli, repo, spec, "--json")
    assert first.exit_code == 0, first.stderr
    store = Store(repo / "store")
    kinds_before = sorted(store.lookup(k).kind for k in store.derivations())  # type: ignore[union-attr]
    collect(store)
    kinds_after = sorted(store.lookup(k).kind for k in store.derivations())  # type: ignore[union-attr]
    assert "overlaps" in kinds_after and kinds_after.count("layer") == kinds_before.count("layer")
    again = build(cli, repo, spec)
    assert again.exit_code == 0, again.stderr
    assert "(0 rebuilt)" in again.stderr
    assert again.stdout.strip() == first.json()["image"]


def test_layer_workers_defer_to_a_base_still_being_made() -> None:
    """While the base's future runs, a layer worker thread (and what it starts) is reniced;
    once the base is done, or for a base found in the store, it keeps its priority."""
    import concurrent.futures
    import os
    import subprocess
    import threading

    from envbuild.build import layerbuild

    def worker_nice(base: concurrent.futures.Future[None]) -> tuple[int, int]:
        seen: list[int] = []

        def run() -> None:
            layerbuild._defer(base)
            child = subprocess.run(["nice"], capture_output=True, text=True, check=True)
            seen.extend([os.getpriority(os.PRIO_PROCESS, 0), int(child.stdout)])

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
        return seen[0], seen[1]

    start = os.getpriority(os.PRIO_PROCESS, 0)
    running: concurrent.futures.Future[None] = concurrent.futures.Future()
    assert worker_nice(running) == (max(start, layerbuild.DEFERRED_NICE),) * 2
    assert os.getpriority(os.PRIO_PROCESS, 0) == start  # the calling thread is untouched
    done: concurrent.futures.Future[None] = concurrent.futures.Future()
    done.set_result(None)
    assert worker_nice(done) == (start, start)


def test_a_failed_base_is_reported_without_building_the_other_layers(
    repo: Path, cli: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The base fails while the first layer is being made: the layers not started yet are
    dropped, and the base's error is the build's."""
    import threading
    import time

    from envbuild.build import layerbuild
    from envbuild.errors import EnvironmentFailure
    from envbuild.pipeline import core as pipeline

    d = repo / "wheels"
    wheels = [ref(make_wheel(d, f"w{i}", "1.0", {f"w{i}.py": f"X = {i}\n"})) for i in range(6)]
    spec = write_project(repo, "broken-base", wheels)
    started = threading.Event()
    made: list[str] = []
    real_layer = layerbuild.build_layer

    def layer(plan_layer, *args, **kwargs):  # type: ignore[no-untyped-def]
        made.append(plan_layer.name)
        started.set()
        time.sleep(0.3)  # the base fails meanwhile
        return real_layer(plan_layer, *args, **kwargs)

    def base_stage(*args, **kwargs):  # type: ignore[no-untyped-def]
        started.wait(30)
        raise EnvironmentFailure("mmdebstrap exited with status 1")

    monkeypatch.setattr(layerbuild, "WORKERS", 1)
    monkeypatch.setattr(layerbuild, "build_layer", layer)
    monkeypatch.setattr(pipeline, "base_stage", base_stage)
    result = build(cli, repo, spec, "--json")
    assert result.exit_code != 0
    assert "base: mmdebstrap exited with status 1" in result.stderr
    assert len(made) == 1, made
    # without the failure: more layers than the one made, which the store kept
    monkeypatch.undo()
    again = build(cli, repo, spec)
    assert again.exit_code == 0, again.stderr
    state = {line.split()[0]: line.split()[-1] for line in again.stderr.splitlines()
             if line.split() and line.split()[-1] in ("cached", "rebuilt")}  # fmt: skip
    assert state.pop(made[0]) == "cached"
    assert len(state) >= 5 and set(state.values()) == {"rebuilt"}, state


def test_ctrl_c_during_the_layers_drops_the_layers_not_started(
    repo: Path, cli: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while the first layer is being made: the build exits 130 once that one is done,
    without making the layers still queued (the pool's exit would run them all)."""
    import signal
    import threading
    import time

    from envbuild.build import layerbuild
    from envbuild.errors import ExitCode

    d = repo / "wheels"
    wheels = [ref(make_wheel(d, f"w{i}", "1.0", {f"w{i}.py": f"X = {i}\n"})) for i in range(6)]
    spec = write_project(repo, "interrupted", wheels)
    made: list[str] = []
    real_layer = layerbuild.build_layer
    main = threading.main_thread().ident
    assert main is not None

    def layer(plan_layer, *args, **kwargs):  # type: ignore[no-untyped-def]
        made.append(plan_layer.name)
        if len(made) == 1:
            time.sleep(0.1)  # every layer is queued by now
            signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C, in the thread it lands in
        time.sleep(0.2)
        return real_layer(plan_layer, *args, **kwargs)

    monkeypatch.setattr(layerbuild, "WORKERS", 1)
    monkeypatch.setattr(layerbuild, "build_layer", layer)
    # a suite started with SIGINT ignored (`pytest … &` in a script) must not hide it here
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        result = build(cli, repo, spec)
    finally:
        signal.signal(signal.SIGINT, old)
    assert result.exit_code == ExitCode.INTERRUPTED, result.stderr
    assert "interrupted" in result.stderr
    assert len(made) == 1, made
