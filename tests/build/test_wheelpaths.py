"""Where a wheel's member lands (:func:`envbuild.installed.wheelpaths.member_path`): the string fast
path for a plain member gives what pathlib's normalisation gives, for any member name."""

from __future__ import annotations

from pathlib import PurePosixPath

from hypothesis import given
from hypothesis import strategies as st

from envbuild.installed.venv import VenvTarget
from envbuild.installed.wheelpaths import member_path


def by_pathlib(member: str, target: VenvTarget) -> str | None:
    """The rule written with pathlib throughout (what the fast path must equal)."""
    parts = PurePosixPath(member).parts
    if not parts:
        return None
    if parts[0].endswith(".data") and len(parts) > 2:
        scheme, rest = parts[1], PurePosixPath(*parts[2:])
        return {
            "purelib": f"{target.site_packages}/{rest}",
            "platlib": f"{target.site_packages}/{rest}",
            "scripts": f"bin/{rest}",
            "headers": f"include/site/python{target.python_version}/{rest}",
            "data": str(rest),
        }.get(scheme)
    return f"{target.site_packages}/{PurePosixPath(*parts)}"


SEGMENTS = st.sampled_from(
    [
        "",
        ".",
        "..",
        "pkg",
        "x-1.0.data",
        "purelib",
        "platlib",
        "scripts",
        "headers",
        "data",
        "lib.so",
        "odd",
    ]
)


@given(st.lists(st.one_of(SEGMENTS, st.text(max_size=6)), max_size=6))
def test_member_path_is_pathlibs_rule(segments: list[str]) -> None:
    target = VenvTarget()
    member = "/".join(segments)
    assert member_path(member, target) == by_pathlib(member, target)
