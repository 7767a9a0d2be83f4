"""apply refuses a generation whose files will not load (the link check), unless the spec
accepts the finding with a reason."""

from __future__ import annotations

import pytest
from apply.conftest import Experiment, Machine

from envbuild.apply import generations as gens
from envbuild.lock.core import lock_spec
from envbuild.spec import load_spec

pytestmark = pytest.mark.slow


def test_a_generation_that_will_not_load_is_refused(
    cli, experiment: Experiment, machine: Machine
) -> None:
    spec = experiment("broken", vllm="0.0.3")
    r = cli("apply", spec, "--root", machine.root)
    assert r.exit_code == 2, r.stderr
    assert "generation 1: 1 file will not load" in r.stderr
    assert "vllm/_fast.cpython-311-x86_64-linux-gnu.so needs libgone.so.1" in r.stderr
    assert '"vllm:libgone.so.1"' in r.stderr  # the id the spec can accept it by
    assert gens.current(machine.paths) is None  # nothing was switched to

    # the generation exists now: preflight checks it, also in a dry run, and refuses it
    r = cli("apply", spec, "--root", machine.root, "--dry-run", "--json")
    assert r.exit_code == 2, r.stderr
    links = {c["name"]: c for c in r.json()["preflight"]["checks"]}["links"]
    assert links["status"] == "fail" and links["kind"] == "fit"
    assert links["message"].startswith("generation 1: 1 file will not load: vllm: ")
    assert "needs libgone.so.1" in links["message"]
    assert '[image.link_findings] with the reason: "vllm:libgone.so.1"' in links["hint"]
    r = cli("apply", spec, "--root", machine.root)
    assert r.exit_code == 2, r.stderr
    assert "links" in r.stdout and "fix: " in r.stdout and "preflight failed" in r.stdout
    assert gens.current(machine.paths) is None

    spec.write_text(
        spec.read_text()
        + '\n[image.link_findings]\n"vllm:libgone.so.1" = "a plugin the test never loads"\n'
    )
    lock_spec(load_spec(spec))
    r = cli("apply", spec, "--root", machine.root)
    assert r.exit_code == 0, r.stderr
    assert gens.current(machine.paths) is not None
    r = cli("apply", spec, "--root", machine.root, "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    links = {c["name"]: c for c in r.json()["preflight"]["checks"]}["links"]
    assert links["status"] == "ok", links
    assert "(1 accepted by the spec)" in links["message"]
