from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from envbuild.errors import ExitCode

REPO = Path(__file__).resolve().parent.parent


def test_help_lists_commands_and_exit_codes(cli):
    result = cli("--help")
    assert result.exit_code == 0
    assert "validate" in result.stdout
    assert "exit codes" in result.stdout


def test_no_command_is_usage_error(cli):
    result = cli()
    assert result.exit_code == ExitCode.USER_ERROR
    assert "usage" in result.stderr


def test_unknown_option_is_usage_error(cli):
    assert cli("validate", "--bogus", "x.toml").exit_code == ExitCode.USER_ERROR


def test_python_dash_m_runs():
    done = subprocess.run(
        [sys.executable, "-m", "envbuild", "--version"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0
    assert done.stdout.startswith("envbuild ")


def test_a_failure_under_json_is_a_json_document_on_stdout(cli, tmp_path):
    """A script that reads stdout learns what went wrong; people still read stderr."""
    missing = tmp_path / "nope.toml"
    for argv in (
        ("apply", missing, "--json", "--root", tmp_path / "root"),
        ("show", missing, "--json"),
        ("diff", tmp_path / "a.json", tmp_path / "b.json", "--json"),
    ):
        result = cli(*argv)
        assert result.exit_code == ExitCode.USER_ERROR, argv
        error = result.json()["error"]
        assert error["kind"] in {"InputFileError", "ManifestError"} and error["exit_code"] == 2
        assert error["message"].endswith("no such file")
        assert "no such file" in result.stderr
    result = cli("show", missing)  # without --json, nothing on stdout
    assert result.exit_code == ExitCode.USER_ERROR and result.stdout == ""


def test_a_spec_error_under_json_carries_every_problem(cli, repo):
    spec = repo / "specs" / "bad.toml"
    spec.write_text('name = "bad"\n[python]\nversion = 3.11\nbogus = 1\n')
    result = cli("show", spec, "--json")
    assert result.exit_code == ExitCode.USER_ERROR
    error = result.json()["error"]
    assert error["kind"] == "SpecError"
    lines = {p["key"]: p["line"] for p in error["problems"]}
    assert lines["python.version"] == 3 and lines["python.bogus"] == 4, error["problems"]
    assert all(p["severity"] == "error" and p["file"] == str(spec) for p in error["problems"])


def test_validate_reports_a_missing_spec_and_goes_on_to_the_next(cli, repo):
    good = repo / "specs" / "good.toml"
    good.write_text((REPO / "specs" / "quickstart.toml").read_text())
    empty = repo / "specs" / "empty.toml"
    empty.write_text("")
    missing = repo / "specs" / "missing.toml"
    result = cli("validate", empty, missing, repo / "specs", good)
    assert result.exit_code == ExitCode.USER_ERROR
    lines = result.stdout.splitlines()
    # a file that cannot be read is named as it was given (here absolute), like the good one
    assert f"{missing}: error: no such file (fix: check the path)" in lines
    assert f"{repo / 'specs'}: error: is a directory, not a spec file" in lines
    assert lines[-1] == f"{good}: ok"
    result = cli("validate", "--json", empty, missing, good)
    assert result.exit_code == ExitCode.USER_ERROR
    oks = [(r["spec"], r["ok"]) for r in result.json()["results"]]
    assert oks == [(str(empty), False), (str(missing), False), (str(good), True)]
    (problem,) = result.json()["results"][1]["problems"]
    assert problem["file"] == str(missing) and problem["message"] == "no such file"


def test_every_command_has_its_help_and_loads_only_its_own_module():
    """A command's parser comes from its own module alone (start-up: a snapshot does not import
    the build); each command's --help works through that path, and the top-level one lists all."""
    from envbuild.cli.main import COMMANDS

    script = (
        "import sys\n"
        "from envbuild.cli.main import main\n"
        "code = main(sys.argv[1:])\n"
        "print('LOADED', sorted(m for m in sys.modules if m.startswith('envbuild.cli.')))\n"
        "raise SystemExit(code)\n"
    )
    for name in COMMANDS:
        done = subprocess.run(
            [sys.executable, "-c", script, name, "--help"],
            capture_output=True, text=True, check=False, cwd=REPO,
        )  # fmt: skip
        assert done.returncode == 0, (name, done.stderr)
        assert f"usage: envbuild {name}" in done.stdout
        loaded = done.stdout.rsplit("LOADED", 1)[1]
        assert "envbuild.cli.build'" not in loaded or name in ("build", "ci"), (name, loaded)
    done = subprocess.run(
        [sys.executable, "-c", script, "snapshot", "--help"],
        capture_output=True, text=True, check=False, cwd=REPO,
    )  # fmt: skip
    assert "'envbuild.cli.apply'" not in done.stdout
    whole = subprocess.run(
        [sys.executable, "-m", "envbuild", "--help"], capture_output=True, text=True, check=False
    )
    assert all(f"    {name} " in whole.stdout for name in COMMANDS), whole.stdout


def test_an_unknown_command_lists_the_known_ones(cli):
    result = cli("nonsense")
    assert result.exit_code == ExitCode.USER_ERROR
    assert "invalid choice: 'nonsense'" in result.stderr and "snapshot" in result.stderr
