"""Generations assembled from the store's install trees (issue #19): the same files as a plain
``uv pip sync`` of the lock, what two experiments share held once, an edit through a hard link
named with every generation it reaches, ``--repair``, gc, and a kill anywhere."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from apply.conftest import Experiment, Machine, hand_edit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.venvlisting import listing

from envbuild.apply import generations as gens
from envbuild.apply.venv import INSTALL_LOCK, build_venv
from envbuild.store.core import Store
from envbuild.store.trees import Trees, read_manifest


def site(venv: Path) -> Path:
    return next((venv / "lib").glob("python3.*/site-packages"))


def store() -> Store:
    return Store(Path(os.environ["ENVBUILD_STORE"]))


def current(machine: Machine) -> gens.Generation:
    gen = gens.current(machine.paths)
    assert gen is not None
    return gen


def inode(path: Path) -> tuple[int, int]:
    st_ = os.lstat(path)
    return st_.st_dev, st_.st_ino


def two_experiments(
    cli, experiment: Experiment, machine: Machine
) -> tuple[gens.Generation, gens.Generation]:
    """tiny-a, then tiny-b (another vllm, the same tinydep) applied on one machine."""
    assert cli("apply", experiment("tiny-a"), "--root", machine.root).exit_code == 0
    first = current(machine)
    r = cli("apply", experiment("tiny-b", vllm="0.0.2"), "--root", machine.root, "--yes")
    assert r.exit_code == 0, r.stderr
    return first, current(machine)


def test_a_shared_generation_is_the_plain_install_file_for_file(
    cli, experiment: Experiment, machine: Machine, tmp_path: Path
) -> None:
    spec = experiment("tiny-a", lock=False)
    spec.write_text(spec.read_text() + '\n[packages]\noddrecord = "==1.0"\nemptydir = "==1.0"\n')
    from envbuild.lock.core import lock_spec
    from envbuild.spec import load_spec

    lock_spec(load_spec(spec))
    assert cli("apply", spec, "--root", machine.root).exit_code == 0
    gen = current(machine)
    assert gen.meta.link_mode == "hardlink" and set(gen.meta.trees) == {
        "emptydir",
        "oddrecord",
        "tinydep",
        "vllm",
    }
    plain = tmp_path / "plain"
    build_venv(plain, "3.11", gen.path / INSTALL_LOCK)
    shared, alone = listing(gen.venv, bytecode=False), listing(plain, bytecode=False)
    # folders too: an empty one a wheel ships is the plain install's
    assert shared.get("lib/python3.11/site-packages/emptydir/instrumentation", ("?",))[0] == "dir"
    assert sorted(shared) == sorted(alone)
    for rel in sorted(alone):
        assert shared[rel] == alone[rel], rel
    # every file a distribution installed is the tree's inode, read-only
    trees = Trees(store())
    cli_py = site(gen.venv) / "vllm" / "cli.py"
    tree_file = trees.files(gen.meta.trees["vllm"]) / cli_py.relative_to(gen.venv)
    assert inode(cli_py) == inode(tree_file)
    assert os.lstat(tree_file).st_nlink == 2  # the tree's and this venv's: no uv cache holds it
    assert stat.S_IMODE(os.lstat(tree_file).st_mode) == 0o444
    assert stat.S_IMODE(os.lstat(gen.venv / "bin" / "vllm").st_mode) == 0o555
    assert os.lstat(gen.venv / "bin" / "vllm").st_nlink == 2  # the tree's and this venv's


def test_two_distributions_with_one_path_follow_the_spec_never_install_order(
    cli, experiment: Experiment, machine: Machine
) -> None:
    from envbuild.lock.core import lock_spec
    from envbuild.spec import load_spec

    spec = experiment("tiny-a", lock=False)
    text = spec.read_text() + '\n[packages]\nclash-old = "==1.0"\nclash-new = "==1.0"\n'
    spec.write_text(text)
    lock_spec(load_spec(spec))
    r = cli("apply", spec, "--root", machine.root)
    assert r.exit_code == 2
    assert "clash-new and clash-old both install clash/shared.py with different bytes" in (r.stderr)
    assert gens.current(machine.paths) is None

    # the rule an image follows; "clash-new" sorts first, so a rule by name would lose it
    spec.write_text(text + '\n[image.overlaps]\n"clash-old" = "clash-new"\n')
    lock_spec(load_spec(spec))
    r = cli("apply", spec, "--root", machine.root)
    assert r.exit_code == 0, r.stderr
    gen = current(machine)
    assert (site(gen.venv) / "clash" / "shared.py").read_text() == "WHO = 'new'\n"
    assert gen.meta.overlaps == {"lib/python3.11/site-packages/clash/shared.py": "clash-new"}
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0


def test_a_second_experiment_links_what_it_shares_and_installs_only_the_rest(
    cli, experiment: Experiment, machine: Machine
) -> None:
    assert cli("apply", experiment("tiny-a"), "--root", machine.root).exit_code == 0
    first = current(machine)
    r = cli("apply", experiment("tiny-b", vllm="0.0.2"), "--root", machine.root, "--yes")
    assert r.exit_code == 0, r.stderr
    assert "installing 1 of 2 distributions into the store" in r.stderr
    second = current(machine)
    assert second.meta.trees["tinydep"] == first.meta.trees["tinydep"]
    assert second.meta.trees["vllm"] != first.meta.trees["vllm"]
    dep = Path("tinydep") / "__init__.py"
    assert inode(site(first.venv) / dep) == inode(site(second.venv) / dep)
    assert len(Trees(store()).all()) == 3
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0


def test_an_edit_through_a_hard_link_is_named_with_every_generation_it_reaches(
    cli, experiment: Experiment, machine: Machine
) -> None:
    _first, second = two_experiments(cli, experiment, machine)

    # a hand edit of generation 2's tinydep writes the inode generation 1 links too
    hand_edit(site(second.venv) / "tinydep" / "__init__.py", "DEBUG = True\n")
    r = cli("generations", "--root", machine.root, "--verify", "--json")
    assert r.exit_code == 1
    problems = {g["number"]: g["check"]["problems"] for g in r.json()["generations"]}
    want = (
        "venv: tinydep: tinydep/__init__.py was modified in its shared install tree "
        f"{second.meta.trees['tinydep'][:12]} (a write through a hard link: generations 1, 2 "
        "link it)"
    )
    assert problems == {1: [want], 2: [want]}


def test_an_editor_that_replaces_the_file_changes_one_generation_only(
    cli, experiment: Experiment, machine: Machine
) -> None:
    first, _second = two_experiments(cli, experiment, machine)
    # what `sed -i` does: a new file renamed over the old name
    target = site(first.venv) / "tinydep" / "__init__.py"
    os.chmod(target.parent, 0o755)
    new = target.with_name("sedXYZ")
    new.write_text(target.read_text().replace("1", "2"))
    os.replace(new, target)
    r = cli("generations", "--root", machine.root, "--verify", "--json")
    assert r.exit_code == 1
    problems = {g["number"]: g["check"]["problems"] for g in r.json()["generations"]}
    assert problems == {
        1: ["venv: tinydep: tinydep/__init__.py was modified (in generation 1 only)"],
        2: [],
    }


def test_repair_restores_the_tree_from_its_wheel_in_every_generation(
    cli, experiment: Experiment, machine: Machine
) -> None:
    spec_a = experiment("tiny-a")
    assert cli("apply", spec_a, "--root", machine.root).exit_code == 0
    first = current(machine)
    r = cli("apply", experiment("tiny-b", vllm="0.0.2"), "--root", machine.root, "--yes")
    assert r.exit_code == 0, r.stderr
    second = current(machine)
    original = (site(first.venv) / "tinydep" / "__init__.py").read_text()
    hand_edit(site(first.venv) / "tinydep" / "__init__.py", "DEBUG = True\n")
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 1

    r = cli("apply", spec_a, "--root", machine.root, "--repair", "--yes", "--json")
    assert r.exit_code == 0, r.stderr
    out = r.json()
    assert out["generation"] == first.number and out["reused"]
    assert any("installed again from its wheel" in line for line in out["repaired"])
    for gen in (first, second):
        assert (site(gen.venv) / "tinydep" / "__init__.py").read_text() == original
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0
    assert [g.number for g in gens.list_generations(machine.paths)] == [1, 2]


def test_gc_removes_a_tree_only_when_no_generation_links_it(
    cli, experiment: Experiment, machine: Machine
) -> None:
    first, second = two_experiments(cli, experiment, machine)
    trees = Trees(store())
    r = cli("gc", "--json")
    assert r.exit_code == 0 and r.json()["removed_trees"] == []

    r = cli("generations", "--root", machine.root, "--gc", "--keep", "1", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json()["removed"] == [first.name]
    assert r.json()["removed_trees"] == [first.meta.trees["vllm"]]
    assert sorted(trees.all()) == sorted(second.meta.trees.values())
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0

    # a tree whose root is lost but whose files a generation still links is kept
    for root in store().roots_dir.glob("gen-*.json"):
        root.unlink()
    r = cli("gc", "--json")
    assert r.json()["removed_trees"] == []
    assert sorted(r.json()["linked_trees"]) == sorted(set(second.meta.trees.values()))
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0


def test_a_generation_verifies_when_its_trees_are_gone_from_the_store(
    cli, experiment: Experiment, machine: Machine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert cli("apply", experiment("tiny-a"), "--root", machine.root).exit_code == 0
    monkeypatch.setenv("ENVBUILD_STORE", str(tmp_path / "another-store"))
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0
    hand_edit(site(current(machine).venv) / "tinydep" / "__init__.py", "X = 2\n")
    r = cli("generations", "--root", machine.root, "--verify")
    assert r.exit_code == 1 and "tinydep/__init__.py was modified (in generation 1" in r.stdout


# tiny-a's two trees take ~30 steps, the generation's freeze and rename follow
@pytest.mark.parametrize("step", [1, 3, 6, 10, 14, 18, 24, 30, 40])
def test_an_apply_killed_while_it_makes_trees_leaves_a_consistent_store(
    cli, experiment: Experiment, machine: Machine, step: int
) -> None:
    spec = experiment("tiny-a")
    proc = machine.spawn("apply", spec, "--root", machine.root, KILL_IN_TREES=str(step))
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 137, err
    assert gens.current(machine.paths) is None
    trees = Trees(store())
    for key in trees.all():  # whatever is under trees/ is whole
        manifest = trees.manifest(key)
        assert manifest is not None and trees.verify(manifest) == []
    left = list(store().tmp.iterdir())
    assert any(p.name.startswith(("stage-", "uv-cache-")) for p in left)  # it was staging
    for path in left:  # and as old as a run killed a while ago
        os.utime(path, (time.time() - 3600, time.time() - 3600), follow_symlinks=False)
    r = cli("apply", spec, "--root", machine.root)
    assert r.exit_code == 0, r.stderr
    # the next apply removes what the killed one left (as builds do), not only gc
    assert [p.name for p in store().tmp.iterdir()] == []
    assert cli("generations", "--root", machine.root, "--verify").exit_code == 0
    r = cli("gc", "--json")
    assert r.exit_code == 0 and r.json()["removed_trees"] == []
    assert not list(store().tmp.iterdir())


manifest_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=20,
)


@settings(max_examples=200, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.one_of(
        st.binary(max_size=300),
        manifest_json.map(lambda v: __import__("json").dumps(v).encode()),
        st.sampled_from(["../x", "/etc/passwd", "a/../../b", "a//b", "", "./a", "ok/file"]).map(
            lambda rel: (
                '{"format": 1, "key": "' + "a" * 64 + '", "dist": "d", "version": "1", '
                '"wheel": null, "layout": {}, "files": {"' + rel + '": {"sha256": "00", '
                '"size": 1, "mode": 292, "mtime_ns": 1}}}'
            ).encode()
        ),
    )
)
def test_a_manifest_is_read_or_refused_never_a_traceback(body: bytes, tmp_path: Path) -> None:
    path = tmp_path / "manifest.json"
    path.write_bytes(body)
    manifest = read_manifest(path, "a" * 64)
    if manifest is not None:
        for rel in manifest.files:  # every path it names is inside the venv
            assert (
                not rel.startswith("/") and ".." not in rel.split("/") and "" not in rel.split("/")
            )
            assert os.path.normpath(rel) == rel


def test_a_generation_is_exactly_its_manifest_after_apply(
    cli, experiment: Experiment, machine: Machine
) -> None:
    """apply runs the generation's Python as root (vLLM's parser probe, the unit itself), and
    root writes into 0555 folders: no bytecode may land in the generation."""
    assert cli("apply", experiment("tiny-a"), "--root", machine.root).exit_code == 0
    gen = current(machine)
    machine.systemd.stop_all()  # the unit has imported its vllm by now (it answered /health)
    written = [
        os.path.join(top, name)
        for top, dirs, names in os.walk(gen.path)
        for name in [*dirs, *names]
        if "__pycache__" in name or name.endswith(".pyc")
    ]
    assert written == []
    r = cli("generations", "--root", machine.root, "--verify", "--json")
    assert r.exit_code == 0, r.stdout


def test_verify_names_every_file_and_folder_the_manifest_does_not_list(
    cli, experiment: Experiment, machine: Machine
) -> None:
    assert cli("apply", experiment("tiny-a"), "--root", machine.root).exit_code == 0
    gen = current(machine)
    package = site(gen.venv) / "tinydep"
    os.chmod(package, 0o755)
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "__init__.cpython-311.pyc").write_bytes(b"\x00" * 16)
    (package / "extra" / "deeper").mkdir(parents=True)
    r = cli("generations", "--root", machine.root, "--verify", "--json")
    assert r.exit_code == 1
    [found] = r.json()["generations"]
    assert found["check"]["problems"] == [
        "venv: tinydep: tinydep/__pycache__/__init__.cpython-311.pyc was added",
        "venv: tinydep: tinydep/__pycache__/ was added",
        "venv: tinydep: tinydep/extra/ was added",
    ]
