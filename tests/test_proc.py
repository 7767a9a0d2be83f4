"""The subprocess module: the byte filters and readers (one Popen setup)."""

from __future__ import annotations

import sys

import pytest

from envbuild import proc
from envbuild.errors import ToolFailed, ToolNotFound


def test_reading_a_command_and_its_failure() -> None:
    with proc.reading([sys.executable, "-c", "print('out')"]) as stream:
        assert stream.read() == b"out\n"
    failing = "import sys; sys.stderr.write('it broke\\n'); sys.exit(3)"
    with pytest.raises(ToolFailed) as caught, proc.reading([sys.executable, "-c", failing]) as f:
        f.read()
    assert caught.value.returncode == 3 and "it broke" in caught.value.output_tail
    with pytest.raises(ToolNotFound), proc.reading(["/no/such/tool"]):
        pass


def test_a_byte_filter_and_its_failure() -> None:
    got: list[bytes] = []
    upper = "import sys; sys.stdout.buffer.write(sys.stdin.buffer.read().upper())"
    with proc.filter_bytes([sys.executable, "-c", upper], got.append) as write:
        write(b"abc" * 1000)
    assert b"".join(got) == b"ABC" * 1000
    failing = "import sys; sys.stdin.read(); sys.stderr.write('bad input\\n'); sys.exit(2)"
    with (
        pytest.raises(ToolFailed) as caught,
        proc.filter_bytes([sys.executable, "-c", failing], got.append) as write,
    ):
        write(b"x")
    assert caught.value.returncode == 2 and "bad input" in caught.value.output_tail
    with pytest.raises(ToolNotFound), proc.filter_bytes(["/no/such/tool"], got.append):
        pass
