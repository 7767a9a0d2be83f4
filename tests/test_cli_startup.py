"""What a whole ``envbuild`` process imports before it answers: ``--help`` names the commands from
light data alone, and a command imports only the stages it drives (issue #26: a second of
pydantic models and templates for ``--help`` is what users feel first)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: Packages that cost tens of milliseconds each and that no light command needs.
HEAVY = ("docker", "jinja2", "huggingface_hub", "cyclonedx", "elftools", "rich")

_SCRIPT = """\
import json, sys
from envbuild.cli.main import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print("\\nLOADED " + json.dumps(sorted(sys.modules)))
raise SystemExit(code)
"""


def loaded_by(*argv: str) -> tuple[int, set[str]]:
    """The exit code and the modules a fresh interpreter holds after ``envbuild ARGV``."""
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *argv],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    assert "\nLOADED " in done.stdout, done.stderr
    return done.returncode, set(json.loads(done.stdout.rsplit("\nLOADED ", 1)[1]))


def _top(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


def test_help_imports_no_command_module_no_model_and_no_heavy_library():
    for argv in (["--help"], [], ["nonsense"]):  # help, and the usage errors that print it
        code, modules = loaded_by(*argv)
        assert code in (0, 2), argv
        ours = sorted(m for m in modules if m.startswith("envbuild."))
        assert ours == ["envbuild.cli", "envbuild.cli.commands", "envbuild.cli.main",
                        "envbuild.cli.render", "envbuild.errors", "envbuild.fsio"], (
            argv, ours)  # fmt: skip
        assert not _top(modules) & {*HEAVY, "pydantic", "packaging"}, argv


def test_validate_imports_the_spec_stage_only():
    code, modules = loaded_by("validate", "specs/quickstart.toml")
    assert code == 0
    assert not _top(modules) & set(HEAVY)
    stages = {m.split(".")[1] for m in modules if m.startswith("envbuild.") and m.count(".") > 1}
    assert stages <= {"cli", "spec", "proc"}, stages  # proc: the signal handling of every run


def test_each_command_help_imports_its_own_module_only():
    """A command's parser comes from its own module alone: ``snapshot --help`` does not import
    the build or apply commands (or, through them, those stages)."""
    for name, absent in (("snapshot", ("build", "apply")), ("validate", ("build", "lock"))):
        code, modules = loaded_by(name, "--help")
        assert code == 0
        assert f"envbuild.cli.{name}" in modules
        assert not {f"envbuild.cli.{a}" for a in absent} & modules, name
