"""A stage's failure is a StageError of the stage's name, caused by the error itself: the
cause's exit code, hint, problems and kind reach the user unchanged, and the cause is not
rewritten."""

from __future__ import annotations

import errno

import pytest

from envbuild.build.stages import stage
from envbuild.errors import ExitCode, LinkFindings, Problem, SpecError, StageError, ToolFailed


def test_an_envbuild_error_keeps_its_exit_code_kind_and_lines() -> None:
    cause = LinkFindings("image x", ["libfoo.so: needs libbar.so.1"], ["missing:libbar"])
    timings: dict[str, float] = {}
    with pytest.raises(StageError) as caught, stage("links", timings):
        raise cause
    err = caught.value
    assert err.__cause__ is cause and err.cause is cause
    assert cause.message == "image x: 1 file will not load"  # the cause is not rewritten
    assert err.exit_code == ExitCode.USER_ERROR and err.kind == "LinkFindings"
    assert err.lines() == ["links: image x: 1 file will not load", *cause.lines()[1:]]
    assert err.hint == cause.hint and "links" in timings


def test_a_tool_failure_is_an_environment_failure_with_the_tools_output() -> None:
    cause = ToolFailed("mmdebstrap", ["mmdebstrap", "bookworm"], 1, "E: no mirror\n")
    with pytest.raises(StageError) as caught, stage("base"):
        raise cause
    assert caught.value.exit_code == ExitCode.ENVIRONMENT
    assert caught.value.lines()[0] == "base: mmdebstrap failed with exit code 1"
    assert "  E: no mirror" in caught.value.lines()


def test_an_oserror_names_the_file() -> None:
    with pytest.raises(StageError) as caught, stage("image"):
        raise OSError(errno.EACCES, "Permission denied", "/out/oci")
    assert caught.value.message == "image: Permission denied (/out/oci)"
    assert caught.value.exit_code == ExitCode.ENVIRONMENT and caught.value.kind == "StageError"


def test_a_spec_error_keeps_its_located_problems() -> None:
    cause = SpecError([Problem("specs/x.toml", 3, "python.version", "not a version")])
    with pytest.raises(StageError) as caught, stage("plan"):
        raise cause
    assert caught.value.lines() == cause.lines() and caught.value.problems == cause.problems


def test_a_nested_stage_names_itself_once() -> None:
    with pytest.raises(StageError) as caught, stage("outer"), stage("inner"):
        raise ToolFailed("uv", ["uv"], 2, "")
    assert caught.value.message.startswith("inner: uv failed")


def test_other_errors_pass_through() -> None:
    with pytest.raises(ValueError, match="bug"), stage("plan"):
        raise ValueError("bug")
