"""The few read-only questions envbuild asks a registry's HTTP API itself (distribution spec v2).

Copying images is skopeo's job (:mod:`envbuild.registry.core.skopeo`). What is asked here is what a
copy tool does not report reliably: does the repository already have this blob (``HEAD
/v2/<repo>/blobs/<digest>``), which manifest digest does a tag name (``HEAD
/v2/<repo>/manifests/<ref>``, ``Docker-Content-Digest``), and does the registry accept our
credentials at all. Basic and bearer-token authentication are handled; TLS follows the same
settings as the copy (``--insecure``, ``--cert-dir``, ``/etc/containers/certs.d/HOST``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

from envbuild.errors import AnswerTooLarge, IntegrityError, RegistryError, RegistryUnreachable
from envbuild.oci.layout import (
    DOCKER_MANIFEST,
    DOCKER_MANIFEST_LIST,
    MAX_DOCUMENT,
    OCI_INDEX,
    OCI_MANIFEST,
)
from envbuild.registry.auth import Credentials, config_files, find_credentials

log = logging.getLogger(__name__)

#: What a manifest request accepts (the Accept header, in this order).
MANIFEST_TYPES = (OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_MANIFEST_LIST)
SYSTEM_CERT_DIRS = (Path("/etc/containers/certs.d"), Path("/etc/docker/certs.d"))
TIMEOUT = 60.0
#: The most bytes read of any one answer (a manifest, an index, a referrer's blob, a token): the
#: limit on a document in an OCI layout. Blobs themselves are skopeo's to copy.
MAX_ANSWER = MAX_DOCUMENT


def read_bounded(stream: Any, url: str, limit: int = MAX_ANSWER) -> bytes:
    """At most ``limit`` bytes of an answer's body, read as a stream (a body that never ends is
    read no further than ``limit`` + 1 bytes); more is :class:`AnswerTooLarge`, before any
    byte is read when the answer's Content-Length says so."""
    length = stream.headers.get("Content-Length") if stream.headers is not None else None
    if length is not None and length.strip().isdigit() and int(length) > limit:
        raise AnswerTooLarge(url, limit)
    data: bytes = stream.read(limit + 1)
    if len(data) > limit:
        raise AnswerTooLarge(url, limit)
    return data


@dataclass(frozen=True)
class Endpoint:
    """How to talk to a registry. ``insecure`` allows plain HTTP and unverified TLS (a loopback
    or lab registry); ``cert_dir`` holds extra CA certificates (``*.crt``) to trust."""

    insecure: bool = False
    cert_dir: Path | None = None

    def ca_files(self, registry: str) -> list[Path]:
        dirs = [self.cert_dir] if self.cert_dir else [d / registry for d in SYSTEM_CERT_DIRS]
        return sorted(p for d in dirs if d.is_dir() for p in d.glob("*.crt"))


def registry_message(body: bytes) -> str:
    """The registry's own words from an error body (``{"errors": [{"code", "message"}]}``)."""
    try:
        errors = json.loads(body).get("errors") or []
        parts = [f"{e.get('code', '')}: {e.get('message', '')}".strip(": ") for e in errors]
        if parts:
            return "; ".join(parts)
    except (ValueError, AttributeError):
        pass
    return body.decode(errors="replace").strip()[:300]


def _challenge(header: str) -> tuple[str, dict[str, str]]:
    scheme, _, rest = header.partition(" ")
    params: dict[str, str] = {}
    for item in urllib.request.parse_http_list(rest):
        key, _, value = item.partition("=")
        params[key.strip().lower()] = value.strip().strip('"')
    return scheme.lower(), params


class RegistryApi:
    """Read-only access to one repository of one registry."""

    def __init__(
        self,
        registry: str,
        repository: str,
        endpoint: Endpoint,
        creds: Credentials | None = None,
        *,
        lookup_credentials: bool = True,
    ) -> None:
        self.registry = registry
        self.repository = repository
        self.endpoint = endpoint
        if creds is None and lookup_credentials:
            creds = find_credentials(registry, repository)
        self.creds = creds
        self._scheme: str | None = None if endpoint.insecure else "https"
        self._authorization: str | None = None
        self._login = threading.Lock()  # the build's threads share one API object

    # -- plumbing ---------------------------------------------------------------------------
    def _context(self, scheme: str) -> ssl.SSLContext | None:
        if scheme != "https":
            return None
        if self.endpoint.insecure:
            return ssl._create_unverified_context()
        ctx = ssl.create_default_context()
        for ca in self.endpoint.ca_files(self.registry):
            ctx.load_verify_locations(cafile=str(ca))
        return ctx

    def _open(
        self, method: str, url: str, headers: dict[str, str], scheme: str, body: bytes | None = None
    ) -> tuple[int, Message, bytes]:
        req = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT, context=self._context(scheme)) as r:
                if method == "HEAD":  # no body: its Content-Length is the blob's, not ours
                    return r.status, r.headers, b""
                return r.status, r.headers, read_bounded(r, url)
        except urllib.error.HTTPError as exc:
            # an error's body only gives the registry's words for a message: cut, not refused
            return exc.code, exc.headers, exc.read(MAX_ANSWER)

    def _send(
        self, method: str, path: str, headers: dict[str, str], body: bytes | None = None
    ) -> tuple[int, Message, bytes]:
        schemes = [self._scheme] if self._scheme else ["https", "http"]
        for i, scheme in enumerate(schemes):
            try:
                url = f"{scheme}://{self.registry}{path}"
                result = self._open(method, url, headers, scheme, body)
            except urllib.error.URLError as exc:
                reason = exc.reason
                if i + 1 < len(schemes) and isinstance(reason, (ssl.SSLError, ConnectionError)):
                    continue  # --insecure: not TLS, try plain HTTP
                raise self._unreachable(reason) from exc
            except (TimeoutError, ConnectionError) as exc:
                raise self._unreachable(exc) from exc
            self._scheme = scheme
            return result
        raise AssertionError("unreachable")

    def _unreachable(self, reason: object) -> RegistryError:
        if isinstance(reason, ssl.SSLCertVerificationError):
            return RegistryError(
                f"registry {self.registry}: its TLS certificate is not trusted "
                f"({reason.verify_message})",
                hint="pass --cert-dir DIR with the registry's CA as DIR/ca.crt, or install it in "
                f"/etc/containers/certs.d/{self.registry}/ca.crt",
            )
        if isinstance(reason, ssl.SSLError):
            return RegistryError(
                f"registry {self.registry}: TLS handshake failed ({reason})",
                hint="a registry that speaks plain HTTP needs --insecure",
            )
        return RegistryUnreachable(
            f"cannot reach registry {self.registry}: {reason}",
            hint="check the host and port, and that the registry is running",
        )

    def _token(self, params: dict[str, str]) -> str:
        query = {k: v for k, v in (("service", params.get("service")),) if v}
        scope = params.get("scope") or f"repository:{self.repository}:pull"
        url = params["realm"] + "?" + urllib.parse.urlencode({**query, "scope": scope})
        headers = {"Authorization": self.creds.basic()} if self.creds else {}
        scheme = urllib.parse.urlsplit(url).scheme
        status, _, body = self._open("GET", url, headers, scheme)
        if status != 200:
            raise self._refused(status, body)
        data = json.loads(body)
        return "Bearer " + str(data.get("token") or data.get("access_token"))

    def _refused(self, status: int, body: bytes) -> RegistryError:
        said = registry_message(body) or f"HTTP {status}"
        if self.creds is None:
            where = ", ".join(str(p) for p in config_files())
            return RegistryError(
                f"registry {self.registry} wants credentials and none were found: {said}",
                hint=f"log in with `docker login {self.registry}` (looked in {where})",
                status=status,
            )
        return RegistryError(
            f"registry {self.registry} refused the credentials of user {self.creds.username!r} "
            f"(from {self.creds.source}): {said}",
            hint=f"check the password or token; log in again with `docker login {self.registry}`",
            status=status,
        )

    def request(
        self,
        method: str,
        path: str,
        accept: tuple[str, ...] = (),
        *,
        body: bytes | None = None,
        content_type: str | None = None,
    ) -> tuple[int, Message, bytes]:
        """One request with the repository's credentials; ``body`` (with ``content_type``)
        for the few writes envbuild does itself (:mod:`envbuild.registry.referrers`)."""
        headers = {"Accept": ", ".join(accept)} if accept else {}
        if content_type:
            headers["Content-Type"] = content_type
        sent = self._authorization
        if sent:
            headers["Authorization"] = sent
        status, resp_headers, answer = self._send(method, path, headers, body)
        if status == 401 and sent and sent.startswith("Bearer ") and body is not None:
            # a token for pulling does not cover a push: ask for one with the scope challenged
            scheme, params = _challenge(resp_headers.get("WWW-Authenticate", ""))
            if scheme == "bearer" and "realm" in params:
                with self._login:
                    self._authorization = self._token(params)
                headers["Authorization"] = self._authorization
                status, resp_headers, answer = self._send(method, path, headers, body)
        body_sent, body = body, answer
        if status == 401 and not sent:
            # one login for all threads: another may have logged in since this request went out
            with self._login:
                if not self._authorization:
                    scheme, params = _challenge(resp_headers.get("WWW-Authenticate", ""))
                    if scheme == "basic" and self.creds is not None:
                        self._authorization = self.creds.basic()
                    elif scheme == "bearer" and "realm" in params:
                        self._authorization = self._token(params)
                    else:
                        raise self._refused(status, self._words(method, path, headers, body))
                headers["Authorization"] = self._authorization
            status, resp_headers, body = self._send(method, path, headers, body_sent)
        if status in (401, 403):
            raise self._refused(status, self._words(method, path, headers, body))
        return status, resp_headers, body

    def _words(self, method: str, path: str, headers: dict[str, str], body: bytes) -> bytes:
        """An answer to HEAD carries no body: ask again with GET for the registry's words."""
        if method != "HEAD" or body:
            return body
        return self._send("GET", path, headers)[2]

    def _fail(self, status: int, body: bytes, what: str) -> RegistryError:
        return RegistryError(
            f"registry {self.registry} answered HTTP {status} for {what}: {registry_message(body)}",
            status=status,
        )

    # -- questions ----------------------------------------------------------------------------
    def ping(self) -> None:
        """Check the registry answers and takes our credentials (for this repository)."""
        self.manifest_digest("envbuild-ping")

    def blob_exists(self, digest: str) -> bool:
        status, _, body = self.request("HEAD", f"/v2/{self.repository}/blobs/{digest}")
        if status == 200:
            return True
        if status == 404:
            return False
        raise self._fail(status, body, f"blob {digest}")

    def manifest_digest(self, reference: str) -> str | None:
        """The digest the registry reports for a tag or digest, or None if it has none."""
        path = f"/v2/{self.repository}/manifests/{reference}"
        status, headers, body = self.request("HEAD", path, MANIFEST_TYPES)
        if status == 404:
            return None
        if status != 200:
            raise self._fail(status, body, f"manifest {reference}")
        digest = headers.get("Docker-Content-Digest")
        if not digest:
            raise RegistryError(
                f"registry {self.registry} did not report a digest for {reference}",
                hint="envbuild needs a registry that sends Docker-Content-Digest",
            )
        return str(digest)

    def manifest_bytes(self, digest: str) -> bytes:
        """The bytes of the manifest ``digest`` names, checked against that digest."""
        status, _, body = self.request(
            "GET", f"/v2/{self.repository}/manifests/{digest}", MANIFEST_TYPES
        )
        if status != 200:
            raise self._fail(status, body, f"manifest {digest}")
        if "sha256:" + hashlib.sha256(body).hexdigest() != digest:
            raise IntegrityError(f"registry {self.registry} sent a manifest that is not {digest}")
        return body

    def manifest(self, digest: str) -> dict[str, Any]:
        """The manifest ``digest`` names, checked against that digest."""
        data = json.loads(self.manifest_bytes(digest))
        if not isinstance(data, dict):
            raise IntegrityError(f"registry {self.registry}: manifest {digest} is not an object")
        return data

    def tags(self, limit: int = 10_000) -> list[str]:
        """The repository's tags (``GET /v2/<repo>/tags/list``), at most ``limit``."""
        status, _, body = self.request("GET", f"/v2/{self.repository}/tags/list?n={limit}")
        if status == 404:
            return []
        if status != 200:
            raise self._fail(status, body, "the tag list")
        try:
            found = json.loads(body).get("tags") or []
        except (ValueError, AttributeError):
            raise RegistryError(
                f"registry {self.registry} sent a tag list that is no JSON"
            ) from None
        return [t for t in found if isinstance(t, str)][:limit]

    def read_blob(self, digest: str, size: int, sink: Any, chunk: int = 1 << 20) -> int:
        """Stream blob ``digest`` into ``sink`` (anything with ``write``), reading at most
        ``size`` bytes: a body longer or shorter than the descriptor's size is refused
        (:class:`IntegrityError`) before or as the bytes arrive, never read whole into memory.
        The digest is the caller's to check (the store's blob writer does). Returns the bytes."""
        path = f"/v2/{self.repository}/blobs/{digest}"
        self.request("HEAD", path)  # logs in (a token for pulls) without reading the body
        headers = {"Authorization": self._authorization} if self._authorization else {}
        scheme = self._scheme or "https"
        req = urllib.request.Request(f"{scheme}://{self.registry}{path}", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT, context=self._context(scheme)) as r:
                length = r.headers.get("Content-Length")
                if length is not None and length.isdigit() and int(length) != size:
                    raise IntegrityError(
                        f"registry {self.registry}: blob {digest} is {length} bytes, its "
                        f"descriptor says {size}"
                    )
                got = 0
                while got < size and (data := r.read(min(chunk, size - got))):
                    sink.write(data)
                    got += len(data)
                if got != size or r.read(1):
                    raise IntegrityError(
                        f"registry {self.registry}: blob {digest} is not the {size} bytes its "
                        "descriptor says (cut short or longer)"
                    )
                return got
        except urllib.error.HTTPError as exc:
            raise self._fail(exc.code, exc.read(), f"blob {digest}") from exc
        except urllib.error.URLError as exc:
            raise self._unreachable(exc.reason) from exc
        except (TimeoutError, ConnectionError) as exc:
            raise self._unreachable(exc) from exc
