"""apply refuses a generation whose files will not load (the link check), unless the spec
accepts the finding with a reason."""

from __future__ import annotations

import pytest
from apply.conftest import Experiment, Machine

from envbuild.apply import generations as gens
from envbuild.lock import lock_spec
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

    spec.write_text(
        spec.read_text()
        + '\n[image.link_findings]\n"vllm:libgone.so.1" = "a plugin the test never loads"\n'
    )
    lock_spec(load_spec(spec))
    r = cli("apply", spec, "--root", machine.root)
    assert r.exit_code == 0, r.stderr
    assert gens.current(machine.paths) is not None
