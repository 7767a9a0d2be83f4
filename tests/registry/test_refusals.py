"""What push and pull refuse: a corrupt registry blob, wrong credentials, an untrusted TLS
certificate, a missing image, a corrupt local layout."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.registry import PASSWORD, Registry

pytestmark = pytest.mark.registry

Cli = Callable[..., Any]


def flip_bytes(path: Path, at: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_blob_corrupted_inside_the_registry_is_refused_on_pull(
    cli: Cli, registry: Registry, make_layout: Callable[..., Path], tmp_path: Path
) -> None:
    layout = make_layout("victim", {"data/unique.bin": os.urandom(20_000)})
    pushed = cli("push", layout, registry.ref("corrupt/me", "v1"), "--insecure", "--json")
    assert pushed.exit_code == 0, pushed.stderr
    layer = next(b for b in pushed.json()["blobs"] if "layer" in b["media_type"])
    flip_bytes(registry.blob_file(layer["digest"]))  # same size, different bytes

    dest = tmp_path / "pulled"
    result = cli("pull", registry.ref("corrupt/me", "v1"), dest, "--insecure")
    assert result.exit_code == 3
    assert "does not match its digest" in result.stderr
    assert layer["digest"] in result.stderr
    assert "Traceback" not in result.stderr
    assert not dest.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".pulled")] == []


def test_a_corrupt_local_layout_is_not_pushed(
    cli: Cli, registry: Registry, make_layout: Callable[..., Path]
) -> None:
    layout = make_layout("local", {"x": os.urandom(5_000)})
    mark = registry.log_mark()
    layer = next(p for p in (layout / "blobs/sha256").iterdir() if p.stat().st_size > 4_000)
    flip_bytes(layer)
    result = cli("push", layout, registry.ref("local/bad", "v1"), "--insecure")
    assert result.exit_code == 3
    assert "does not match its digest" in result.stderr
    assert registry.uploads(mark) == []


def test_wrong_credentials_give_the_registrys_message_without_the_password(
    cli: Cli,
    registry_auth: Registry,
    make_layout: Callable[..., Path],
    docker_config: Path,
    tmp_path: Path,
) -> None:
    layout = make_layout("auth", {"f": b"hello\n"})
    target = registry_auth.ref("private/app", "v1")

    none = cli("push", layout, target, "--insecure")
    assert none.exit_code == 3
    assert "wants credentials and none were found" in none.stderr
    assert "authentication required" in none.stderr
    assert "docker login" in none.stderr

    wrong = "not-the-" + PASSWORD
    registry_auth.write_docker_config(docker_config, password=wrong)
    bad = cli("push", layout, target, "--insecure")
    assert bad.exit_code == 3
    assert bad.stderr.startswith(f"error: registry {registry_auth.host} refused the credentials")
    assert "envbuild-ci" in bad.stderr and "authentication required" in bad.stderr
    assert "Traceback" not in bad.stderr
    for text in (bad.stdout, bad.stderr):
        assert wrong not in text and PASSWORD not in text

    bad_pull = cli("pull", target, tmp_path / "p", "--insecure")
    assert bad_pull.exit_code == 3 and "refused the credentials" in bad_pull.stderr

    registry_auth.write_docker_config(docker_config)
    good = cli("-v", "push", layout, target, "--insecure")
    assert good.exit_code == 0, good.stderr
    assert PASSWORD not in good.stdout + good.stderr  # not even in the -v log of skopeo's argv
    pulled = cli("pull", target, tmp_path / "ok", "--insecure")
    assert pulled.exit_code == 0, pulled.stderr


def test_threads_sharing_one_api_log_in_once_and_all_get_in(
    registry_auth: Registry, docker_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build asks the cache from several threads at once (the base's and the layer
    workers'). Each first request is answered 401 before any thread has logged in; then one
    logs in and the others use its token instead of calling their credentials refused."""
    import threading

    from envbuild.registry.api import Endpoint, RegistryApi

    registry_auth.write_docker_config(docker_config)
    api = RegistryApi(registry_auth.host, "private/app", Endpoint(insecure=True))
    threads = 4
    all_answered = threading.Barrier(threads, timeout=30)
    real_send = api._send
    first = threading.local()

    def send(method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> Any:
        answer = real_send(method, path, headers, body)
        if not getattr(first, "done", False):
            first.done = True
            all_answered.wait()  # every thread holds its 401 before anyone logs in
        return answer

    monkeypatch.setattr(api, "_send", send)
    found: list[object] = []

    def ask() -> None:
        try:
            found.append(api.manifest_digest("not-pushed"))
        except Exception as exc:  # the assertion shows it
            found.append(exc)

    workers = [threading.Thread(target=ask) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert found == [None] * threads


def test_credentials_from_the_containers_auth_file(
    cli: Cli,
    registry_auth: Registry,
    make_layout: Callable[..., Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    auth = registry_auth.write_docker_config(tmp_path / "containers")
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(auth))
    layout = make_layout("authfile", {"g": b"auth.json\n"})
    result = cli("push", layout, registry_auth.ref("private/authfile", "v1"), "--insecure")
    assert result.exit_code == 0, result.stderr


def test_tls_with_the_ca_works_and_without_it_fails_clearly(
    cli: Cli, registry_tls: Registry, make_layout: Callable[..., Path], tmp_path: Path
) -> None:
    layout = make_layout("tls", {"h": b"over TLS\n"})
    target = registry_tls.ref("secure/app", "v1")
    assert registry_tls.cert_dir is not None

    untrusted = cli("push", layout, target)
    assert untrusted.exit_code == 3
    assert "TLS certificate is not trusted" in untrusted.stderr
    assert "--cert-dir" in untrusted.stderr
    assert "Traceback" not in untrusted.stderr

    ok = cli("push", layout, target, "--cert-dir", registry_tls.cert_dir, "--json")
    assert ok.exit_code == 0, ok.stderr
    dest = tmp_path / "pulled"
    pulled = cli("pull", target, dest, "--cert-dir", registry_tls.cert_dir, "--json")
    assert pulled.exit_code == 0, pulled.stderr
    assert pulled.json()["digest"] == ok.json()["digest"]

    no_ca_pull = cli("pull", target, tmp_path / "again")
    assert no_ca_pull.exit_code == 3 and "not trusted" in no_ca_pull.stderr


def test_plain_http_without_insecure_is_explained(
    cli: Cli, registry: Registry, make_layout: Callable[..., Path]
) -> None:
    layout = make_layout("plain", {"i": b"http\n"})
    result = cli("push", layout, registry.ref("plain/app", "v1"))
    assert result.exit_code == 3
    assert "--insecure" in result.stderr


def test_pulling_what_is_not_there(cli: Cli, registry: Registry, tmp_path: Path) -> None:
    result = cli("pull", registry.ref("no/such", "v9"), tmp_path / "x", "--insecure")
    assert result.exit_code == 3
    assert f"registry {registry.host} has no image" in result.stderr
    assert not (tmp_path / "x").exists()


def test_pull_will_not_overwrite(cli: Cli, registry: Registry, tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("mine\n")
    result = cli("pull", registry.ref("any/thing", "v1"), tmp_path / "full", "--insecure")
    assert result.exit_code == 2
    assert "already exists" in result.stderr
    assert (tmp_path / "full" / "keep").read_text() == "mine\n"


def test_unreachable_registry(cli: Cli, make_layout: Callable[..., Path]) -> None:
    from support.registry import free_port

    layout = make_layout("nowhere", {"j": b"\n"})
    result = cli("push", layout, f"127.0.0.1:{free_port()}/a/b:v1", "--insecure")
    assert result.exit_code == 3
    assert "cannot reach registry" in result.stderr
