from __future__ import annotations

import subprocess
import sys

from envbuild.errors import ExitCode


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
