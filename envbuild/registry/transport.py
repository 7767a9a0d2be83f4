"""How image bytes move between an OCI layout and a registry: an abstract :class:`Transport`
and its skopeo implementation (the docker-engine one is in :mod:`envbuild.registry.engine`).

A transport copies; it does not decide. Which blobs the registry already has, which digest a tag
names, and whether what arrived is what was sent, are checked around it in
:mod:`envbuild.registry` with the registry's API and the layout's own digests.
"""

from __future__ import annotations

import re
import shutil
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from envbuild import scratch
from envbuild.errors import IntegrityError, RegistryError, ToolFailed
from envbuild.oci.layout import REF_NAME, LayoutImage
from envbuild.proc import core as proc
from envbuild.registry.api import Endpoint
from envbuild.registry.auth import Credentials, auth_file
from envbuild.registry.ref import ImageRef

SKOPEO_HINT = (
    "install skopeo (apt-get install skopeo), or run a Docker engine and use --transport docker"
)


@dataclass(frozen=True)
class Copied:
    """What a push reports: the manifest digest the registry stored; an engine that recompresses
    layers also says, per layer (by the first 12 hex digits of its diff_id), whether it sent it."""

    digest: str
    uploaded_by_diff_id: dict[str, bool] | None = None


class Transport(ABC):
    """Copies one image between a local OCI layout and a registry."""

    name: str
    #: True when the registry gets the layout's own manifest and blobs, byte for byte.
    preserves_digests: bool = True

    @abstractmethod
    def push(
        self, image: LayoutImage, target: ImageRef, endpoint: Endpoint, creds: Credentials | None
    ) -> Copied:
        """Copy ``image`` to ``target``; say which manifest digest the registry got."""

    @abstractmethod
    def pull(
        self,
        source: ImageRef,
        dest: Path,
        endpoint: Endpoint,
        creds: Credentials | None,
        tag: str | None,
    ) -> None:
        """Copy ``source`` (pinned by digest) into a new OCI layout at ``dest``, named ``tag``."""


def _tool_message(output: str) -> str:
    """skopeo's fatal line without its logrus decoration."""
    found: list[str] = re.findall(r'msg="((?:[^"\\]|\\.)*)"', output)
    if found:
        return found[-1].replace('\\"', '"')
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def classify(exc: ToolFailed, registry: str, creds: Credentials | None) -> Exception:
    """Turn a failed copy into the error a user can act on."""
    said = _tool_message(exc.output_tail)
    low = said.lower()
    if any(
        s in low
        for s in ("digest did not match", "digest mismatch", "size mismatch", "verification failed")
    ):
        return IntegrityError(
            f"registry {registry} sent a blob that does not match its digest; it was refused: "
            f"{said}",
            hint="the registry's copy is corrupt: push the image again from a good copy",
        )
    if "unauthorized" in low or "authentication required" in low or "denied" in low:
        who = f"user {creds.username!r} (from {creds.source})" if creds else "no credentials"
        return RegistryError(
            f"registry {registry} refused {who}: {said}",
            hint=f"check the password or token; log in again with `docker login {registry}`",
        )
    if "x509" in low or "certificate" in low:
        return RegistryError(
            f"registry {registry}: its TLS certificate is not trusted: {said}",
            hint="pass --cert-dir DIR with the registry's CA as DIR/ca.crt, or install it in "
            f"/etc/containers/certs.d/{registry}/ca.crt",
        )
    if "http response to https client" in low:
        return RegistryError(
            f"registry {registry} speaks plain HTTP: {said}", hint="pass --insecure"
        )
    if "connection refused" in low or "no such host" in low or "i/o timeout" in low:
        return RegistryError(
            f"cannot reach registry {registry}: {said}",
            hint="check the host and port, and that the registry is running",
        )
    return RegistryError(f"copying failed: {said}", hint=exc.hint)


class Skopeo(Transport):
    """``skopeo copy`` between ``oci:DIR`` and ``docker://REF``, digests preserved."""

    name = "skopeo"

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or proc.which("skopeo", hint=SKOPEO_HINT, env_var="SKOPEO")

    @staticmethod
    def available() -> bool:
        return shutil.which("skopeo") is not None

    def _tls_args(self, side: str, endpoint: Endpoint) -> list[str]:
        args = [f"--{side}-tls-verify={'false' if endpoint.insecure else 'true'}"]
        if endpoint.cert_dir is not None:
            args += [f"--{side}-cert-dir", str(endpoint.cert_dir)]
        return args

    def _copy(self, args: list[str], registry: str, creds: Credentials | None) -> None:
        try:
            proc.run([self.binary, "copy", "--retry-times", "2", *args], tool="skopeo",
                     env=proc.child_env(), stream=True)  # fmt: skip
        except ToolFailed as exc:
            raise classify(exc, registry, creds) from exc

    def push(
        self, image: LayoutImage, target: ImageRef, endpoint: Endpoint, creds: Credentials | None
    ) -> Copied:
        name = image.manifest.annotations.get(REF_NAME)
        source = f"oci:{image.root}" + (f":{name}" if name else "")
        with auth_file(target.registry, creds) as authfile, scratch.temp_dir("copy-") as tmp:
            digestfile = Path(tmp) / "digest"
            self._copy(
                [
                    "--preserve-digests",
                    "--digestfile", str(digestfile),
                    "--dest-authfile", str(authfile),
                    *self._tls_args("dest", endpoint),
                    source,
                    f"docker://{target}",
                ],
                target.registry,
                creds,
            )  # fmt: skip
            return Copied(digestfile.read_text().strip())

    def pull(
        self,
        source: ImageRef,
        dest: Path,
        endpoint: Endpoint,
        creds: Credentials | None,
        tag: str | None,
    ) -> None:
        with auth_file(source.registry, creds) as authfile:
            self._copy(
                [
                    "--preserve-digests",
                    "--src-authfile", str(authfile),
                    *self._tls_args("src", endpoint),
                    f"docker://{source.name}@{source.digest}",
                    f"oci:{dest}" + (f":{tag}" if tag else ""),
                ],
                source.registry,
                creds,
            )  # fmt: skip
