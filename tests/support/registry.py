"""A real OCI registry on loopback for the tests: Debian's ``docker-registry`` (CNCF distribution).

Three flavours, each a session fixture: plain HTTP (``registry``), htpasswd basic auth
(``registry_auth``) and TLS with a self-signed CA (``registry_tls``). Each writes its config file,
storage, password file and certificates into its own temporary folder, listens on 127.0.0.1 on a
free port, and is stopped at the end of the session.

When the binary is missing the fixtures skip with a reason, except in CI (``$CI`` set), where a
missing service is a broken test machine and fails the run.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

BINARY = "docker-registry"
USER = "envbuild-ci"
PASSWORD = "s3cret-Reg1stry-pass"
START_TIMEOUT = 30.0


@dataclass(frozen=True)
class Registry:
    """A running loopback registry and what a client needs to reach it."""

    host: str  # "127.0.0.1:PORT"
    root: Path  # the fixture's folder (config, logs, certificates)
    storage: Path  # the filesystem storage driver's root
    tls: bool
    username: str | None = None
    password: str | None = None
    cert_dir: Path | None = None  # holds ca.crt: skopeo's and envbuild's --cert-dir

    @property
    def insecure(self) -> bool:
        """Plain HTTP: clients must be told not to require TLS."""
        return not self.tls

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}"

    def ref(self, repo: str, tag: str | None = None) -> str:
        return f"{self.host}/{repo}" + (f":{tag}" if tag else "")

    def blob_file(self, digest: str) -> Path:
        """Where the registry keeps the bytes of ``digest`` (``sha256:<hex>``) on disk."""
        algo, hexdigest = digest.split(":", 1)
        return self.storage / "docker/registry/v2/blobs" / algo / hexdigest[:2] / hexdigest / "data"

    @property
    def log(self) -> Path:
        return self.root / "registry.log"

    def log_mark(self) -> int:
        """A position in the registry's log; pass it to :meth:`uploads` to see what came after."""
        return self.log.stat().st_size

    def uploads(self, since: int = 0) -> list[str]:
        """Digests of the blobs whose upload the registry completed after ``since``, read from its
        access log (``PUT /v2/<repo>/blobs/uploads/<id>?digest=...`` answered 201). A blob the
        client did not send again, or that was mounted from another repository, is not here."""
        with self.log.open("rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        found = re.findall(
            r'"PUT /v2/\S+/blobs/uploads/\S*[?&]digest=([^&\s"]+)\S* HTTP/[\d.]+" 201', text
        )
        return [urllib.parse.unquote(d) for d in found]

    def blob_gets(self, since: int = 0) -> list[str]:
        """Digests of the blobs the registry served (``GET /v2/<repo>/blobs/<digest>``
        answered 200, or 307 to the storage) after ``since``, read from its access log."""
        with self.log.open("rb") as f:
            f.seek(since)
            text = f.read().decode(errors="replace")
        served = r'"GET /v2/\S+/blobs/(sha256:[0-9a-f]{64}) HTTP/[\d.]+" (?:200|307)'
        return list(re.findall(served, text))

    def write_docker_config(
        self, folder: Path, *, username: str | None = None, password: str | None = None
    ) -> Path:
        """A Docker ``config.json`` in ``folder`` holding credentials for this registry (the
        fixture's own unless others are given). Point ``$DOCKER_CONFIG`` at ``folder``."""
        user = username if username is not None else self.username
        secret = password if password is not None else self.password
        folder.mkdir(parents=True, exist_ok=True)
        auths: dict[str, dict[str, str]] = {}
        if user is not None and secret is not None:
            token = base64.b64encode(f"{user}:{secret}".encode()).decode()
            auths[self.host] = {"auth": token}
        path = folder / "config.json"
        path.write_text(json.dumps({"auths": auths}, indent=2) + "\n")
        path.chmod(0o600)
        return path

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.tls:
            return None
        assert self.cert_dir is not None
        return ssl.create_default_context(cafile=str(self.cert_dir / "ca.crt"))

    def get(self, path: str, *, method: str = "GET") -> tuple[int, bytes]:
        """A raw request to the registry's HTTP API with the fixture's credentials."""
        req = urllib.request.Request(self.url + path, method=method)
        if self.username and self.password:
            token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        req.add_header(
            "Accept",
            "application/vnd.oci.image.manifest.v1+json, "
            "application/vnd.docker.distribution.manifest.v2+json",
        )
        try:
            with urllib.request.urlopen(req, timeout=10, context=self.ssl_context()) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()


def binary_or_skip() -> str:
    found = shutil.which(BINARY)
    if found is None:
        reason = f"{BINARY} is not installed (apt-get install docker-registry)"
        if os.environ.get("CI"):
            pytest.fail(reason + "; CI must have it", pytrace=False)
        pytest.skip(reason)
    return found


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A throw-away CA and a server certificate for 127.0.0.1 and localhost signed by it.
    Returns (ca.crt, server.crt, server.key)."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=envbuild test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=folder,
    )  # fmt: skip
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1",
        cwd=folder,
    )  # fmt: skip
    (folder / "server.ext").write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
    )
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
        "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "server.ext",
        cwd=folder,
    )  # fmt: skip
    return folder / "ca.crt", folder / "server.crt", folder / "server.key"


def _config(storage: Path, port: int, htpasswd: Path | None, cert: tuple[Path, Path] | None) -> str:
    # The registry reads YAML; JSON is YAML, and needs no YAML writer here.
    http: dict[str, object] = {
        "addr": f"127.0.0.1:{port}",
        "headers": {"X-Content-Type-Options": ["nosniff"]},
    }
    if cert is not None:
        http["tls"] = {"certificate": str(cert[0]), "key": str(cert[1])}
    config: dict[str, object] = {
        "version": 0.1,
        "log": {"level": "info", "accesslog": {"disabled": False}},
        "storage": {
            "filesystem": {"rootdirectory": str(storage)},
            "delete": {"enabled": True},
            # No descriptor cache: a blob changed on disk must be served as it is now.
        },
        "http": http,
    }
    if htpasswd is not None:
        config["auth"] = {"htpasswd": {"realm": "envbuild-test", "path": str(htpasswd)}}
    return json.dumps(config, indent=2) + "\n"


def _wait_ready(reg: Registry, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{BINARY} exited with {proc.returncode}:\n{log.read_text(errors='replace')}"
            )
        req = urllib.request.Request(reg.url + "/v2/")
        try:
            with urllib.request.urlopen(req, timeout=2, context=reg.ssl_context()):
                return
        except urllib.error.HTTPError as exc:
            if exc.code == 401:  # auth required: it answers
                return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{BINARY} did not answer /v2/ within {START_TIMEOUT:.0f} s")


@contextmanager
def run_registry(root: Path, *, auth: bool = False, tls: bool = False) -> Iterator[Registry]:
    """Start a registry whose files live under ``root``; stop it when the block ends."""
    binary = binary_or_skip()
    root.mkdir(parents=True, exist_ok=True)
    storage = root / "storage"
    storage.mkdir(exist_ok=True)
    htpasswd = None
    if auth:
        htpasswd = root / "htpasswd"
        line = subprocess.run(
            ["htpasswd", "-B", "-i", "-n", USER],
            input=PASSWORD,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        htpasswd.write_text(line.strip() + "\n")
    cert = None
    cert_dir = None
    if tls:
        cert_dir = root / "certs"
        _, crt, key = make_certificates(root / "pki")
        cert = (crt, key)
        cert_dir.mkdir(exist_ok=True)
        shutil.copy(root / "pki" / "ca.crt", cert_dir / "ca.crt")
    port = free_port()
    config = root / "config.yml"
    config.write_text(_config(storage, port, htpasswd, cert))
    reg = Registry(
        host=f"127.0.0.1:{port}",
        root=root,
        storage=storage,
        tls=tls,
        username=USER if auth else None,
        password=PASSWORD if auth else None,
        cert_dir=cert_dir,
    )
    log = root / "registry.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [binary, "serve", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "OTEL_TRACES_EXPORTER": "none"},
        )
    try:
        _wait_ready(reg, proc, log)
        yield reg
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _fixture(tmp_path_factory: pytest.TempPathFactory, name: str, **kw: bool) -> Iterator[Registry]:
    with run_registry(tmp_path_factory.mktemp(name), **kw) as reg:
        yield reg


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A plain-HTTP registry on 127.0.0.1 (clients need ``insecure``)."""
    yield from _fixture(tmp_path_factory, "registry-http")


@pytest.fixture(scope="session")
def registry_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """A plain-HTTP registry that wants htpasswd basic auth (``.username``/``.password``)."""
    yield from _fixture(tmp_path_factory, "registry-auth", auth=True)


@pytest.fixture(scope="session")
def registry_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    """An HTTPS registry with a certificate from a throw-away CA (``.cert_dir`` holds ca.crt)."""
    yield from _fixture(tmp_path_factory, "registry-tls", tls=True)
