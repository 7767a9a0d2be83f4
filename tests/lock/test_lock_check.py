"""`envbuild lock --check`: 0 when the lock matches the spec, 1 and what changed when not."""

from __future__ import annotations

from pathlib import Path

import pytest


def _locked(cli, demo) -> Path:
    spec = demo()
    assert cli("lock", "--python-only", spec).exit_code == 0
    return spec


def test_check_passes_on_a_fresh_lock(cli, demo):
    spec = _locked(cli, demo)
    result = cli("lock", "--check", spec)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "current" in result.stdout


def test_check_names_a_changed_pin(cli, demo):
    _locked(cli, demo)
    spec = demo(('version = "0.33.0"', 'version = "0.32.1"'))
    result = cli("lock", "--check", spec)
    assert result.exit_code == 1
    assert "vllm: 0.32.1 in the spec, 0.33.0 in the lock" in result.stdout
    assert "spec hash" in result.stdout


def test_check_names_a_range_the_lock_no_longer_fits(cli, demo):
    _locked(cli, demo)
    result = cli("lock", "--check", demo(('alpha = ">=1"', 'alpha = ">=2"')))
    assert result.exit_code == 1
    assert "alpha: >=2 in the spec, 1.0.0 in the lock" in result.stdout


def test_check_catches_a_spec_hash_change_that_moves_no_pin(cli, demo):
    _locked(cli, demo)
    result = cli("lock", "--check", "--json", demo(("port = 8000", "port = 8001")))
    assert result.exit_code == 1
    (entry,) = result.json()["results"]
    assert entry["ok"] is False
    assert [c["kind"] for c in entry["changes"]] == ["spec-hash"]


def test_check_catches_build_flags_patches_and_target(cli, demo, repo):
    spec = _locked(cli, demo)
    (repo / "specs" / "patches" / "alpha.patch").write_text("--- changed\n")
    demo(
        ('MAX_JOBS = "2"', 'MAX_JOBS = "4"'),
        ('suite = "bookworm"', 'suite = "trixie"'),
        ('version = "3.11"', 'version = "3.13"'),
    )
    result = cli("lock", "--check", spec)
    assert result.exit_code == 1
    out = result.stdout
    assert "flashy: env MAX_JOBS=4 in the spec, 2 in the lock" in out
    assert "alpha: specs/patches/alpha.patch changed since it was locked" in out
    assert "platform: manylinux_2_41_x86_64 in the spec, manylinux_2_36_x86_64 in the lock" in out
    assert "python: 3.13 in the spec, 3.11 in the lock" in out
    assert "base suite: trixie in the spec, bookworm in the lock" in out
    # relocking makes it current again
    assert cli("lock", "--python-only", spec).exit_code == 0
    assert cli("lock", "--check", spec).exit_code == 0


def test_check_without_a_lock_is_stale(cli, demo):
    result = cli("lock", "--check", demo())
    assert result.exit_code == 1
    assert "lockfiles/pylock.demo.toml does not exist" in result.stdout


def test_check_notices_a_hand_edit(cli, demo, repo):
    spec = _locked(cli, demo)
    path = repo / "lockfiles" / "pylock.demo.toml"
    path.write_text(path.read_text().replace("created-by", "created-by ", 1))
    result = cli("lock", "--check", spec)
    assert result.exit_code == 1
    assert "not as envbuild writes it" in result.stdout


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('packages = ["tini"]', "base packages: [tini] in the spec, [] in the lock"),
        ('variant = "minbase"', "base variant: minbase in the spec, essential in the lock"),
        (
            'mirror = "http://ftp.de.debian.org/debian"',
            "base mirror: http://ftp.de.debian.org/debian in the spec, "
            "http://deb.debian.org/debian in the lock",
        ),
    ],
    ids=["packages", "variant", "mirror"],
)
def test_check_names_each_changed_debian_base_field(cli, demo, line, message):
    _locked(cli, demo)
    result = cli("lock", "--check", demo(('suite = "bookworm"', f'suite = "bookworm"\n{line}')))
    assert result.exit_code == 1
    assert message in result.stdout


def test_check_notes_an_unpinned_debian_base(cli, demo):
    spec = _locked(cli, demo)  # --python-only: no mmdebstrap, so no package set
    result = cli("lock", "--check", "--json", spec)
    assert result.exit_code == 0
    (entry,) = result.json()["results"]
    assert entry["ok"] is True and entry["changes"] == []
    (note,) = entry["notes"]
    assert "package set is not pinned" in note
