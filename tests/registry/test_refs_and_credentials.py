"""Image references and where credentials come from (no registry needed)."""

from __future__ import annotations

import base64
import json
import stat
from pathlib import Path

import pytest

from envbuild.errors import InputFileError, UsageError
from envbuild.registry.auth import auth_file, find_credentials
from envbuild.registry.ref import ImageRef, parse_ref, parse_repo

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("ghcr.io/acme/serving:v1", ImageRef("ghcr.io", "acme/serving", "v1")),
        ("127.0.0.1:5000/a/b/c", ImageRef("127.0.0.1:5000", "a/b/c")),
        ("localhost/x@" + DIGEST, ImageRef("localhost", "x", None, DIGEST)),
        ("reg.example:443/x:t@" + DIGEST, ImageRef("reg.example:443", "x", "t", DIGEST)),
    ],
)
def test_parse_ref(text: str, expected: ImageRef) -> None:
    assert parse_ref(text) == expected
    assert str(parse_ref(text)) == text


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("ubuntu:24.04", "name the registry"),
        ("acme/serving:v1", "not a registry host"),
        ("ghcr.io/Acme/x", "lowercase"),
        ("ghcr.io/x@sha256:123", "sha256:<64"),
        ("ghcr.io/x:bad/tag", "lowercase"),
    ],
)
def test_parse_ref_rejects(text: str, reason: str) -> None:
    with pytest.raises(UsageError, match=reason):
        parse_ref(text)


def test_parse_repo_wants_no_tag() -> None:
    assert parse_repo("ghcr.io/acme/cache").name == "ghcr.io/acme/cache"
    with pytest.raises(UsageError, match="without a tag"):
        parse_repo("ghcr.io/acme/cache:v1")


def _auth(user: str, password: str) -> str:
    return base64.b64encode(f"{user}:{password}".encode()).decode()


def test_credentials_order_and_key_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docker = tmp_path / "docker"
    docker.mkdir()
    (docker / "config.json").write_text(
        json.dumps(
            {
                "auths": {
                    "https://reg.example/v1/": {"auth": _auth("dockeruser", "dpw")},
                    "reg.example/team": {"auth": _auth("teamuser", "tpw")},
                }
            }
        )
    )
    monkeypatch.setenv("DOCKER_CONFIG", str(docker))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)

    creds = find_credentials("reg.example", "other/repo")
    assert creds is not None and creds.username == "dockeruser"
    assert creds.password.reveal() == "dpw" and "dpw" not in repr(creds)
    team = find_credentials("reg.example", "team/app")
    assert team is not None and team.username == "teamuser"
    assert find_credentials("elsewhere.example") is None

    containers = tmp_path / "auth.json"
    containers.write_text(json.dumps({"auths": {"reg.example": {"auth": _auth("podman", "ppw")}}}))
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(containers))
    first = find_credentials("reg.example", "other/repo")
    assert first is not None and first.username == "podman"


def test_credential_helper(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docker-credential-<name> get: registry on stdin, JSON on stdout (the helper protocol)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    helper = bin_dir / "docker-credential-envtest"
    helper.write_text(
        "#!/bin/sh\nread host\n"
        'if [ "$host" = reg.example ]; then\n'
        '  printf \'{"ServerURL":"%s","Username":"helped","Secret":"hpw"}\' "$host"\n'
        "else echo 'credentials not found in native keychain'; exit 1; fi\n"
    )
    helper.chmod(helper.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    (tmp_path / "config.json").write_text(json.dumps({"credsStore": "envtest", "auths": {}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    creds = find_credentials("reg.example")
    assert creds is not None and (creds.username, creds.password.reveal()) == ("helped", "hpw")
    assert find_credentials("other.example") is None


def test_malformed_config_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "config.json").write_text("{not json")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.delenv("REGISTRY_AUTH_FILE", raising=False)
    with pytest.raises(InputFileError, match=r"config\.json"):
        find_credentials("reg.example")


def test_auth_file_is_private_and_removed() -> None:
    with auth_file("reg.example", None) as path:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert json.loads(path.read_text()) == {"auths": {}}
    assert not path.exists()
