"""A registry image pinned by digest, pulled with skopeo and checked against that digest.

``skopeo inspect --raw`` fetches the manifest the digest names and its sha256 is compared with
the pin; a multi-platform index is followed to its ``linux/<arch>`` manifest (whose digest the
index fixes). ``skopeo copy`` then pulls that manifest into a ``dir:`` folder, which keeps the
manifest's bytes as the registry served them; the manifest, the config and every layer are
checked against their digests again as they enter the store, and the layers are scanned
(:func:`envbuild.build.base.rootfs.import_image`). The derivation key is the manifest digest: the
same
image pulled from a mirror is the same base.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from envbuild.build.base.model import BaseImage
from envbuild.build.base.rootfs import base_from_output, import_image
from envbuild.build.base.tarsafe import Limits
from envbuild.errors import IntegrityError, ManifestError
from envbuild.lock.model import ImageBaseLock
from envbuild.oci.layout import DIGEST_RE, INDEX_TYPES
from envbuild.proc import core as proc
from envbuild.store.blobs import digest_hex
from envbuild.store.core import Output, Store

log = logging.getLogger(__name__)

#: 2: the member rules of :mod:`envbuild.build.base.tarsafe`: an image pulled under older rules is
#: read again. 3: their NUL, whiteout and cost rules, and the setuid/setgid files recorded.
RECIPE = 3
HINT = "check that the registry answers and holds that digest (skopeo: apt-get install skopeo)"


def _tls(tls_verify: bool, flag: str = "--src-tls-verify") -> list[str]:
    return [] if tls_verify else [f"{flag}=false"]


def _raw_manifest(ref: str, digest: str, tls_verify: bool) -> dict[str, Any]:
    done = proc.run(
        [
            "skopeo",
            "inspect",
            "--raw",
            *_tls(tls_verify, "--tls-verify"),
            f"docker://{ref}@{digest}",
        ],
        tool="skopeo",
        env=proc.child_env(),
        hint=HINT,
    )
    data = done.stdout.encode()
    actual = f"sha256:{hashlib.sha256(data).hexdigest()}"
    if actual != digest:
        raise IntegrityError(f"{ref}@{digest}: the registry served a manifest with digest {actual}")
    return _object(data, f"{ref}@{digest}", "manifest")


def _object(data: bytes, where: str, what: str) -> dict[str, Any]:
    """A JSON object from the registry, or a :class:`ManifestError` naming what it is not."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ManifestError(f"{where}: the {what} is not JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise ManifestError(f"{where}: the {what} is not a JSON object")
    return doc


def pull(
    store: Store,
    pin: ImageBaseLock,
    *,
    architecture: str = "amd64",
    tls_verify: bool = True,
    limits: Limits | None = None,
) -> BaseImage:
    """The image ``pin.ref@pin.digest`` (for ``linux/architecture`` when it is an index)."""
    inputs = {"recipe": RECIPE, "digest": pin.digest, "architecture": architecture}
    where = f"{pin.ref}@{pin.digest}"

    def produce() -> Output:
        digest = pin.digest
        doc = _raw_manifest(pin.ref, digest, tls_verify)
        if doc.get("mediaType") in INDEX_TYPES or "manifests" in doc:
            listed = doc.get("manifests")
            wanted = [
                m
                for m in (listed if isinstance(listed, list) else [])
                if isinstance(m, dict)
                and isinstance(m.get("platform"), dict)
                and m["platform"].get("os") == "linux"
                and m["platform"].get("architecture") == architecture
            ]
            if not wanted:
                raise ManifestError(f"{where} has no linux/{architecture} image")
            digest = str(wanted[0].get("digest"))
            if not DIGEST_RE.match(digest):
                raise ManifestError(f"{where}: its index names a bad digest {digest[:80]!r}")
        with store.temp_dir("pull-") as work:
            folder = work / "image"
            log.info("pulling %s", where)
            proc.run(
                [
                    "skopeo",
                    "copy",
                    "--quiet",
                    *_tls(tls_verify),
                    f"docker://{pin.ref}@{digest}",
                    f"dir:{folder}",
                ],
                tool="skopeo",
                env=proc.child_env(),
                hint=HINT,
            )
            data = (folder / "manifest.json").read_bytes()
            if f"sha256:{hashlib.sha256(data).hexdigest()}" != digest:
                raise IntegrityError(f"{where}: skopeo wrote a manifest that is not {digest}")
            manifest = _object(data, where, "manifest")
            store.add_bytes(data, expected=digest)

            def blob(d: str) -> Path:
                return folder / digest_hex(d)

            config_desc = manifest.get("config")
            config_digest = (
                str(config_desc.get("digest", "")) if isinstance(config_desc, dict) else ""
            )
            if not DIGEST_RE.match(config_digest):
                raise ManifestError(f"{where}: the manifest names no config digest")
            config_bytes = blob(config_digest).read_bytes()
            store.add_bytes(config_bytes, expected=config_digest)
            config = _object(config_bytes, where, "config")
            return import_image(store, manifest, config, blob, where=where, limits=limits)

    with store.session():
        got = store.realize("base-image", inputs, produce)
    return base_from_output("image", got.drv.key, got.drv.meta, pin)
