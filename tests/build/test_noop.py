"""The no-op fast path (:mod:`envbuild.build.noop`): taken on a real no-op, in a fresh process
that imports none of the build's stages and parses no lock; not taken after a change to anything
the image is made from (the spec, a spec it extends, a patch, the lock), to any file of the
output folder or to what its root keeps in the store, or after a build killed while it wrote
the folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, CliResult
from support.outputs import build_args, folder_image
from support.project import write_project
from support.wheels import make_wheel, ref

Build = Callable[..., CliResult]
KILLPOINT = REPO / "tests" / "support" / "killpoint.py"
PATCH = """\
--- a/tinypatch/__init__.py
+++ b/tinypatch/__init__.py
@@ -1,1 +1,1 @@
-GREETING = "as released"
+GREETING = "patched"
"""
_SCRIPT = """\
import json, sys
from envbuild.cli.main import main
code = main(sys.argv[1:])
sys.stderr.write("\\nLOADED " + json.dumps(sorted(sys.modules)) + "\\n")
raise SystemExit(code)
"""
#: What a no-op told from its record does not import: the stages, the lock, the spec's models.
STAGES = {"envbuild.pipeline.core", "envbuild.lock", "envbuild.spec.model", "pydantic"}


def fresh_build(repo: Path, spec: Path, out: Path) -> tuple[subprocess.CompletedProcess[str], bool]:
    """``envbuild build`` in a new interpreter, and whether it took the fast path (imported
    none of :data:`STAGES`). Every build of these tests runs so: the record's fingerprint holds
    the environment and ``sys.path``, which differ inside pytest."""
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *build_args(repo, spec, out)],
        capture_output=True, text=True, check=False, cwd=repo,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    loaded = set(json.loads(done.stderr.rsplit("\nLOADED ", 1)[1]))
    return done, not loaded & STAGES


@pytest.fixture
def project(repo: Path) -> tuple[Path, Path]:
    """A spec extending a base file, with a patch, and its lock."""
    d = repo / "wheels"
    released = {"tinypatch/__init__.py": 'GREETING = "as released"\n'}
    wheels = [
        ref(make_wheel(d, "alpha", "1.0", {"alpha.py": "A = 1\n"})),
        ref(make_wheel(d, "tinypatch", "1.0", released)),
    ]
    (repo / "specs" / "patches").mkdir(parents=True, exist_ok=True)
    (repo / "specs" / "patches" / "tinypatch.patch").write_text(PATCH)
    (repo / "specs" / "base").mkdir(parents=True, exist_ok=True)
    (repo / "specs" / "base" / "common.toml").write_text("# shared by the experiments\n")
    extra = '[patches]\ntinypatch = ["patches/tinypatch.patch"]\n'
    spec = write_project(repo, "img-a", wheels, extra)
    spec.write_text('extends = "base/common.toml"\n' + spec.read_text())
    write_project(repo, "img-a", wheels, extra)  # relock: the spec now extends the base
    spec.write_text('extends = "base/common.toml"\n' + spec.read_text())
    return spec, repo / "out"


def test_a_no_op_is_told_from_the_record_alone(
    repo: Path, project: tuple[Path, Path], cli: Build
) -> None:
    spec, out = project
    first, fast = fresh_build(repo, spec, out)
    assert first.returncode == 0 and not fast, first.stderr
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    done, fast = fresh_build(repo, spec, out)
    assert done.returncode == 0 and fast, done.stderr
    assert done.stdout.strip() == first.stdout.strip()  # the image digest, as the full path says
    assert "(0 rebuilt)" in done.stderr and "patch tinypatch 1.0" in done.stderr
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before
    again = cli(*build_args(repo, spec, out, "--json"))  # the manifest, as the full path prints it
    assert again.json() == json.loads((out / "build-manifest.json").read_bytes())


def test_a_change_to_an_input_or_to_the_folder_takes_the_full_path(
    repo: Path, project: tuple[Path, Path], cli: Build
) -> None:
    spec, out = project
    assert fresh_build(repo, spec, out)[0].returncode == 0
    image = folder_image(out)
    assert image is not None
    lock = repo / "lockfiles" / "pylock.img-a.toml"
    patch = repo / "specs" / "patches" / "tinypatch.patch"
    base = repo / "specs" / "base" / "common.toml"

    def blob() -> Path:  # the image manifest's blob, a hard link to the store's
        return out / "oci" / "blobs" / "sha256" / str(folder_image(out)).split(":")[1]

    def flip_a_byte(path: Path) -> Callable[[], None]:
        def change() -> None:  # in place, as a damaged disk or a stray write would
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 1
            with path.open("r+b") as f:
                f.write(bytes(data))

        return change

    def comment(path: Path) -> Callable[[], None]:
        return lambda: path.write_text(path.read_text() + "# edited\n")

    def forget_a_derivation() -> None:  # one the folder's root keeps: the full path makes it again
        (root,) = (repo / "store" / "roots").glob("out-*.json")
        key = json.loads(root.read_bytes())["derivations"][0]
        (repo / "store" / "drv" / f"{key}.json").unlink()

    changes: dict[str, Callable[[], None]] = {
        "spec": comment(spec),  # a comment: the same spec hash, other bytes
        "extended base": comment(base),
        "lock": lambda: lock.write_bytes(lock.read_bytes() + b"\n"),
        "manifest": lambda: os.utime(out / "build-manifest.json"),
        "index.json": lambda: (out / "oci" / "index.json").write_text("{}"),
        "docker archive": flip_a_byte(out / "docker-archive.tar"),
        "image blob": lambda: flip_a_byte(blob())(),
        "store derivation": forget_a_derivation,
    }
    for what, change in changes.items():
        assert fresh_build(repo, spec, out)[1], f"before {what}"
        change()
        done, fast = fresh_build(repo, spec, out)
        assert not fast, what
        assert "up to date" not in done.stderr, what
        assert done.returncode == 0, (what, done.stderr)
        if what == "lock":  # the lock's hash is in the image's labels: another image, rightly
            image = folder_image(out)
        assert folder_image(out) == image, what
    # a patch edited: the lock no longer matches the spec; the full path says so
    patch.write_text(PATCH.replace('"patched"', '"patched again"'))
    done, fast = fresh_build(repo, spec, out)
    assert not fast and done.returncode == 2 and "envbuild lock" in done.stderr, done.stderr


def test_a_build_killed_in_the_folder_leaves_no_fast_no_op(
    repo: Path, project: tuple[Path, Path], cli: Build
) -> None:
    spec, out = project
    other = write_project(repo, "img-b", [ref(make_wheel(repo / "w", "beta", "1.0", {"b.py": ""}))])
    assert fresh_build(repo, spec, out)[0].returncode == 0
    image = folder_image(out)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}

    def kill_b_at(at: int) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(KILLPOINT), str(at), *build_args(repo, other, out)],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip

    def steps_now() -> int:
        """B's steps over A as the folder is now (what it still holds of B's blobs decides)."""
        whole = kill_b_at(0)
        assert fresh_build(repo, spec, out)[0].returncode == 0 and folder_image(out) == image
        return int(whole.stderr.strip().splitlines()[-1].split()[-1])

    steps_now()  # B over A once: its layers reach the store
    emptied = 0
    for part in ("middle", "last"):  # steps of writing the folder (killpoint.py counts them)
        steps = steps_now()
        at = steps // 2 if part == "middle" else steps - 1
        killed = kill_b_at(at)
        assert killed.returncode == 137, killed.stderr
        held = folder_image(out)
        done, fast = fresh_build(repo, spec, out)
        assert done.returncode == 0, done.stderr
        if held is None:  # killed after B's build removed the manifest
            emptied += 1
            assert not fast, at
        assert folder_image(out) == image
        assert fresh_build(repo, spec, out)[1]
    assert emptied >= 1  # the last step is the manifest: killed before it, the folder is empty
