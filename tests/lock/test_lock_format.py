"""The lock writer and reader on their own: canonical text that reads back as the same model."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from envbuild.errors import ManifestError
from envbuild.lock.io import dumps, loads
from envbuild.lock.model import (
    EnvbuildLock,
    Hashes,
    Index,
    Lock,
    LockedFile,
    LockedPackage,
    RootfsBaseLock,
    ToolTable,
)

SHA = "ab" * 32


def _file(name: str) -> LockedFile:
    return LockedFile(
        name=name,
        url=f"https://example.invalid/files/{name}",
        size=123,
        upload_time=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        hashes=Hashes(sha256=SHA),
    )


def _lock(**envbuild: object) -> Lock:
    return Lock(
        environments=["sys_platform == 'linux'"],
        requires_python="==3.11.*",
        packages=[
            LockedPackage(
                name="odd",
                version="1.0",
                marker='python_version >= "3.8" and extra != "a\\"b"',
                wheels=[_file("odd-1.0-py3-none-any.whl"), _file("odd-1.0-cp311-abi3.whl")],
            )
        ],
        tool=ToolTable(
            envbuild=EnvbuildLock(
                spec="odd",
                spec_hash=SHA,
                python="3.11",
                platform="manylinux_2_36_x86_64",
                exclude_newer=datetime(2026, 11, 15, tzinfo=UTC),
                indexes=[Index(name="default", url="https://pypi.org/simple")],
                requirements=["odd==1.0"],
                **envbuild,
            )
        ),
    )


def test_text_reads_back_as_the_same_lock():
    lock = _lock(
        base=RootfsBaseLock(kind="rootfs", path="bases/root fs\u00e9.tar", sha256=SHA),
        patches={},
    )
    text = dumps(lock, spec_file="specs/odd.toml")
    assert text.endswith("\n") and not text.endswith("\n\n")
    assert loads(text, "x") == lock
    assert dumps(loads(text, "x"), spec_file="specs/odd.toml") == text


def test_unknown_keys_are_rejected():
    text = dumps(_lock(), spec_file="specs/odd.toml")
    with pytest.raises(ManifestError, match="Extra inputs are not permitted"):
        loads(text.replace('version = "1.0"\n', 'version = "1.0"\nsurprise = 1\n', 1), "x")
