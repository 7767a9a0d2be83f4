"""CLI conventions a user expects of any command line: -v/-q before or after the command and -q
honoured; a path shown as it was given; each command's --help lists the exit codes it may
return; shell completion (a generated script, completed by a real bash)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import CliResult
from support.outputs import build_args
from support.project import write_project
from support.wheels import make_wheel, ref

from envbuild.cli import commands

Cli = Callable[..., CliResult]


def test_q_and_v_are_taken_after_the_command_too(cli: Cli, tmp_path: Path) -> None:
    tries = [["-q", "validate", "x.toml"], ["validate", "-q", "x.toml"],
             ["validate", "x.toml", "-v"], ["-v", "validate", "--quiet", "x.toml"]]  # fmt: skip
    for argv in tries:
        result = cli(*argv)
        assert result.exit_code == 2, (argv, result.stderr)  # x.toml is missing, not a usage error
        assert "no such file" in result.stderr and "usage:" not in result.stderr, argv


def test_build_says_nothing_under_q_but_its_result(cli: Cli, repo: Path) -> None:
    spec = write_project(repo, "tiny", [ref(make_wheel(repo / "w", "alpha", "1.0", {"a.py": ""}))])
    out = repo / "out"
    loud = cli(*build_args(repo, spec, out))
    assert loud.exit_code == 0, loud.stderr
    assert "rebuilt" in loud.stderr  # the summary, on stderr
    for quiet in (["-q", *build_args(repo, spec, out)], [*build_args(repo, spec, out), "-q"]):
        done = cli(*quiet)
        assert done.exit_code == 0, done.stderr
        assert done.stderr == ""
        assert done.stdout == loud.stdout  # the image digest


def test_a_spec_that_cannot_be_read_is_named_as_it_was_given(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / ".git").mkdir()
    for given, says in ((tmp_path / "specs" / "nope.toml", "no such file"),
                        (tmp_path / "specs", "is a directory")):  # fmt: skip
        result = cli("validate", given)
        assert result.exit_code == 2
        assert result.stderr.startswith(f"error: {given}: {says}"), result.stderr
        result = cli("show", given)  # every command that reads a spec
        assert result.stderr.startswith(f"error: {given}: {says}"), result.stderr


@pytest.mark.parametrize("command", [c.name for c in commands.COMMANDS])
def test_each_commands_help_lists_its_exit_codes(cli: Cli, command: str) -> None:
    result = cli(command, "--help")
    assert result.exit_code == 0
    codes = result.stdout.split("\nexit codes:\n", 1)[1]
    assert "  0  success" in codes and "  2  bad input" in codes and "  3  the environment" in codes
    differs = commands.BY_NAME[command].differs
    assert ("  1  " in codes) == bool(differs)
    if differs:
        assert f"  1  {differs}" in codes


def test_bash_completes_commands_options_and_subcommands(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    assert bash is not None
    script = tmp_path / "envbuild.bash"
    made = subprocess.run(
        [sys.executable, "-m", "envbuild", "completion", "bash"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    script.write_text(made.stdout)

    def complete(line: str) -> list[str]:
        # what bash does on TAB: COMP_WORDS/COMP_CWORD set, the function called, COMPREPLY read
        run = subprocess.run(
            [bash, "--norc", "--noprofile", "-c",
             'source "$1"; read -ra COMP_WORDS <<< "$2"; [[ $2 == *" " ]] && COMP_WORDS+=("");'
             ' COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _envbuild; printf "%s\\n" "${COMPREPLY[@]}"',
             "bash", script, line],
            capture_output=True, text=True, check=True, cwd=tmp_path,
        )  # fmt: skip
        return run.stdout.split()

    assert complete("envbuild bu") == ["build"]
    assert complete("envbuild -q va") == ["validate"]
    assert complete("envbuild build --no-d") == ["--no-docker-archive"]
    assert complete("envbuild store v") == ["verify"]
    assert complete("envbuild verify --fl") == ["--fleet"]
    assert complete("envbuild completion f") == ["fish"]
    (tmp_path / "spec-one.toml").write_text("")
    assert complete("envbuild validate spec-") == ["spec-one.toml"]
    registered = subprocess.run(
        [bash, "--norc", "--noprofile", "-c", 'source "$1"; complete -p envbuild', "bash", script],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "-F _envbuild" in registered and registered.rstrip().endswith(" envbuild")


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts_are_generated(shell: str, tmp_path: Path) -> None:
    made = subprocess.run(
        [sys.executable, "-m", "envbuild", "completion", shell],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "validate" in made and "no-docker-archive" in made
    binary = shutil.which(shell)
    if binary is None:
        pytest.skip(f"{shell} is not installed: the script's syntax is not checked")
    script = tmp_path / f"envbuild.{shell}"
    script.write_text(made)
    subprocess.run([binary, "-n", script], check=True)


def test_a_name_that_is_not_utf8_prints_escaped_not_as_a_traceback() -> None:
    """A base's setuid file or a path can be bytes that are not UTF-8 (Python keeps them as
    surrogates): what envbuild prints on stdout shows them escaped and the command goes on."""
    code = (
        "import sys; from envbuild.cli.main import _escape_undecodable_output as escape; escape(); "
        "from envbuild.cli import render; render.note('usr/bin/\\udcff'); sys.exit(0)"
    )
    env = {**os.environ, "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": ""}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, env=env, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert b"usr/bin/\\udcff" in done.stdout + done.stderr
