"""The SBOM's readers of untrusted bytes: a wheel's METADATA (from an index) and a layout's
referrer (from disk or a registry) give a value or a clear error, never a traceback."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envbuild.build import sbom
from envbuild.errors import IntegrityError, ManifestError
from envbuild.oci import core as oci


def _wheel(path: Path, metadata: str) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("demo-1.0.dist-info/METADATA", metadata)
        zf.writestr("demo/__init__.py", "")
    return path


def test_the_license_a_wheel_declares(tmp_path: Path):
    head = "Metadata-Version: 2.4\nName: demo\nVersion: 1.0\n"
    expr = _wheel(tmp_path / "a.whl", head + "License-Expression: MIT OR Apache-2.0\n\nbody")
    assert sbom.wheel_license(expr) == "MIT OR Apache-2.0"
    text = _wheel(tmp_path / "b.whl", head + "License: BSD-3-Clause\n        more text\n\n")
    assert sbom.wheel_license(text) == "BSD-3-Clause"
    none = _wheel(tmp_path / "c.whl", head + "License: UNKNOWN\n\n")
    assert sbom.wheel_license(none) is None
    assert sbom.wheel_license(tmp_path / "missing.whl") is None


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=2000), metadata=st.text(max_size=400))
def test_a_broken_wheel_has_no_license_and_no_traceback(tmp_path: Path, data: bytes, metadata: str):
    (tmp_path / "junk.whl").write_bytes(data)
    assert sbom.wheel_license(tmp_path / "junk.whl") is None
    found = sbom.wheel_license(_wheel(tmp_path / "w.whl", metadata))
    assert found is None or (isinstance(found, str) and len(found) <= 200 and "\n" not in found)


def _layout(tmp_path: Path) -> Path:
    import tempfile

    root = Path(tempfile.mkdtemp(dir=tmp_path)) / "layout"
    (root / "blobs" / "sha256").mkdir(parents=True)
    image = b'{"schemaVersion":2}'
    import hashlib

    digest = hashlib.sha256(image).hexdigest()
    (root / "blobs" / "sha256" / digest).write_bytes(image)
    desc = {"mediaType": oci.OCI_MANIFEST, "digest": f"sha256:{digest}", "size": len(image)}
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [desc]}))
    (root / "oci-layout").write_bytes(oci.OCI_LAYOUT)
    return root


def test_attach_then_read_gives_the_bytes_back_and_attach_is_idempotent(tmp_path: Path):
    root = _layout(tmp_path)
    first = sbom.attach(root, b'{"bomFormat":"CycloneDX"}\n', created="2026-01-01T00:00:00Z")
    before = (root / "index.json").read_bytes()
    again = sbom.attach(root, b'{"bomFormat":"CycloneDX"}\n', created="2026-01-01T00:00:00Z")
    assert first == again and (root / "index.json").read_bytes() == before
    assert sbom.read_attached(root) == b'{"bomFormat":"CycloneDX"}\n'
    # a new SBOM replaces the old entry
    sbom.attach(root, b'{"bomFormat":"CycloneDX","version":2}\n', created="2026-01-01T00:00:00Z")
    index = json.loads((root / "index.json").read_text())
    assert len(index["manifests"]) == 2
    assert sbom.read_attached(root) == b'{"bomFormat":"CycloneDX","version":2}\n'


def test_a_folder_without_oci_layout_holds_no_sbom(tmp_path: Path):
    # the reader is envbuild.oci's, which refuses a folder that is not an OCI layout
    root = _layout(tmp_path)
    sbom.attach(root, b"{}\n", created="2026-01-01T00:00:00Z")
    (root / "oci-layout").unlink()
    with pytest.raises(ManifestError, match="not an OCI image layout"):
        sbom.read_attached(root)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=80),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(index=json_values, artifact=json_values, raw=st.binary(max_size=300))
def test_a_hostile_layout_is_a_clear_error(tmp_path: Path, index, artifact, raw: bytes):
    root = _layout(tmp_path)
    sbom.attach(root, b"{}\n", created="2026-01-01T00:00:00Z")
    real = json.loads((root / "index.json").read_text())
    # an arbitrary index, an arbitrary artifact manifest, or arbitrary bytes
    for text in (json.dumps(index).encode(), raw):
        (root / "index.json").write_bytes(text)
        with pytest.raises((ManifestError, IntegrityError)):
            sbom.read_attached(root)
    (root / "index.json").write_text(json.dumps(real))
    art = real["manifests"][1]
    body = json.dumps(artifact).encode()
    path = root / "blobs" / "sha256" / art["digest"][7:]
    path.write_bytes(body)
    with pytest.raises((ManifestError, IntegrityError)):
        sbom.read_attached(root)  # the digest no longer matches, or the document is wrong


class _Registry:
    """A registry API whose every answer is given (a subclass-free stand-in for RegistryApi's
    one method the referrers code calls, plus its two names)."""

    registry = "hostile.example"
    repository = "r"

    def __init__(self, answers: dict[str, tuple[int, bytes]]) -> None:
        self.answers = answers

    def request(self, method: str, path: str, accept: tuple[str, ...] = (), **_: object):
        from email.message import Message

        status, body = self.answers.get(path.split("/")[3], (404, b""))
        return status, Message(), body


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    listing=json_values | st.binary(max_size=200),
    manifest=json_values,
    blob=st.binary(max_size=100),
    status=st.sampled_from([200, 404, 500]),
)
def test_a_hostile_registry_referrer_is_refused_cleanly(
    tmp_path: Path, listing, manifest, blob, status
):
    import hashlib

    from envbuild.errors import RegistryError
    from envbuild.registry.referrers import pull_referrers

    root = _layout(tmp_path)
    subject = "sha256:" + "0" * 64
    body = listing if isinstance(listing, bytes) else json.dumps(listing).encode()
    doc = json.dumps(manifest).encode()
    desc = {"artifactType": sbom.MEDIA_TYPE, "digest": "sha256:" + hashlib.sha256(doc).hexdigest()}
    answers = {
        "referrers": (status, body),
        "manifests": (200, doc),
        "blobs": (200, blob),
    }
    try:
        got = pull_referrers(_Registry(answers), subject, root, [sbom.MEDIA_TYPE])  # type: ignore[arg-type]
    except (RegistryError, IntegrityError, ManifestError):
        return
    assert got == [] or all(d.startswith("sha256:") for d in got)
    # and a listing that names a real-looking artifact whose manifest is arbitrary
    answers["referrers"] = (200, json.dumps({"manifests": [desc]}).encode())
    try:
        pull_referrers(_Registry(answers), subject, root, [sbom.MEDIA_TYPE])  # type: ignore[arg-type]
    except (RegistryError, IntegrityError, ManifestError):
        return
    raise AssertionError("an arbitrary manifest with no subject was accepted")
