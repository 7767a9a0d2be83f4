"""Output folders are atomic, and gc keeps what each output folder holds (offline builds).

The kill test builds image A into X, then kills a build of image B into X (``os._exit`` at a
chosen step of writing the folder, as SIGKILL would: no cleanup runs) at many points, and after
each one checks the rules: a folder with a build manifest holds exactly that image (index.json,
every blob hashing to its name, the docker archive naming the same config); a folder without one
is not called current, and the next build of A into it exits 0 and leaves A there, complete.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, CliResult
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.outputs import build_args, folder_image, sha
from support.project import write_project
from support.wheels import make_wheel, ref

from envbuild import scratch
from envbuild.store.core import Store, output_root_name

Build = Callable[..., CliResult]
KILLPOINT = REPO / "tests" / "support" / "killpoint.py"


@pytest.fixture
def two_specs(repo: Path) -> tuple[Path, Path]:
    d = repo / "wheels"
    a = ref(make_wheel(d, "alpha", "1.0", {"alpha.py": "A = 1\n"}))
    b = ref(make_wheel(d, "beta", "1.0", {"beta.py": "B = 2\n" * 2000}))
    return write_project(repo, "img-a", [a]), write_project(repo, "img-b", [a, b])


def names_only_whole_images(out: Path) -> None:
    """Whatever the folder holds, what names an image names a whole one: ``oci/index.json``
    (read by real skopeo too) and the docker archive."""
    index = out / "oci" / "index.json"

    def inspect(ref: str) -> subprocess.CompletedProcess[str]:
        argv = ["skopeo", "inspect", f"oci:{out / 'oci'}{ref}"]
        return subprocess.run(argv, capture_output=True, text=True, check=False)

    if not index.exists():
        for ref in ("", ":img-a", ":img-b"):
            shown = inspect(ref)
            assert shown.returncode != 0, shown.stdout  # no image is shown
    else:
        for entry in json.loads(index.read_bytes())["manifests"]:
            if "artifactType" not in entry:  # the image (the SBOM is listed beside it)
                shown = inspect(f":{entry['annotations']['org.opencontainers.image.ref.name']}")
                assert shown.returncode == 0, shown.stderr
        blobs = out / "oci" / "blobs" / "sha256"
        for entry in json.loads(index.read_bytes())["manifests"]:
            doc = json.loads((blobs / entry["digest"][7:]).read_bytes())
            for desc in [doc["config"], *doc["layers"]]:
                assert sha(blobs / desc["digest"][7:]) == desc["digest"][7:], desc
    archive = out / "docker-archive.tar"
    if archive.exists():
        with tarfile.open(archive) as tf:
            names = set(tf.getnames())
            docker = json.loads(tf.extractfile("manifest.json").read())  # type: ignore[union-attr]
            assert {docker[0]["Config"], *docker[0]["Layers"]} <= names


def killed_build(repo: Path, spec: Path, out: Path, at: int, log: Path | None = None) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    if log is not None:
        env["KILLPOINT_LOG"] = str(log)
    done = subprocess.run(
        [sys.executable, str(KILLPOINT), str(at), *build_args(repo, spec, out)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if at == 0:
        assert done.returncode == 0, done.stderr
        return int(done.stderr.strip().splitlines()[-1].split()[-1])
    return done.returncode


def test_a_killed_build_never_leaves_a_folder_called_current(
    repo: Path, two_specs: tuple[Path, Path], cli: Build
) -> None:
    spec_a, spec_b = two_specs
    out = repo / "out"
    first = cli(*build_args(repo, spec_a, out))
    assert first.exit_code == 0, first.stderr
    image_a = first.stdout.strip()
    # B over A once (its layers and blobs reach the store), then again, counting the steps
    killed_build(repo, spec_b, out, 0)
    image_b = folder_image(out)
    assert image_b not in (None, image_a)
    assert cli(*build_args(repo, spec_a, out)).exit_code == 0
    log = repo / "steps.log"
    steps = killed_build(repo, spec_b, out, 0, log)
    lines = log.read_text().splitlines()
    assert len(lines) == steps > 5

    def step(kind: str, name: str) -> int:
        return next(int(x.split()[0]) for x in lines if x.split()[1] == kind and name in x)

    said_a = step("unlink", "/out/build-manifest.json")  # the first write into the folder
    says_b = next(  # the manifest renamed into place: the last
        int(x.split()[0])
        for x in lines
        if x.split()[1] == "replace" and x.endswith("/out/build-manifest.json")
    )
    index_step = step("replace", "/out/oci/index.json")
    archive_step = step("replace", "/out/docker-archive.tar")
    blob_steps = [int(x.split()[0]) for x in lines if "/out/oci/blobs/sha256/" in x]
    # what names the image comes after every blob of it, the manifest after all
    assert said_a < max(blob_steps) < archive_step < index_step < says_b
    # the case found: killed once index.json names B (and a sample of every other point)
    points = sorted({1, said_a, said_a + 1, index_step + 1, says_b, says_b + 1, steps,
                     *random.Random(12).sample(range(1, steps + 1), min(8, steps))})  # fmt: skip
    assert cli(*build_args(repo, spec_a, out)).exit_code == 0
    for at in points:  # each starts from A, complete, in the folder
        assert killed_build(repo, spec_b, out, at) == 137, at
        held = folder_image(out)  # checks that all in the folder agrees with what it says
        want = image_a if at <= said_a else None if at <= says_b else image_b
        assert held == want, (at, held)
        names_only_whole_images(out)
        if held is None:  # and the folder's readers say so
            refused = cli("load", out)
            assert refused.exit_code == 2 and "unfinished build" in refused.stderr, at
            if (out / "docker-archive.tar").exists():
                refused = cli("load", out / "docker-archive.tar")
                assert refused.exit_code == 2 and "unfinished build" in refused.stderr, at
        after = cli(*build_args(repo, spec_a, out))
        assert after.exit_code == 0, (at, after.stderr)
        assert after.stdout.strip() == image_a
        assert folder_image(out) == image_a, at
        assert not [p for p in out.rglob(".*.tmp")], at
        assert not [p for p in (repo / "store" / "tmp").iterdir() if p.name.startswith("blob-")]


@pytest.mark.parametrize(
    "sig",
    [
        signal.SIGKILL,
        signal.SIGINT,
    ],
    ids=["SIGKILL", "Ctrl-C"],
)
def test_the_found_case_with_a_real_signal(
    repo: Path, two_specs: tuple[Path, Path], cli: Build, sig: signal.Signals
) -> None:
    """Build A into X; kill a build of B into X (SIGKILL, or Ctrl-C) once X/oci/index.json
    names B; build A again: it must write X again, not exit 0 over B's index."""
    spec_a, spec_b = two_specs
    out = repo / "out"
    first = cli(*build_args(repo, spec_a, out))
    assert first.exit_code == 0, first.stderr
    image_a = first.stdout.strip()
    log = repo / "steps.log"
    killed_build(repo, spec_b, out, 0)  # B's layers into the store
    assert cli(*build_args(repo, spec_a, out)).exit_code == 0
    killed_build(repo, spec_b, out, 0, log)
    lines = log.read_text().splitlines()
    after_index = 1 + next(
        int(x.split()[0]) for x in lines if x.split()[1] == "replace" and "/oci/index.json" in x
    )
    assert cli(*build_args(repo, spec_a, out)).exit_code == 0
    marker = repo / "paused"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]),
        "KILLPOINT_PAUSE": f"{after_index}:{marker}",
    }
    # the child inherits SIGINT ignored, as from a test run started in a script's background
    # (`pytest … &`): the Ctrl-C case must not depend on how the suite was started
    ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = subprocess.Popen(
            [sys.executable, str(KILLPOINT), "0", *build_args(repo, spec_b, out)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        signal.signal(signal.SIGINT, ignored)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    index = json.loads((out / "oci" / "index.json").read_bytes())
    assert index["manifests"][0]["digest"] != image_a  # X/oci/index.json has changed
    child.send_signal(sig)
    try:
        _, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:  # a hang fails here, and leaves no process behind
            child.kill()
            child.communicate()
    assert child.returncode == (-9 if sig == signal.SIGKILL else 130), err
    assert folder_image(out) is None
    again = cli(*build_args(repo, spec_a, out))
    assert again.exit_code == 0, again.stderr
    assert again.stdout.strip() == image_a
    assert folder_image(out) == image_a


def test_a_changed_output_file_is_not_called_current(
    repo: Path, two_specs: tuple[Path, Path], cli: Build
) -> None:
    """The no-op build trusts the folder only while what it wrote is unchanged (its stat)."""
    spec_a, _ = two_specs
    out = repo / "out"
    assert cli(*build_args(repo, spec_a, out)).exit_code == 0
    image_a = folder_image(out)
    archive = out / "docker-archive.tar"
    mine = out / ".notes.tmp"  # not a file a build writes: left alone
    mine.write_text("mine\n")
    left = out / ".docker-archive.tar.k1ll3d.tmp"  # what a killed build left: removed
    left.write_bytes(b"half an archive")
    good = archive.read_bytes()
    archive.write_bytes(good[:-1024])  # truncated by hand, say
    again = cli(*build_args(repo, spec_a, out))
    assert again.exit_code == 0, again.stderr
    assert archive.read_bytes() == good
    assert mine.exists() and not left.exists()
    index = out / "oci" / "index.json"
    index.write_text("{}")
    assert cli(*build_args(repo, spec_a, out)).exit_code == 0
    assert folder_image(out) == image_a
    # an untouched folder is not written at all
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    assert cli(*build_args(repo, spec_a, out)).exit_code == 0
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before


def test_gc_roots_are_per_output_folder(
    repo: Path, two_specs: tuple[Path, Path], cli: Build
) -> None:
    """gzip into X, then the default build into Y, then gc: X's base and layers stay, and the
    next build of X rebuilds nothing; once X is removed, gc lets its image go."""
    spec_a, _ = two_specs
    x, y = repo / "x", repo / "y"
    gz = cli(*build_args(repo, spec_a, x, "--compression", "gzip", "--json"))
    assert gz.exit_code == 0, gz.stderr
    zs = cli(*build_args(repo, spec_a, y, "--json"))
    assert zs.exit_code == 0, zs.stderr
    gz_blobs = {layer["digest"] for layer in gz.json()["layers"]}
    assert gz_blobs.isdisjoint({layer["digest"] for layer in zs.json()["layers"]})
    store = Store(repo / "store")
    assert {output_root_name(x), output_root_name(y)} <= set(store.roots())
    assert cli("gc", "--store", repo / "store").exit_code == 0
    assert all(store.has_blob(d) for d in gz_blobs)
    again = cli(*build_args(repo, spec_a, x, "--compression", "gzip"))
    assert again.exit_code == 0, again.stderr
    assert "(0 rebuilt)" in again.stderr
    # another image into X lets go of the gzip one; so does removing the folder
    import shutil

    shutil.rmtree(x)
    result = cli("gc", "--store", repo / "store", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["removed_roots"] == [output_root_name(x)]
    assert not any(store.has_blob(d) for d in gz_blobs - {zs.json()["layers"][0]["digest"]})
    assert store.has_blob(zs.json()["image"])


def test_what_killed_runs_left_is_removed(
    repo: Path,
    two_specs: tuple[Path, Path],
    cli: Build,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """uv's wheel folders in the temporary directory and staging folders in memory: a later
    build removes the first, `gc` both and every other temporary folder kind (older than a
    minute and unlocked, like scratch's)."""
    tmp, shm = tmp_path / "tmp", tmp_path / "shm"
    tmp.mkdir()
    shm.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp))
    monkeypatch.setenv(scratch.ENV, str(shm))
    old = time.time() - 3600

    def leftover(parent: Path, name: str) -> Path:
        path = parent / name
        (path / "inner").mkdir(parents=True)
        (path / "inner" / "requirements.txt").write_text("x\n")
        os.utime(path, (old, old))
        return path

    wheels = leftover(tmp, "envbuild-wheels-killed")
    fresh = tmp / "envbuild-wheels-running"  # a minute old at most: maybe not locked yet
    fresh.mkdir()
    other = leftover(tmp, "envbuild-dockerd-notours")  # not a locked kind: never swept
    spec_a, _ = two_specs
    assert cli(*build_args(repo, spec_a, repo / "out")).exit_code == 0
    assert not wheels.exists() and fresh.exists() and other.exists()
    stage = leftover(shm, "envbuild-stage-killed")
    wheels = leftover(tmp, "envbuild-wheels-killed2")
    auth = leftover(tmp, "envbuild-auth-killed")  # gc sweeps every kind (tests/build/test_scratch)
    result = cli("gc", "--store", repo / "store", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["removed_scratch"] == 3
    assert not stage.exists() and not wheels.exists() and not auth.exists()
    assert fresh.exists() and other.exists()


def test_the_printed_time_is_the_wall_time(
    repo: Path, two_specs: tuple[Path, Path], cli: Build, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The base runs beside the layers: the line shows the build's wall time, not the stages'
    sum (here the base and the layers each take at least 0.6 s, side by side)."""
    from envbuild.build import layerbuild
    from envbuild.pipeline import core as pipeline

    real_base, real_layer = pipeline.base_stage, layerbuild.build_layer

    def slow(fn: Callable[..., object]) -> Callable[..., object]:
        def run(*a: object, **k: object) -> object:
            time.sleep(0.6)
            return fn(*a, **k)

        return run

    monkeypatch.setattr(pipeline, "base_stage", slow(real_base))
    monkeypatch.setattr(layerbuild, "build_layer", slow(real_layer))
    spec_a, _ = two_specs
    start = time.perf_counter()
    result = cli(*build_args(repo, spec_a, repo / "out"))
    took = time.perf_counter() - start
    assert result.exit_code == 0, result.stderr
    line = next(x for x in result.stderr.splitlines() if x.startswith("built "))
    printed = float(line.split(" in ")[1].split(" s")[0])
    assert printed <= took + 0.05
    assert printed >= 0.6


HOSTILE = st.one_of(
    st.binary(max_size=300),
    st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(1, 200_000).map(lambda n: b'{"image":' * n),
    st.just(b'{"image": "sha256:' + b"0" * 64 + b'"}\n'),
    st.just(b"\xff\xfe" + "é".encode("utf-16")),
)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(which=st.sampled_from(["build-manifest.json", "oci/index.json", "oci/oci-layout"]),
       data=HOSTILE)  # fmt: skip
def test_whatever_the_folder_holds_the_next_build_and_gc_are_right(
    repo: Path, two_specs: tuple[Path, Path], cli: Build, which: str, data: bytes
) -> None:
    """A folder's files, replaced by anything (random bytes, deep nesting, another image's
    digest): the build writes the folder again and exits 0, gc exits 0; never a traceback."""
    spec_a, _ = two_specs
    out = repo / "out"
    first = cli(*build_args(repo, spec_a, out))
    assert first.exit_code == 0, first.stderr
    path = out / which
    path.unlink()
    path.write_bytes(data)
    gc = cli("gc", "--store", repo / "store", "--dry-run")
    assert gc.exit_code == 0, gc.stderr
    again = cli(*build_args(repo, spec_a, out))
    assert again.exit_code == 0, again.stderr
    assert folder_image(out) == first.stdout.strip()


def test_two_builds_into_one_folder_take_turns(
    repo: Path, two_specs: tuple[Path, Path], cli: Build
) -> None:
    """Both finish; the folder holds one of them, complete, and its root says which."""
    spec_a, spec_b = two_specs
    out = repo / "out"
    for spec in (spec_a, spec_b):  # their layers into the store first
        assert cli(*build_args(repo, spec, repo / f"warm-{spec.stem}")).exit_code == 0
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "envbuild", *build_args(repo, spec, out)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for spec in (spec_a, spec_b, spec_a, spec_b)
    ]
    printed = set()
    for child in children:
        stdout, stderr = child.communicate(timeout=300)
        assert child.returncode == 0, stderr
        printed.add(stdout.strip())
    held = folder_image(out)
    assert held in printed
    root = Store(repo / "store").get_root(output_root_name(out))
    assert root is not None and root.image == held


def test_builds_with_different_stores_into_one_folder_take_turns(
    repo: Path, two_specs: tuple[Path, Path], cli: Build
) -> None:
    """The folder's lock was in the store: two builds with different stores wrote one folder at
    once (4 of 12 failed: "cannot write docker-archive.tar: No such file or directory", one
    build's sweep removing the other's temp file). The lock is in the folder now: a build of
    B is held while it writes the docker archive, a build of A with another store into the
    same folder waits for it, and both finish with the folder whole."""
    spec_a, spec_b = two_specs
    out = repo / "out"
    stores = {spec_a: repo / "store-a", spec_b: repo / "store-b"}

    def args(spec: Path, into: Path) -> list[str]:
        return ["build", "--store", str(stores[spec]), "--output", str(into), str(spec)]

    for spec in stores:  # each store gets its layers first
        assert cli(*args(spec, repo / f"warm-{spec.stem}")).exit_code == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    log = repo / "steps.log"
    counted = subprocess.run(
        [sys.executable, str(KILLPOINT), "0", *args(spec_b, repo / "counted")],
        env={**env, "KILLPOINT_LOG": str(log)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert counted.returncode == 0, counted.stderr
    writing = next(  # a step while the archive's temp file is being written
        int(x.split()[0]) for x in log.read_text().splitlines() if x.split()[1] == "tar-buffer"
    )
    marker = repo / "paused"
    held = subprocess.Popen(
        [sys.executable, str(KILLPOINT), "0", *args(spec_b, out)],
        env={**env, "KILLPOINT_PAUSE": f"{writing}:{marker}:5"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert held.poll() is None and time.monotonic() < deadline, held.communicate()
        time.sleep(0.05)
    other = subprocess.Popen(
        [sys.executable, "-m", "envbuild", *args(spec_a, out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    printed = set()
    for child in (held, other):
        stdout, stderr = child.communicate(timeout=300)
        assert child.returncode == 0, stderr
        printed.add(stdout.strip().splitlines()[-1] if stdout.strip() else "")
    assert folder_image(out) in printed  # whole, and one of the two
    names_only_whole_images(out)
    for _ in range(3):  # and started at once, as a user would
        children = [
            subprocess.Popen(
                [sys.executable, "-m", "envbuild", *args(spec, out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for spec in stores
        ]
        printed = set()
        for child in children:
            stdout, stderr = child.communicate(timeout=300)
            assert child.returncode == 0, stderr
            printed.add(stdout.strip())
        assert folder_image(out) in printed and len(printed) == 2
        names_only_whole_images(out)


def test_nothing_in_an_unfinished_folder_is_loaded(tmp_path: Path) -> None:
    """`load DIR` of an unfinished folder was refused, `load DIR/docker-archive.tar` was not."""
    from envbuild.build.load import find_archive
    from envbuild.errors import InputFileError

    out = tmp_path / "out"
    (out / "oci" / "blobs" / "sha256").mkdir(parents=True)
    archive = out / "docker-archive.tar"
    archive.write_bytes(b"")
    blob = out / "oci" / "blobs" / "sha256" / ("0" * 64)
    blob.write_bytes(b"")
    for path in (out, archive, blob):
        with pytest.raises(InputFileError, match="unfinished build"):
            find_archive(path)
    (out / "build-manifest.json").write_text("{}")
    assert find_archive(out) == archive and find_archive(archive) == archive
    alone = tmp_path / "elsewhere" / "image.tar"  # a tar outside any output folder
    alone.parent.mkdir()
    alone.write_bytes(b"")
    assert find_archive(alone) == alone
