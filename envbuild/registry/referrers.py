"""OCI 1.1 referrers (the image's SBOM) to and from a registry, through its HTTP API.

A copy tool moves the image; what refers to it (an artifact manifest whose ``subject`` is the
image, listed in the layout's ``index.json`` with its ``artifactType``) is pushed here: its blobs
(uploaded unless the registry has them), its manifest by digest, and, when the registry does
not answer with ``OCI-Subject`` (it has no referrers API, as Debian's docker-registry 2.8), the
referrers tag schema's fallback: an index at tag ``sha256-<image hex>`` listing it. Pulling asks
the referrers API (``GET /v2/<repo>/referrers/<digest>``), else that tag, and copies each
artifact of the wanted types into the layout, every digest checked.

It offers :func:`layout_referrers`, :func:`push_referrers`, :func:`pull_referrers`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import urllib.parse
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from envbuild.errors import InputFileError, IntegrityError, ManifestError, RegistryError
from envbuild.fsio import compact_json, write_atomic
from envbuild.oci.layout import DIGEST_RE, OCI_INDEX, OCI_MANIFEST, read_index
from envbuild.registry.api import RegistryApi

log = logging.getLogger(__name__)


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _blob_path(layout: Path, digest: str) -> Path:
    return layout / "blobs" / "sha256" / digest.removeprefix("sha256:")


def layout_referrers(layout: Path, subject: str) -> list[dict[str, Any]]:
    """The descriptors in ``layout``'s ``index.json`` of artifacts whose subject is ``subject``
    (each manifest read and checked; a broken one is a ManifestError or IntegrityError)."""
    try:
        return _layout_referrers(layout, subject)
    except (InputFileError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ManifestError(f"{layout}: a broken artifact in index.json: {exc}") from None


def _layout_referrers(layout: Path, subject: str) -> list[dict[str, Any]]:
    out = []
    for desc in read_index(layout).manifests:
        if desc.artifact_type is None:
            continue
        data = _blob_path(layout, desc.digest).read_bytes()
        if _sha(data) != desc.digest:
            raise IntegrityError(f"{layout}: artifact manifest {desc.digest} is corrupt")
        if (json.loads(data).get("subject") or {}).get("digest") == subject:
            out.append(desc.to_json())
    return out


def _upload(api: RegistryApi, layout: Path, desc: dict[str, Any]) -> bool:
    """Upload the blob ``desc`` names unless the registry has it; True when it was sent."""
    digest = str(desc["digest"])
    if api.blob_exists(digest):
        return False
    data = _blob_path(layout, digest).read_bytes()
    if _sha(data) != digest or len(data) != desc.get("size"):
        raise IntegrityError(f"{layout}: blob {digest} does not match its digest")
    status, headers, _ = api.request("POST", f"/v2/{api.repository}/blobs/uploads/", body=b"")
    location = headers.get("Location") if status == 202 else None
    if not location:
        raise RegistryError(f"registry {api.registry} refused a blob upload (HTTP {status})")
    parts = urllib.parse.urlsplit(location)
    query = (parts.query + "&" if parts.query else "") + urllib.parse.urlencode({"digest": digest})
    status, _, _ = api.request("PUT", f"{parts.path}?{query}", body=data,
                               content_type="application/octet-stream")  # fmt: skip
    if status != 201:
        raise RegistryError(f"registry {api.registry} refused blob {digest} (HTTP {status})")
    return True


def _put_manifest(api: RegistryApi, reference: str, data: bytes, media_type: str) -> bool:
    """PUT a manifest; True when the registry says it indexed its subject (OCI-Subject)."""
    path = f"/v2/{api.repository}/manifests/{reference}"
    status, headers, body = api.request("PUT", path, body=data, content_type=media_type)
    if status != 201:
        raise RegistryError(
            f"registry {api.registry} refused manifest {reference} (HTTP {status}): "
            f"{body[:300].decode('utf-8', 'replace')}"
        )
    return bool(headers.get("OCI-Subject"))


def _fallback_tag(subject: str) -> str:
    return subject.replace(":", "-", 1)


def _get(api: RegistryApi, path: str, accept: tuple[str, ...]) -> bytes | None:
    """The body of GET ``path`` (None for 404), read no further than
    :data:`envbuild.registry.api.MAX_ANSWER` bytes (:meth:`RegistryApi.request` refuses more)."""
    status, _, body = api.request("GET", path, accept)
    if status == 404:
        return None
    if status != 200:
        raise RegistryError(f"registry {api.registry} answered HTTP {status} for {path}")
    return body


def push_referrers(
    api: RegistryApi,
    layout: Path,
    subject: str,
    *,
    pushed_as: dict[str, Any] | None = None,
    sent: list[tuple[dict[str, Any], bool]] | None = None,
) -> list[str]:
    """Push every artifact of ``layout`` that refers to ``subject`` (already in the registry);
    returns their manifest digests. ``pushed_as`` is the descriptor of the manifest the registry
    got instead of ``subject`` (an engine recompresses the layers: same config, another
    manifest): each artifact is then pushed with that as its subject, a new manifest around
    the same blobs. ``sent`` gets each blob of theirs with whether it was uploaded."""
    pushed = []
    fallback: list[dict[str, Any]] = []
    for desc in layout_referrers(layout, subject):
        data = _blob_path(layout, str(desc["digest"])).read_bytes()
        manifest = json.loads(data)
        for blob in [manifest["config"], *manifest.get("layers", [])]:
            uploaded = _upload(api, layout, blob)
            if sent is not None:
                sent.append((blob, uploaded))
        if pushed_as is not None:
            data = compact_json({**manifest, "subject": pushed_as})
            desc = {**desc, "digest": _sha(data), "size": len(data)}
        if not _put_manifest(api, str(desc["digest"]), data, OCI_MANIFEST):
            fallback.append(desc)
        pushed.append(str(desc["digest"]))
    if pushed_as is not None:
        subject = str(pushed_as["digest"])
    if fallback:
        tag = _fallback_tag(subject)
        old = _get(api, f"/v2/{api.repository}/manifests/{tag}", (OCI_INDEX,))
        new = {d["digest"] for d in fallback}
        before = json.loads(old).get("manifests", []) if old else []
        listed = [m for m in before if isinstance(m, dict) and m.get("digest") not in new]
        index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [*listed, *fallback]}
        _put_manifest(api, tag, compact_json(index), OCI_INDEX)
    for digest in pushed:
        log.info("pushed referrer %s of %s", digest, subject)
    return pushed


def _listed(api: RegistryApi, subject: str) -> list[dict[str, Any]]:
    body = _get(api, f"/v2/{api.repository}/referrers/{subject}", (OCI_INDEX,))
    if body is None:
        body = _get(api, f"/v2/{api.repository}/manifests/{_fallback_tag(subject)}", (OCI_INDEX,))
    if body is None:
        return []
    try:
        doc = json.loads(body)
    except ValueError as exc:
        raise RegistryError(f"registry {api.registry}: the referrers of {subject}: {exc}") from None
    return (
        [m for m in doc.get("manifests", []) if isinstance(m, dict)]
        if isinstance(doc, dict)
        else []
    )


def pull_referrers(
    api: RegistryApi, subject: str, layout: Path, artifact_types: Iterable[str]
) -> list[str]:
    """Copy the artifacts of ``artifact_types`` that refer to ``subject`` into ``layout`` and
    list them in its ``index.json``; returns their digests. What the registry sends is checked
    (digests, sizes, the subject); anything else is a RegistryError or IntegrityError."""
    try:
        return _pull(api, subject, layout, set(artifact_types))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise RegistryError(
            f"registry {api.registry}: a broken referrer of {subject}: {exc}"
        ) from None


def _pull(api: RegistryApi, subject: str, layout: Path, wanted: set[str]) -> list[str]:
    got: list[dict[str, Any]] = []
    for desc in _listed(api, subject):
        if desc.get("artifactType") not in wanted:
            continue
        digest = str(desc.get("digest", ""))
        if not DIGEST_RE.fullmatch(digest):
            raise IntegrityError(f"registry {api.registry}: bad referrer digest {digest[:80]!r}")
        data = _get(api, f"/v2/{api.repository}/manifests/{digest}", (OCI_MANIFEST,))
        if data is None or _sha(data) != digest:
            raise IntegrityError(f"registry {api.registry} sent a manifest that is not {digest}")
        manifest = json.loads(data)
        if (manifest.get("subject") or {}).get("digest") != subject:
            raise IntegrityError(f"referrer {digest} does not name {subject} as its subject")
        for blob in [manifest["config"], *manifest.get("layers", [])]:
            d = str(blob["digest"])
            if not DIGEST_RE.fullmatch(d):
                raise IntegrityError(f"registry {api.registry}: bad blob digest {d[:80]!r}")
            content = _get(api, f"/v2/{api.repository}/blobs/{d}", ())
            if content is None or _sha(content) != d or len(content) != blob.get("size"):
                raise IntegrityError(f"registry {api.registry} sent a blob that is not {d}")
            write_atomic(_blob_path(layout, d), content)
        write_atomic(_blob_path(layout, digest), data)
        got.append({"mediaType": OCI_MANIFEST, "artifactType": desc["artifactType"],
                    "digest": digest, "size": len(data)})  # fmt: skip
    if got:
        index = json.loads((layout / "index.json").read_bytes())
        keep = [
            m
            for m in index.get("manifests", [])
            if m.get("digest") not in {g["digest"] for g in got}
        ]
        write_atomic(layout / "index.json", compact_json({**index, "manifests": [*keep, *got]}))
    return [g["digest"] for g in got]
