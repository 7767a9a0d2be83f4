"""The subprocess module: uv's cleaned environment, and the byte filters' one Popen setup."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from envbuild.apply import venv
from envbuild.errors import ToolFailed, ToolNotFound
from envbuild.proc import core as proc

SHOW_ENV = "import json, os; print(json.dumps(dict(os.environ)))"

CALLER = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/home/u",
    "SSL_CERT_FILE": "/etc/ca.pem",
    "https_proxy": "http://proxy:3128",
    "UV_CACHE_DIR": "/cache/uv",  # how uv caches: kept
    "UV_INDEX_URL": "http://elsewhere/simple",  # what uv installs: the lock decides
    "UV_COMPILE_BYTECODE": "1",
    "UV_PYTHON_DOWNLOADS": "automatic",
    "PYTHONPATH": "/somewhere",
    "SOURCE_DATE_EPOCH": "1",
    "DOCKER_HOST": "unix:///run/docker.sock",
    "AWS_SECRET_ACCESS_KEY": "s3cr3t",
}


def test_uv_gets_only_what_it_needs() -> None:
    env = proc.uv_env(base=CALLER)
    assert env == {
        "PATH": "/usr/bin:/bin",
        "HOME": "/home/u",
        "SSL_CERT_FILE": "/etc/ca.pem",
        "https_proxy": "http://proxy:3128",
        "UV_CACHE_DIR": "/cache/uv",
        **proc.UV_FIXED,
    }
    assert env["UV_PYTHON_DOWNLOADS"] == "never" and env["UV_NO_CONFIG"] == "1"


def test_what_may_change_a_result_is_an_explicit_input() -> None:
    token = proc.Secret("tok-123")
    env = proc.uv_env(
        {"UV_INDEX_URL": "http://idx/simple", "INDEX_TOKEN": token},
        base=CALLER,
        source_date_epoch=1700000000,
        docker_host="unix:///tmp/d.sock",
    )
    assert env["SOURCE_DATE_EPOCH"] == "1700000000"
    assert env["DOCKER_HOST"] == "unix:///tmp/d.sock"
    assert env["INDEX_TOKEN"] == "tok-123"
    assert env["UV_INDEX_URL"] == "http://idx/simple"


def test_a_child_sees_the_ca_bundle_and_not_the_callers_uv_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    monkeypatch.setenv("UV_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("UV_EXTRA_INDEX_URL", "http://127.0.0.1:9/extra")
    done = proc.run([sys.executable, "-c", SHOW_ENV], env=proc.uv_env())
    seen = json.loads(done.stdout)
    assert seen["SSL_CERT_FILE"] == str(ca)
    assert "UV_INDEX_URL" not in seen and "UV_EXTRA_INDEX_URL" not in seen


def test_apply_runs_uv_in_the_same_cleaned_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A user's UV_COMPILE_BYTECODE would put .pyc files into a generation the lock does not
    describe: apply's uv no longer sees it."""
    monkeypatch.setenv("UV_COMPILE_BYTECODE", "1")
    monkeypatch.setenv("UV_INDEX_URL", "http://127.0.0.1:9/simple")
    envs: list[dict[str, str]] = []

    def fake_run(argv: object, **kw: object) -> proc.Completed:
        envs.append(dict(kw["env"]))  # type: ignore[call-overload]
        return proc.Completed(("uv",), 0, "", "")

    monkeypatch.setattr(proc, "run", fake_run)
    venv.build_venv(tmp_path / "venv", "3.11", tmp_path / "pylock.toml")
    assert len(envs) == 2
    for env in envs:
        assert "UV_COMPILE_BYTECODE" not in env and "UV_INDEX_URL" not in env
        assert env["UV_PYTHON_DOWNLOADS"] == "never"


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
