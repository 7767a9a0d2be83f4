"""Locking a small real spec against PyPI (needs the network)."""

from __future__ import annotations

import pytest

from envbuild.lock.core import lock_path
from envbuild.lock.io import read_lock
from envbuild.spec import load_spec

pytestmark = pytest.mark.network

SPEC = """\
name = "requests-only"

[base]
kind = "debian"
suite = "bookworm"

[python]
version = "3.11"

[packages]
requests = "==2.32.3"

[resolution]
exclude_newer = 2025-06-01T00:00:00Z
"""


def test_lock_a_small_spec_against_pypi(cli, repo):
    spec = repo / "specs" / "requests-only.toml"
    spec.write_text(SPEC)
    result = cli("lock", "--python-only", spec)
    assert result.exit_code == 0, result.stderr
    path = lock_path(load_spec(spec))
    lock = read_lock(path)
    requests = lock.package("requests")
    assert requests.version == "2.32.3"
    (wheel,) = requests.wheels
    # PyPI's published digest and size of requests-2.32.3-py3-none-any.whl
    assert wheel.hashes.sha256 == "70761cfe03c773ceb22aa2f671b4757976145175cdfca038c02654d061d6dcc6"
    assert wheel.size == 64928
    assert {p.name for p in lock.packages} == {
        "certifi",
        "charset-normalizer",
        "idna",
        "requests",
        "urllib3",
    }
    for package in lock.packages:
        assert package.index == "https://pypi.org/simple"
        assert all(f.upload_time and f.upload_time.year <= 2025 for f in package.files())
    first = path.read_bytes()
    assert cli("lock", "--python-only", spec).exit_code == 0
    assert path.read_bytes() == first
    assert cli("lock", "--check", spec).exit_code == 0


def test_an_impossible_pin_quotes_uv(cli, repo):
    spec = repo / "specs" / "requests-only.toml"
    spec.write_text(SPEC.replace("==2.32.3", "==2.99.0"))
    result = cli("lock", "--python-only", spec)
    assert result.exit_code == 2
    assert "No solution found" in result.stderr
    assert "requests==2.99.0" in result.stderr
