"""Every message about a spec names its files by a path the user can open from where they ran
envbuild (one rule, :func:`envbuild.spec.load.shown_path`): the spec as they typed it, a file it
extends relative to the current folder when it lies under it, else absolute. Every command that
reads a spec follows it; what envbuild writes (the lock's header) stays relative to the
repository."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from envbuild.errors import ExitCode, SpecError
from envbuild.spec.load import load_spec

SHARED = Path(__file__).resolve().parent.parent / "cases" / "spec" / "_shared"
# line 3 of the spec and line 2 of the base it extends each hold an unknown key
SPEC = 'extends = "base/bad.toml"\nname = "x"\nmodle = 1\n'
BASE = 'extends = "stack.toml"\nverison = 1\n'


@pytest.fixture
def tree(repo: Path) -> Path:
    shutil.copytree(SHARED, repo / "specs" / "base", dirs_exist_ok=True)
    (repo / "specs" / "x.toml").write_text(SPEC)
    (repo / "specs" / "base" / "bad.toml").write_text(BASE)
    return repo


def _files(exc: pytest.ExceptionInfo[SpecError]) -> list[tuple[str, int | None]]:
    return sorted((p.file, p.line) for p in exc.value.problems)


@pytest.mark.parametrize(
    ("cwd", "typed", "base"),
    [
        (".", "specs/x.toml", "specs/base/bad.toml"),
        (".", "./specs/../specs/x.toml", "specs/base/bad.toml"),
        ("specs", "x.toml", "base/bad.toml"),
        ("specs/base", "../x.toml", "bad.toml"),
    ],
)
def test_files_under_the_current_folder(tree, monkeypatch, cwd, typed, base):
    monkeypatch.chdir(tree / cwd)
    with pytest.raises(SpecError) as exc:
        load_spec(typed)
    assert _files(exc) == sorted([(typed, 3), (base, 2)])


def test_files_outside_the_current_folder_are_absolute(tree, tmp_path_factory, monkeypatch):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    monkeypatch.chdir(elsewhere)
    typed = str(tree / "specs" / "x.toml")
    with pytest.raises(SpecError) as exc:
        load_spec(typed)
    assert _files(exc) == sorted([(typed, 3), (str(tree / "specs/base/bad.toml"), 2)])

    # typed relative to a folder beside the repository: the spec so, its base absolute
    monkeypatch.chdir(tree / ".git")
    with pytest.raises(SpecError) as exc:
        load_spec("../specs/x.toml")
    assert _files(exc) == sorted([("../specs/x.toml", 3), (str(tree / "specs/base/bad.toml"), 2)])


def test_extends_problems_name_the_files_so(tree, monkeypatch):
    (tree / "specs" / "x.toml").write_text('extends = "base/nope.toml"\nname = "x"\n')
    monkeypatch.chdir(tree / "specs")
    with pytest.raises(SpecError) as exc:
        load_spec("./x.toml")
    (problem,) = exc.value.problems
    assert problem.file == "./x.toml"
    assert "looked for base/nope.toml" in problem.message


@pytest.mark.parametrize(
    "command",
    [
        ["validate"],
        ["show"],
        ["lock"],
        ["lock", "--check"],
        ["build", "--dry-run"],
        ["dockerfile"],
        ["apply", "--dry-run", "--root", "ROOT"],
        ["render", "unit"],
        ["render", "host-setup"],
        ["snapshot", "--quick", "--no-models", "--no-docker", "--no-systemd", "--spec"],
        ["ci"],
    ],
)
def test_every_command_names_the_spec_as_typed(tree, tmp_path_factory, monkeypatch, cli, command):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    monkeypatch.chdir(elsewhere)
    typed = str(tree / "specs" / "x.toml")
    argv = [str(elsewhere / "root") if a == "ROOT" else a for a in command]
    result = cli(*argv, typed)
    assert result.exit_code == ExitCode.USER_ERROR, result.stderr
    assert f"{tree / 'specs/base/bad.toml'}:2: verison: error" in result.stderr
    if command != ["ci"]:  # ci sums each spec's failure up in one line: its first problem
        assert f"{typed}:3: modle: error" in result.stderr
    assert "specs/x.toml:3" not in result.stderr.replace(typed, "")


def test_what_envbuild_writes_names_the_spec_relative_to_the_repository(tree, monkeypatch):
    (tree / "specs" / "x.toml").write_text('extends = "base/stack.toml"\nname = "x"\n')
    monkeypatch.chdir(tree / "specs")
    loaded = load_spec("./x.toml")
    assert loaded.display(loaded.path) == "./x.toml"
    assert loaded.display(tree / "specs/base/host.toml") == "base/host.toml"
    assert loaded.repo_path(loaded.path) == "specs/x.toml"
