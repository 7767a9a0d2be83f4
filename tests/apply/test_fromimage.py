"""`apply --image` / `apply SPEC --from`: the registry as a substituter (issue #28).

An image built by envbuild's own build and pushed to a loopback registry is applied into two
rehearsal roots from the registry alone: PyPI unreachable (a proxy port that refuses), uv
forbidden, the wheels' index gone. Each generation's venv is compared with the image's /opt/venv
as skopeo copies and umoci unpacks it (real tools, not envbuild's reader); the second apply
fetches no blob (the registry's access log), and the two snapshots diff clean against the build
manifest and against each other.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
from pathlib import Path

import pytest
from apply.conftest import Machine
from support.project import write_project
from support.registry import Registry
from support.venvlisting import listing
from support.wheels import make_wheel, ref

from envbuild.apply import generations as gens
from envbuild.apply.paths import Paths
from envbuild.proc import core as proc

pytestmark = pytest.mark.registry


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once closed


def pushed_image(
    cli, repo: Path, registry: Registry, name: str, extra: str = ""
) -> tuple[Path, str]:
    """A small project built with envbuild's build and pushed: (spec, image reference)."""
    d = repo / "wheels"
    wheels = [
        ref(make_wheel(d, "tinydep", "1.0", {"tinydep/__init__.py": "VALUE = 1\n"})),
        ref(
            make_wheel(
                d,
                "hello-tool",
                "1.0",
                {"hello_tool.py": "def main():\n    print('hi')\n"},
                scripts={"hello": "hello_tool:main"},
            )
        ),
        ref(make_wheel(d, "emptydir", "1.0", {"emptydir/__init__.py": ""}, dirs=("emptydir/x",))),
    ]
    spec = write_project(repo, name, wheels)
    if extra:  # a [python] setting: the lock is of the spec as it now reads
        lock = repo / "lockfiles" / f"pylock.{name}.toml"
        from envbuild.spec import load_spec

        old = load_spec(spec).spec_hash()
        spec.write_text(spec.read_text().replace("[python]\n", f"[python]\n{extra}"))
        lock.write_text(lock.read_text().replace(old, load_spec(spec).spec_hash()))
    out = repo / f"out-{name}"
    built = cli("build", "--store", repo / "ci-store", "--output", out, spec)
    assert built.exit_code == 0, built.stderr
    pushed = cli("push", out, registry.ref("fleet/img", name), "--insecure")
    assert pushed.exit_code == 0, pushed.stderr
    digest = json.loads((out / "build-manifest.json").read_text())["image"]
    return spec, f"{registry.host}/fleet/img@{digest}"


def go_offline(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """From now on PyPI and every index are out of reach (a proxy that refuses; the loopback
    registry is reached directly), and uv is forbidden: a call of it fails and is recorded."""
    refused = f"http://127.0.0.1:{closed_port()}"
    for var in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY"):
        monkeypatch.setenv(var, refused)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("UV_OFFLINE", "1")
    calls: list[str] = []

    def no_uv() -> str:
        calls.append("uv")
        raise AssertionError("apply from an image must not run uv")

    monkeypatch.setattr(proc, "find_uv", no_uv)
    return calls


def image_venv(ref_: str, work: Path) -> Path:
    """The image's /opt/venv as skopeo copies and umoci unpacks it (umoci 0.4.7 reads no zstd
    layers: skopeo recompresses them as gzip, which leaves the tar streams as they are)."""
    layout = work / "layout"
    work.mkdir(parents=True)
    subprocess.run(
        ["skopeo", "copy", "--src-tls-verify=false", "--dest-compress-format=gzip",
         "--dest-compress", f"docker://{ref_}", f"oci:{layout}:img"],
        check=True, capture_output=True,
    )  # fmt: skip
    bundle = work / "bundle"
    subprocess.run(
        ["umoci", "unpack", "--rootless", "--image", f"{layout}:img", str(bundle)],
        check=True, capture_output=True,
    )  # fmt: skip
    return bundle / "rootfs" / "opt" / "venv"


def test_two_vms_apply_the_pushed_image_byte_for_byte_from_the_registry_alone(
    cli, repo: Path, registry: Registry, machine: Machine, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    spec, image = pushed_image(cli, repo, registry, "fleet")
    want = listing(image_venv(image, tmp_path / "real"))
    offline = go_offline(monkeypatch)
    shutil.rmtree(repo / "wheels")  # the wheels are gone: only the registry has the bytes
    assert want["bin/python"] == ("link", 0, "/usr/bin/python3")

    # VM 1: --image alone, the spec found in the repository by the image's label
    monkeypatch.chdir(repo)
    mark = registry.log_mark()
    first = cli("apply", "--image", image, "--insecure", "--root", machine.root, "--json")
    assert first.exit_code == 0, first.stderr
    a = first.json()
    fetched = registry.blob_gets(mark)
    assert a["image"]["blobs_fetched"] == len(fetched) >= 2  # the config and the venv layers
    gen_a = gens.current(machine.paths)
    assert gen_a is not None and gen_a.meta.image == image
    # the base's layer is never fetched: the VM has its own system
    manifest = json.loads((repo / "out-fleet" / "build-manifest.json").read_text())
    base = [layer["digest"] for layer in manifest["layers"] if layer["kind"] == "base"]
    assert base and not set(base) & set(fetched)

    # VM 2: another root, the same store: SPEC --from finds the image by its labels
    root_b = tmp_path / "root-b"
    root_b.mkdir()
    mark = registry.log_mark()
    second = cli("apply", spec, "--from", f"{registry.host}/fleet/img", "--insecure",
                 "--root", root_b, "--json")  # fmt: skip
    assert second.exit_code == 0, second.stderr
    b = second.json()
    assert registry.blob_gets(mark) == [] and b["image"]["blobs_fetched"] == 0
    assert b["image"]["trees_made"] == 0 and b["image"]["trees_reused"] == a["image"]["trees_made"]
    gen_b = gens.current(Paths(root_b))
    assert gen_b is not None and gen_b.meta.image == image
    assert offline == []  # no uv ran

    for gen in (gen_a, gen_b):
        have = listing(gen.venv)
        assert sorted(have) == sorted(want)
        for rel in sorted(want):
            assert have[rel] == want[rel], rel
        # read-only, as every generation; and exactly what its manifests list
        assert stat.S_IMODE(os.lstat(gen.venv / "bin" / "hello").st_mode) == 0o555
        assert stat.S_IMODE(os.lstat(gen.venv / "lib").st_mode) == 0o555
    verify = cli("generations", "--root", root_b, "--verify")
    assert verify.exit_code == 0, verify.stdout + verify.stderr
    # the image's script names /opt/venv/bin/python; the venv's interpreter runs it here
    ran = subprocess.run([gen_b.venv / "bin" / "python", gen_b.venv / "bin" / "hello"],
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert ran.stdout == "hi\n"

    # "the VM runs what CI built": the snapshots diff clean against the build manifest and
    # against each other
    snap_a, snap_b = a["snapshot"], b["snapshot"]
    for other in (repo / "out-fleet" / "build-manifest.json", snap_b):
        d = cli("diff", snap_a, other, "--json")
        assert d.exit_code == 0, d.stdout
        assert d.json()["different"] is False
        # what was compared: the packages (and, snapshot to snapshot, every file's RECORD)
        assert not any("packages" in n or ("RECORD" in n and other == snap_b)
                       for n in d.json()["not_compared"])  # fmt: skip

    # an edit in a shared tree is found by verify, as for any generation
    hello = gen_b.venv / "lib" / "python3.11" / "site-packages" / "hello_tool.py"
    os.chmod(hello, 0o644)
    hello.write_text("edited\n")
    assert cli("generations", "--root", root_b, "--verify").exit_code == 1


def test_an_image_for_another_python_is_refused_with_the_reason(
    cli, repo: Path, registry: Registry, machine: Machine, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    # the image names an interpreter that, on this machine, is Python 3.12
    fake = tmp_path / "py" / "python3"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\nexec /usr/bin/python3 -c 'import json, sys; print(json.dumps({"
        '"version": "3.12.1", "implementation": "cpython", "executable": sys.executable, '
        '"prefix": sys.prefix, "site": []}))\'\n'
    )
    fake.chmod(0o755)
    spec, image = pushed_image(cli, repo, registry, "otherpy", extra=f'interpreter = "{fake}"\n')
    go_offline(monkeypatch)
    result = cli("apply", spec, "--image", image, "--insecure", "--root", machine.root)
    assert result.exit_code == 2, result.stdout + result.stderr
    assert f"built for Python 3.11 at {fake}" in result.stderr
    assert "cpython 3.12.1, which cannot run that venv" in result.stderr
    assert not (machine.paths.generations).exists() or not any(
        p for p in machine.paths.generations.iterdir() if not p.name.startswith(".")
    )


def test_an_image_of_another_lock_is_refused(
    cli, repo: Path, registry: Registry, machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    _spec, image = pushed_image(cli, repo, registry, "first")
    other, _ = pushed_image(cli, repo, registry, "second")
    go_offline(monkeypatch)
    result = cli("apply", other, "--image", image, "--insecure", "--root", machine.root)
    assert result.exit_code == 2, result.stdout + result.stderr
    assert "was not built from specs/second.toml" in result.stderr


def test_the_unit_runs_the_image_venvs_vllm_with_the_venvs_interpreter(
    experiment, tmp_path: Path
) -> None:
    """The image's scripts name /opt/venv/bin/python (the venv is the image's, byte for byte):
    the unit of such a generation runs its vllm with the generation's own interpreter."""
    from envbuild.apply import unit as units
    from envbuild.spec import load_spec

    spec = load_spec(experiment("tiny-a", lock=False)).spec
    gen = tmp_path / "generations" / "1-x"
    settings = units.ServeSettings(
        generation=1, generation_path=gen, venv=gen / "venv", hf_home=tmp_path / "hf",
        env_file=tmp_path / "tiny-a.env", python=gen / "venv" / "bin" / "python",
    )  # fmt: skip
    text = units.render_unit(spec, "0" * 64, settings)
    (line,) = [x for x in text.splitlines() if x.startswith("ExecStart=")]
    assert line.startswith(f"ExecStart={gen}/venv/bin/python {gen}/venv/bin/vllm serve org/tiny-a ")


@pytest.mark.parametrize("damage", ["flipped", "cut"])
def test_a_damaged_layer_in_the_registry_is_refused_and_nothing_is_kept(
    cli, repo: Path, registry: Registry, machine: Machine, monkeypatch: pytest.MonkeyPatch,
    damage: str,
) -> None:  # fmt: skip
    spec, image = pushed_image(cli, repo, registry, f"damaged-{damage}")
    go_offline(monkeypatch)
    manifest = json.loads((repo / f"out-damaged-{damage}" / "build-manifest.json").read_text())
    biggest = max((x for x in manifest["layers"] if x["kind"] != "base"), key=lambda x: x["size"])
    blob = registry.blob_file(biggest["digest"])
    kept = blob.read_bytes()  # the registry is the session's: its blob is put back after
    data = bytearray(kept)
    if damage == "flipped":
        data[len(data) // 2] ^= 0xFF
    else:
        del data[-100:]
    blob.write_bytes(bytes(data))
    try:
        result = cli("apply", spec, "--image", image, "--insecure", "--root", machine.root)
    finally:
        blob.write_bytes(kept)
    assert result.exit_code == 3, result.stdout + result.stderr
    said = "does not match its digest" if damage == "flipped" else "its descriptor says"
    assert said in result.stderr
    assert gens.current(machine.paths) is None
    from envbuild.store.core import Store

    assert not Store(Path(os.environ["ENVBUILD_STORE"])).has_blob(biggest["digest"])


@pytest.mark.parametrize("step", [1, 4, 9])
def test_an_apply_killed_while_it_makes_trees_from_layers_leaves_a_consistent_store(
    cli, repo: Path, registry: Registry, machine: Machine, step: int
) -> None:
    import time

    from envbuild.store.core import Store
    from envbuild.store.trees import Trees

    spec, image = pushed_image(cli, repo, registry, f"killed-{step}")
    proc_ = machine.spawn("apply", spec, "--image", image, "--insecure", "--root", machine.root,
                          KILL_IN_TREES=str(step))  # fmt: skip
    _out, err = proc_.communicate(timeout=120)
    assert proc_.returncode == 137, err
    assert gens.current(machine.paths) is None and gens.list_generations(machine.paths) == []
    store = Store(Path(os.environ["ENVBUILD_STORE"]))
    trees = Trees(store)
    for key in trees.all():  # whatever is under trees/ is whole
        manifest = trees.manifest(key)
        assert manifest is not None and trees.verify(manifest) == []
    left = list(store.tmp.iterdir())  # an unpacking folder, a tree being made (early steps)
    for path in left:  # as old as a run killed a while ago
        os.utime(path, (time.time() - 3600, time.time() - 3600), follow_symlinks=False)
    r = cli("apply", spec, "--image", image, "--insecure", "--root", machine.root)
    assert r.exit_code == 0, r.stderr
    # the next apply removes the scratch folders; a blob cut short (blob-*.tmp) is gc's
    assert [p.name for p in store.tmp.iterdir() if not p.name.startswith("blob-")] == []
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0
    assert cli("gc").exit_code == 0 and list(store.tmp.iterdir()) == []
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0


PATCH = """\
--- a/tinypatch/__init__.py
+++ b/tinypatch/__init__.py
@@ -1,2 +1,2 @@
-GREETING = "as released"
+GREETING = "patched by envbuild"
 VERSION = 1
"""


def test_a_patched_distribution_comes_from_its_layer_at_its_patched_version(
    cli, repo: Path, registry: Registry, machine: Machine, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    released = 'GREETING = "as released"\nVERSION = 1\n'
    wheel = make_wheel(repo / "wheels", "tinypatch", "1.0", {"tinypatch/__init__.py": released})
    (repo / "specs" / "patches").mkdir(parents=True)
    (repo / "specs" / "patches" / "tinypatch.patch").write_text(PATCH)
    spec = write_project(repo, "patched", [ref(wheel)],
                         '[patches]\ntinypatch = ["patches/tinypatch.patch"]\n')  # fmt: skip
    out = repo / "out-patched"
    assert cli("build", "--store", repo / "ci-store", "--output", out, spec).exit_code == 0
    assert cli("push", out, registry.ref("fleet/img", "patched"), "--insecure").exit_code == 0
    digest = json.loads((out / "build-manifest.json").read_text())["image"]
    image = f"{registry.host}/fleet/img@{digest}"
    want = listing(image_venv(image, tmp_path / "real"))
    go_offline(monkeypatch)
    result = cli("apply", spec, "--image", image, "--insecure", "--root", machine.root)
    assert result.exit_code == 0, result.stdout + result.stderr
    gen = gens.current(machine.paths)
    assert gen is not None and gen.meta.packages["tinypatch"].startswith("1.0+envbuild.")
    have = listing(gen.venv)
    assert sorted(have) == sorted(want) and all(have[r] == want[r] for r in want)
    init = gen.venv / "lib" / "python3.11" / "site-packages" / "tinypatch" / "__init__.py"
    assert "patched by envbuild" in init.read_text()
