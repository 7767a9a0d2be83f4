"""The image's SBOM: a CycloneDX 1.6 JSON document made with cyclonedx-python-lib.

Input: the build manifest (the image digest, every layer's distributions, the source builds and
patches with their inputs), the plan (each installed wheel's file name and sha256), the lock (the
Debian base's packages) and the wheels themselves (the license their METADATA declares). Output:
the document's bytes, the same for the same inputs (serial number derived from the image digest,
timestamp the image's ``created``, every ``bom-ref`` a purl), and, in the image's OCI layout, an
artifact (``artifactType`` ``application/vnd.cyclonedx+json``) whose ``subject`` is the image
manifest: an OCI 1.1 referrer, listed in ``index.json`` with its ``artifactType`` so readers that
want the image skip it.

It offers :func:`make_sbom` (bytes), :func:`artifact_manifest` (its referrer), :func:`attach`
(into an existing layout), :func:`read_attached`
(the SBOM of a layout's image, checked), :func:`wheel_license`, and :func:`image_sbom`, the
build's SBOM stage (all three blobs made once per build manifest and kept in the store).
"""

from __future__ import annotations

import json
import logging
import uuid
import zipfile
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

from envbuild import __version__
from envbuild.build import image, ocilayout
from envbuild.build.fetch import fetch_wheels
from envbuild.build.manifest import BuildManifest
from envbuild.build.outputs import SBOM_FILE, Sbom
from envbuild.build.plan import Plan
from envbuild.errors import InputFileError, IntegrityError, ManifestError
from envbuild.fsio import canonical_json, compact_json, sha256_bytes, write_atomic
from envbuild.lock.model import DebianBaseLock, Lock
from envbuild.lock.wheels import WheelRef
from envbuild.oci import core as oci
from envbuild.store.core import Output, Store

log = logging.getLogger(__name__)

MEDIA_TYPE = "application/vnd.cyclonedx+json"
EMPTY = "application/vnd.oci.empty.v1+json"
EMPTY_JSON = b"{}"
#: Bumped whenever the same inputs would give another document.
SBOM_FORMAT = 1
_NS = uuid.UUID("6f1d3f1e-2b9c-4c55-9a43-6a1b7de0c0a1")  # envbuild's namespace for serial numbers
_SUITES = {"bookworm": "debian-12", "trixie": "debian-13", "bullseye": "debian-11"}


def wheel_license(path: Path) -> str | None:
    """The license a wheel's METADATA declares: ``License-Expression`` (PEP 639), else the
    first line of ``License``; None when it declares neither or cannot be read."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = [
                n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")
            ]
            if len(names) != 1:
                return None
            with zf.open(names[0]) as f:
                head = f.read(1 << 20).decode("utf-8", errors="replace")
    except (OSError, zipfile.BadZipFile, ValueError):
        return None
    msg = HeaderParser().parsestr(head.split("\n\n", 1)[0] + "\n")
    for key in ("License-Expression", "License"):
        value = (msg.get(key) or "").strip()
        if value and value.upper() != "UNKNOWN":
            return value.splitlines()[0].strip()[:200]
    return None


def make_sbom(
    manifest: BuildManifest,
    plan: Plan,
    lock: Lock,
    *,
    created: datetime,
    license_of: Callable[[str], str | None] = lambda sha256: None,
) -> bytes:
    """The CycloneDX 1.6 JSON of the image ``manifest`` describes (see the module's doc);
    ``license_of`` maps a wheel's sha256 to its declared license."""
    from cyclonedx.contrib.license.factories import LicenseFactory
    from cyclonedx.model import HashAlgorithm, HashType, Property, XsUri
    from cyclonedx.model.bom import Bom, BomMetaData
    from cyclonedx.model.bom_ref import BomRef
    from cyclonedx.model.component import (
        Component,
        ComponentType,
        Diff,
        Patch,
        PatchClassification,
        Pedigree,
    )
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    def sha(value: str) -> HashType:
        return HashType(alg=HashAlgorithm.SHA_256, content=value.removeprefix("sha256:"))

    def component(kind: ComponentType, purl: PackageURL, name: str, version: str,
                  hashes: Iterable[str] = (), **kw: Any) -> Component:  # fmt: skip
        return Component(
            type=kind, name=name, version=version, purl=purl, bom_ref=BomRef(purl.to_string()),
            hashes=[sha(h) for h in hashes], **kw,
        )  # fmt: skip

    licenses = LicenseFactory()
    builds = {b.dist: b for b in manifest.source_builds}
    patches = {p.dist: p for p in manifest.patches}
    subject = component(
        ComponentType.CONTAINER,
        PackageURL("oci", name=manifest.spec, version=manifest.image),
        manifest.spec, manifest.image, [manifest.image],
        description=f"the image envbuild built from spec {manifest.spec}",
    )  # fmt: skip
    parts: list[Component] = []
    for layer in plan.layers:
        for dist in layer.dists:
            qualifiers = {"file_name": dist.filename}
            props = [Property(name="envbuild:layer", value=layer.name)]
            pedigree = None
            if (b := builds.get(dist.name)) is not None:
                ancestor = component(
                    ComponentType.LIBRARY,
                    PackageURL("pypi", name=b.dist, version=b.version,
                               qualifiers={"file_name": b.sdist.get("name", "")}),
                    b.dist, b.version, [b.sdist.get("sha256", "")],
                )  # fmt: skip
                pedigree = Pedigree(ancestors=[ancestor])
                props += [Property(name=f"envbuild:build:flag:{k}", value=v)
                          for k, v in sorted(b.flags.items())]  # fmt: skip
                props.append(Property(name="envbuild:build:key", value=b.key))
            if (p := patches.get(dist.name)) is not None:
                source = component(
                    ComponentType.LIBRARY,
                    PackageURL("pypi", name=p.dist, version=p.version,
                               qualifiers={"file_name": p.source_wheel.get("name", "")}),
                    p.dist, p.version, [p.source_wheel.get("sha256", "")],
                )  # fmt: skip
                diffs = [
                    Patch(type=PatchClassification.UNOFFICIAL,
                          diff=Diff(url=XsUri(f"file:{x['path']}")))
                    for x in p.patches
                ]  # fmt: skip
                ancestors = [*(pedigree.ancestors if pedigree else []), source]
                pedigree = Pedigree(ancestors=ancestors, patches=diffs)
                props += [Property(name="envbuild:patch", value=f"{x['path']} sha256:{x['sha256']}")
                          for x in p.patches]  # fmt: skip
            declared = license_of(dist.sha256)
            parts.append(
                component(
                    ComponentType.LIBRARY,
                    PackageURL("pypi", name=dist.name, version=dist.version, qualifiers=qualifiers),
                    dist.name, dist.version, [dist.sha256],
                    licenses=[licenses.make_from_string(declared)] if declared else [],
                    pedigree=pedigree, properties=props,
                )
            )  # fmt: skip
    base = lock.envbuild.base
    if isinstance(base, DebianBaseLock):
        distro = _SUITES.get(base.suite, base.suite)
        for pkg in base.packages:
            parts.append(
                component(
                    ComponentType.LIBRARY,
                    PackageURL("deb", namespace="debian", name=pkg.name, version=pkg.version,
                               qualifiers={"arch": pkg.arch, "distro": distro}),
                    pkg.name, pkg.version, [pkg.sha256],
                    properties=[Property(name="envbuild:layer", value="base")],
                )
            )  # fmt: skip
    tool = Component(type=ComponentType.APPLICATION, name="envbuild", version=__version__,
                     bom_ref=BomRef("envbuild"))  # fmt: skip
    meta = BomMetaData(component=subject, timestamp=created)
    meta.tools.components.add(tool)
    bom = Bom(serial_number=uuid.uuid5(_NS, manifest.image), metadata=meta, components=parts)
    bom.register_dependency(subject, parts)
    for part in parts:
        bom.register_dependency(part, [])
    doc = json.loads(JsonV1Dot6(bom).output_as_string(indent=None))
    data = compact_json(doc) + b"\n"
    validate(data)  # every SBOM envbuild writes, in every build and test, passes the schema
    return data


def validate(data: bytes) -> None:
    """Check ``data`` against CycloneDX 1.6's JSON schema (the library's strict validator); an
    invalid SBOM is envbuild's bug (an internal error, exit 4), never written."""
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(data.decode("utf-8"))
    if error is not None:
        raise RuntimeError(f"the SBOM envbuild made is not valid CycloneDX 1.6: {error}")


# --- in the OCI layout ------------------------------------------------------------------------


def artifact_manifest(subject: dict[str, Any], sbom: bytes, *, created: str) -> bytes:
    """The OCI 1.1 artifact manifest that carries ``sbom`` as a referrer of the image manifest
    ``subject`` (its ``mediaType``, ``digest`` and ``size``): an empty config, the document as
    its one layer. Its blobs are the document, :data:`EMPTY_JSON` and these bytes; the build
    keeps all three in the store and :func:`envbuild.build.ocilayout.write_oci_layout` places
    them."""
    manifest = {
        "schemaVersion": 2,
        "mediaType": oci.OCI_MANIFEST,
        "artifactType": MEDIA_TYPE,
        "config": {"mediaType": EMPTY, **_descriptor(EMPTY_JSON)},
        "layers": [{"mediaType": MEDIA_TYPE, **_descriptor(sbom),
                    "annotations": {"org.opencontainers.image.title": SBOM_FILE}}],
        "subject": {k: subject[k] for k in ("mediaType", "digest", "size")},
        "annotations": {"org.opencontainers.image.created": created},
    }  # fmt: skip
    return compact_json(manifest)


def _descriptor(data: bytes) -> dict[str, Any]:
    return {"digest": f"sha256:{sha256_bytes(data)}", "size": len(data)}


def attach(layout: Path, sbom: bytes, *, created: str) -> str:
    """Put ``sbom`` into an existing OCI layout ``layout`` as a referrer of its image (the one
    entry of ``index.json`` without an ``artifactType``), replacing an SBOM entry listed
    before; returns the artifact manifest's digest. (A build does not use this: its output
    folder gets the referrer from the store, see :func:`artifact_manifest`.)"""
    images = oci.read_index(layout).images
    if len(images) != 1:
        raise ManifestError(f"{layout}: expected one image in index.json, found {len(images)}")
    data = artifact_manifest(images[0].to_json(), sbom, created=created)
    # rewritten from the document itself, so what the reader does not model stays as it was
    index_path = layout / "index.json"
    index = json.loads(index_path.read_bytes())
    for blob in (EMPTY_JSON, sbom, data):
        path = layout / "blobs" / "sha256" / sha256_bytes(blob)
        if not path.is_file():
            write_atomic(path, blob)
    desc = {"mediaType": oci.OCI_MANIFEST, "artifactType": MEDIA_TYPE, **_descriptor(data)}
    others = [m for m in index.get("manifests", []) if m.get("artifactType") != MEDIA_TYPE]
    new = compact_json({**index, "manifests": [*others, desc]})
    if index_path.read_bytes() != new:
        write_atomic(index_path, new)
    return str(desc["digest"])


def read_attached(layout: Path) -> bytes:
    """The SBOM a layout's image carries: the artifact whose subject is its image, every digest
    checked. A layout that does not hold one, or holds a broken one, is a
    :class:`~envbuild.errors.ManifestError` (or :class:`~envbuild.errors.IntegrityError` when a
    blob does not match its digest)."""
    try:
        return _read_attached(layout)
    except (InputFileError, OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ManifestError(f"{layout}: no readable SBOM: {exc}") from None


def _read_attached(layout: Path) -> bytes:
    index = oci.read_index(layout)
    sboms = [m.to_json() for m in index.manifests if m.artifact_type == MEDIA_TYPE]
    if len(index.images) != 1 or len(sboms) != 1:
        raise ManifestError(f"{layout}: no single image with a single SBOM in index.json")
    manifest = json.loads(_verified(layout, sboms[0]))
    if (manifest.get("subject") or {}).get("digest") != index.images[0].digest:
        raise IntegrityError(f"{layout}: the SBOM's subject is not the layout's image")
    layers = manifest["layers"]
    if not isinstance(layers, list) or len(layers) != 1:
        raise ManifestError(f"{layout}: the SBOM artifact must have one layer")
    return _verified(layout, layers[0])


def _verified(layout: Path, desc: dict[str, Any]) -> bytes:
    digest = str(desc.get("digest", ""))
    if not oci.DIGEST_RE.fullmatch(digest):
        raise ManifestError(f"{layout}: bad digest {digest[:80]!r}")
    data = (layout / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes()
    if f"sha256:{sha256_bytes(data)}" != digest or len(data) != desc.get("size"):
        raise IntegrityError(f"{layout}: blob {digest} does not match its digest")
    return data


# --- the stage: the SBOM of a build, kept in the store -----------------------------------------


def image_sbom(
    plan: Plan,
    lock: Lock,
    manifest: BuildManifest,
    store: Store,
    *,
    by_sha: Mapping[str, WheelRef],
    made: Mapping[str, Path],
) -> tuple[Sbom, str]:
    """The image's CycloneDX SBOM and its OCI 1.1 referrer, all three
    blobs (document, empty config, artifact manifest) made once per build manifest and kept in
    the store (a no-op rebuild reads no wheel). ``by_sha`` names the locked wheels by sha256,
    ``made`` the files of the wheels the build made (source builds, patches). Returns them and
    the derivation's key; :func:`~envbuild.build.outputs.write_outputs` puts them into the
    output folder."""
    created = image.created_for(lock.envbuild.exclude_newer, plan.created)
    inputs = {
        "format": SBOM_FORMAT,
        "manifest": canonical_json(manifest.model_dump(mode="json")),
    }

    def make() -> Output:
        shas = [d.sha256 for layer in plan.layers for d in layer.dists if d.sha256 not in made]
        wanted = [by_sha[sha] for sha in shas if sha in by_sha]
        paths = {**fetch_wheels(wanted, store), **made}
        data = make_sbom(
            manifest, plan, lock, created=datetime.fromisoformat(created),
            license_of=lambda sha: wheel_license(paths[sha]) if sha in paths else None,
        )  # fmt: skip
        subject = {"mediaType": oci.OCI_MANIFEST, "digest": manifest.image,
                   "size": store.blob_path(manifest.image).stat().st_size}  # fmt: skip
        art = artifact_manifest(subject, data, created=created)
        return Output(
            outputs={
                "sbom": store.add_bytes(data),
                "config": store.add_bytes(EMPTY_JSON),
                "manifest": store.add_bytes(art),
            }
        )

    drv = store.realize("sbom", inputs, make).drv
    data = store.read_blob(drv.outputs["sbom"])
    art = drv.outputs["manifest"]
    referrer = ocilayout.Referrer(
        descriptor={
            "mediaType": oci.OCI_MANIFEST,
            "artifactType": MEDIA_TYPE,
            "digest": art,
            "size": store.blob_path(art).stat().st_size,
        },
        blobs=(drv.outputs["sbom"], drv.outputs["config"], art),
    )
    log.debug("sbom %s (key %s)", drv.outputs["sbom"], drv.key[:12])
    return Sbom(data=data, referrer=referrer), drv.key
