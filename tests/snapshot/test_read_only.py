"""Taking a snapshot changes nothing and runs none of the inspected environment's code: the
interpreter is asked where its packages are without ``site``, so its ``.pth`` files never run."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from snapshot.conftest import site_packages


def test_a_pth_file_of_the_venv_does_not_run(cli: Any, venv: Path, tmp_path: Path) -> None:
    marker = tmp_path / "the-pth-ran"
    sp = site_packages(venv)
    (sp / "zz_side_effect.pth").write_text(
        f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')\n"
    )
    # `python -I` still imports site, which runs the .pth (else this test would prove nothing)
    subprocess.run([venv / "bin" / "python", "-I", "-c", "pass"], check=True)
    assert marker.exists()
    marker.unlink()

    out = tmp_path / "snap.json"
    for extra in ((), ("--quick",)):
        result = cli("snapshot", "--python", venv, "--no-models", "--no-docker", "--no-systemd",
                     "-o", out, *extra)  # fmt: skip
        assert result.exit_code == 0, result.stderr
        assert not marker.exists()
    [env] = json.loads(out.read_text())["pythons"]
    # what site would have said, found without it
    assert (env["prefix"], env["site_packages"]) == (str(venv), [str(sp)])
    assert env["executable"] == str(venv / "bin" / "python")
    assert [(d["name"], d["version"]) for d in env["distributions"]] == [
        ("alpha", "1.0"),
        ("beta", "1.0"),
    ]
    assert "zz_side_effect.pth" in env["unowned"]
