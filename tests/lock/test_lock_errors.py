"""Bad input to the lock: one clear message, the right exit code, and nothing half-written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envbuild.errors import ManifestError, NewerFormat
from envbuild.lock import io as lock_io
from envbuild.lock.io import read_lock
from envbuild.lock.model import LOCK_FORMAT, DebianBaseLock

CASES = Path(__file__).resolve().parent.parent / "cases" / "lock"


def _locked(cli, demo) -> Path:
    spec = demo()
    assert cli("lock", "--python-only", spec).exit_code == 0
    return spec


def test_unsatisfiable_pin_is_a_user_error_quoting_uv(cli, demo, repo):
    result = cli("lock", "--python-only", demo(('alpha = ">=1"', 'alpha = "==9.9"')))
    assert result.exit_code == 2
    assert "specs/demo.toml: the requirements cannot be satisfied" in result.stderr
    # uv's own explanation, naming the package and the versions it has
    assert "No solution found when resolving dependencies" in result.stderr
    assert "alpha==9.9" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (repo / "lockfiles" / "pylock.demo.toml").exists()


def test_conflicting_pins_quote_uv(cli, demo):
    # alpha 1.0.0 depends on beta>=1: uv's explanation names both
    result = cli("lock", "--python-only", demo(('alpha = ">=1"', 'alpha = ">=1"\nbeta = "<1"')))
    assert result.exit_code == 2
    assert "alpha" in result.stderr and "beta" in result.stderr
    assert "No solution found" in result.stderr


def _without_dac_override(argv: list[str]) -> list[str]:
    """Run ``argv`` so that permission bits bind even for root (CAP_DAC_OVERRIDE dropped)."""
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root without setpriv cannot be kept out of a read-only directory")
    caps = "-dac_override,-dac_read_search,-fowner"
    return [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}", *argv]


def test_unwritable_lockfiles_is_exit_2_and_leaves_the_old_lock(cli, demo, repo):
    _locked(cli, demo)
    spec = demo(('MAX_JOBS = "2"', 'MAX_JOBS = "3"'))  # so a relock would change the file
    lockfiles = repo / "lockfiles"
    before = (lockfiles / "pylock.demo.toml").read_bytes()
    lockfiles.chmod(0o555)
    try:
        done = subprocess.run(
            _without_dac_override(
                [sys.executable, "-m", "envbuild", "lock", "--python-only", str(spec)]
            ),
            capture_output=True,
            text=True,
            check=False,
        )
    finally:
        lockfiles.chmod(0o755)
    assert done.returncode == 2, done.stderr
    assert "cannot write" in done.stderr and "Traceback" not in done.stderr
    assert (lockfiles / "pylock.demo.toml").read_bytes() == before
    assert sorted(p.name for p in lockfiles.iterdir()) == ["pylock.demo.toml"]


def test_output_into_a_file_is_exit_2(cli, demo, repo):
    (repo / "blocker").write_text("a file, not a directory\n")
    result = cli("lock", "--python-only", demo(), "--output", repo / "blocker" / "pylock.demo.toml")
    assert result.exit_code == 2
    assert "cannot write" in result.stderr


def _set_format(path: Path, fmt: int) -> None:
    ours = f"format = {LOCK_FORMAT}\n"
    assert ours in path.read_text()
    path.write_text(path.read_text().replace(ours, f"format = {fmt}\n"))


def test_newer_lock_format_is_a_clear_error_and_is_not_overwritten(cli, demo, repo):
    spec = _locked(cli, demo)
    path = repo / "lockfiles" / "pylock.demo.toml"
    _set_format(path, 99)
    newer = path.read_bytes()
    with pytest.raises(NewerFormat, match="newer envbuild"):
        read_lock(path)
    check = cli("lock", "--check", spec)
    assert check.exit_code == 1
    assert "written by a newer envbuild (lock format 99" in check.stdout
    relock = cli("lock", "--python-only", spec)
    assert relock.exit_code == 2
    assert "upgrade envbuild" in relock.stderr
    assert path.read_bytes() == newer


def test_newer_pep751_major_is_refused(cli, demo, repo):
    _locked(cli, demo)
    path = repo / "lockfiles" / "pylock.demo.toml"
    path.write_text(path.read_text().replace('lock-version = "1.0"', 'lock-version = "2.0"'))
    with pytest.raises(NewerFormat, match=r"lock-version 2\.0"):
        read_lock(path)


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda text: text[: len(text) // 2], id="truncated"),
        pytest.param(lambda text: "\x00\x01binary" + text, id="binary"),
        pytest.param(lambda text: "", id="empty"),
        pytest.param(lambda text: text.replace("hashes = { sha256", "hashes = { md5"), id="field"),
        pytest.param(lambda text: text.replace("[tool.envbuild]", "[tool.other]"), id="foreign"),
    ],
)
def test_corrupted_lock_is_reported_and_replaced(cli, demo, repo, damage):
    spec = _locked(cli, demo)
    path = repo / "lockfiles" / "pylock.demo.toml"
    good = path.read_bytes()
    path.write_text(damage(path.read_text()))
    with pytest.raises(ManifestError) as caught:
        read_lock(path)
    assert str(path) in caught.value.message
    check = cli("lock", "--check", spec)
    assert check.exit_code == 1
    assert "pylock.demo.toml" in check.stdout
    relock = cli("lock", "--python-only", spec)
    assert relock.exit_code == 0, relock.stderr
    assert "it will be replaced" in relock.stderr
    assert path.read_bytes() == good


def test_an_older_format_is_converted_on_read(cli, demo, repo, monkeypatch):
    # No older format exists yet; this registers one (format 0 called the spec hash
    # "spec-sha256") to prove the path a real one will take.
    _locked(cli, demo)
    path = repo / "lockfiles" / "pylock.demo.toml"
    current = read_lock(path)
    _set_format(path, 0)
    path.write_text(path.read_text().replace("spec-hash =", "spec-sha256 ="))
    with pytest.raises(ManifestError, match="too old to convert"):
        read_lock(path)

    def from_0(raw):
        raw["tool"]["envbuild"]["spec-hash"] = raw["tool"]["envbuild"].pop("spec-sha256")
        return raw

    monkeypatch.setitem(lock_io.CONVERTERS, 0, from_0)
    assert read_lock(path) == current


def test_a_format_1_lock_reads_as_the_current_format():
    # quickstart's lock as envbuild wrote it before format 2 recorded the base's `include`
    lock = read_lock(CASES / "pylock.quickstart-format-1.toml")
    assert lock.envbuild.format == LOCK_FORMAT
    base = lock.envbuild.base
    assert isinstance(base, DebianBaseLock)
    assert (base.suite, base.include, base.packages) == ("bookworm", [], [])
    assert lock.package("requests").version == "2.32.3"


def test_check_names_an_older_format(cli, demo, repo):
    spec = _locked(cli, demo)
    path = repo / "lockfiles" / "pylock.demo.toml"
    text = path.read_text()
    assert "include = []\n" in text
    _set_format(path, 1)
    path.write_text(path.read_text().replace("include = []\n", ""))
    check = cli("lock", "--check", spec)
    assert check.exit_code == 1
    assert f"is in lock format 1, this envbuild writes {LOCK_FORMAT}" in check.stdout
    assert cli("lock", "--python-only", spec).exit_code == 0
    assert path.read_text() == text


def test_output_with_several_specs_is_a_usage_error(cli, demo, tmp_path):
    spec = demo()
    result = cli("lock", "--python-only", spec, spec, "--output", tmp_path / "pylock.x.toml")
    assert result.exit_code == 2
    assert "--output takes one SPEC" in result.stderr


def test_invalid_spec_is_not_locked(cli, demo, repo):
    result = cli("lock", "--python-only", demo(('version = "0.33.0"', 'version = "not-a-version"')))
    assert result.exit_code == 2
    assert "specs/demo.toml" in result.stderr
    assert not (repo / "lockfiles").exists()


def test_a_format_2_lock_reads_as_the_current_format():
    # quickstart's lock as envbuild wrote it before format 3 recorded wheels' Requires-Dist
    lock = read_lock(CASES / "pylock.quickstart-format-2.toml")
    assert lock.envbuild.format == LOCK_FORMAT
    assert lock.envbuild.requires == {}
    assert lock.package("requests") is not None
