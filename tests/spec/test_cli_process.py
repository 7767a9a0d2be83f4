"""The installed CLI, as a separate process, on bad specs: exit 2, one located line per
problem on stderr, nothing on stdout, no traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spec.cases import materialize, problems_of


@pytest.mark.parametrize(
    "case", ["binary-file", "malformed-toml", "extends-cycle", "path-escapes", "all-at-once"]
)
def test_bad_spec_in_a_real_process(case, tmp_path):
    specs = materialize(case, tmp_path)
    code, problems = problems_of(specs / "spec.toml", cwd=specs)
    done = subprocess.run(
        [sys.executable, "-m", "envbuild", "validate", "spec.toml"],
        cwd=specs,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == code == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines() == [p.render() for p in problems]
