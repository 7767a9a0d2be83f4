"""The image ``apply --image``/``--from`` takes its venv from, read from the registry as far as
its manifest and config, both verified (:mod:`envbuild.apply.fromimage` realizes its layers).

``--image REGISTRY/REPO@sha256:…`` names it; ``--from REGISTRY/REPO`` finds the image built from
the spec and lock being applied by the labels the build writes (``dev.envbuild.spec-hash``,
``dev.envbuild.lock-hash``), trying the tag named after the spec first. The manifest and config
are kept in the store (their digests checked), so applying the same image again asks the
registry nothing. :func:`check_image` refuses (exit 2) an image of another spec or lock, and one
whose Python this machine cannot run.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild.apply.inputs import ApplyInput
from envbuild.build.config import LABEL_PREFIX
from envbuild.errors import InputFileError, IntegrityError, UserError
from envbuild.oci.layout import DOCKER_MANIFEST, OCI_MANIFEST, Descriptor
from envbuild.registry.api import Endpoint, RegistryApi
from envbuild.registry.ref import ImageRef
from envbuild.snapshot import pyenv
from envbuild.spec.model import Spec
from envbuild.store.core import Store

log = logging.getLogger(__name__)

#: An image config bigger than this is not one envbuild wrote.
MAX_CONFIG = 4 << 20
MAX_MANIFEST = 4 << 20
#: The history entries of envbuild's own layers (outputs.py writes them); a base's are
#: ``envbuild: …`` or the base image's own.
OURS = re.compile(r"^envbuild (venv|dist|group|top|build|patch) ([^\s:]+)(?::|$| )")


@dataclass(frozen=True)
class ImageLayer:
    digest: str
    size: int
    media_type: str
    diff_id: str
    kind: str
    name: str


@dataclass
class Traffic:
    """What this apply asked the registry for: the blobs it fetched, and those it did not."""

    fetched: list[str] = field(default_factory=list)
    bytes_fetched: int = 0
    trees_reused: int = 0
    trees_made: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "blobs_fetched": len(self.fetched),
            "bytes_fetched": self.bytes_fetched,
            "trees_reused": self.trees_reused,
            "trees_made": self.trees_made,
        }


@dataclass
class ImageSource:
    """An image in a registry, read as far as its manifest and config (both verified)."""

    ref: ImageRef  # pinned: with its manifest digest
    labels: dict[str, str]
    venv: str
    layers: list[ImageLayer]
    api: RegistryApi
    traffic: Traffic = field(default_factory=Traffic)

    @property
    def digest(self) -> str:
        assert self.ref.digest is not None
        return self.ref.digest

    @property
    def name(self) -> str:
        return f"{self.ref.registry}/{self.ref.repository}@{self.digest}"


# --- finding and reading the image ----------------------------------------------------------


DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
VENV_PATH = re.compile(r"(/[A-Za-z0-9_+-][A-Za-z0-9._+-]*)+")


class _Bad(Exception):
    """A manifest or config that is not what an image's is (turned into an IntegrityError)."""


def _obj(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _Bad(f"{what} is not an object")
    return value


def _items(value: object, what: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Bad(f"{what} is not a list")
    return value


def _descriptor(value: object, what: str) -> tuple[str, int, str]:
    """(digest, size, media type) of a descriptor, by the one descriptor rule
    (:meth:`envbuild.oci.layout.Descriptor.from_json`)."""
    try:
        d = Descriptor.from_json(value, Path(what))
    except InputFileError as exc:
        raise _Bad(exc.message) from None
    return d.digest, d.size, d.media_type


def _json(body: bytes, what: str) -> dict[str, Any]:
    try:
        return _obj(json.loads(body), what)
    except (ValueError, RecursionError):
        raise _Bad(f"{what} is not JSON") from None


def _small_blob(api: RegistryApi, store: Store, digest: str, size: int, traffic: Traffic) -> bytes:
    """The config: the store's copy, else fetched into it (size and digest checked)."""
    if size > MAX_CONFIG:
        raise _Bad(f"the image config is {size} bytes: more than envbuild reads ({MAX_CONFIG})")
    if not store.check_blob(digest):
        fetch_blob(api, store, digest, size, traffic)
    data = store.read_blob(digest)
    if len(data) != size:
        raise _Bad(f"the image config is {len(data)} bytes, its descriptor says {size}")
    return data


def fetch_blob(api: RegistryApi, store: Store, digest: str, size: int, traffic: Traffic) -> None:
    with store.blob_writer(expected=digest) as w:
        api.read_blob(digest, size, w)
    traffic.fetched.append(digest)
    traffic.bytes_fetched += size


def _manifest_body(api: RegistryApi, store: Store, digest: str) -> bytes:
    """The manifest ``digest`` names: the store's copy (kept from an earlier apply, its bytes
    checked against the digest), else the registry's (checked too)."""
    if store.check_blob(digest):
        return store.read_blob(digest)
    body = api.manifest_bytes(digest)
    if len(body) > MAX_MANIFEST:
        raise _Bad(f"the manifest is over {MAX_MANIFEST} bytes")
    store.add_bytes(body, expected=digest)
    return body


def open_image(
    ref: ImageRef, endpoint: Endpoint, store: Store, *, api: RegistryApi | None = None
) -> ImageSource:
    """Read the image ``ref`` names (a digest, or a tag resolved to one) as far as its config.
    Whatever the registry sends, the answer is an :class:`ImageSource` or an envbuild error."""
    api = api or RegistryApi(ref.registry, ref.repository, endpoint)
    digest = ref.digest or api.manifest_digest(ref.tag or "latest")
    if digest is None:
        raise UserError(f"{ref}: the registry holds no such image")
    if not DIGEST.fullmatch(digest):
        raise UserError(f"{ref}: {digest} is not a sha256 digest")
    try:
        return _read(ref.pinned(digest), api, store)
    except _Bad as exc:
        raise IntegrityError(
            f"{ref.registry}/{ref.repository}@{digest}: {exc}",
            hint="this is not an image envbuild pushed, or the registry's copy is damaged",
        ) from None


def _read(ref: ImageRef, api: RegistryApi, store: Store) -> ImageSource:
    assert ref.digest is not None
    traffic = Traffic()
    manifest = _json(_manifest_body(api, store, ref.digest), "the manifest")
    kind = manifest.get("mediaType")
    if kind not in (OCI_MANIFEST, DOCKER_MANIFEST, None) or "layers" not in manifest:
        raise UserError(
            f"{ref} is not an image manifest ({kind})",
            hint="name the image's own manifest digest (`envbuild ci` prints it)",
        )
    cdigest, csize, _ = _descriptor(manifest.get("config"), "the manifest's config")
    config = _json(_small_blob(api, store, cdigest, csize, traffic), "the image config")
    inner = _obj(config.get("config") or {}, "the config's config")
    labels = {str(k): str(v) for k, v in _obj(inner.get("Labels") or {}, "Labels").items()}
    env = dict(str(e).partition("=")[::2] for e in _items(inner.get("Env"), "Env"))
    rootfs = _obj(config.get("rootfs") or {}, "rootfs")
    diff_ids = [str(d) for d in _items(rootfs.get("diff_ids"), "diff_ids")]
    blobs = [_descriptor(b, "a layer") for b in _items(manifest.get("layers"), "layers")]
    history = [_obj(h, "a history entry") for h in _items(config.get("history"), "history")]
    history = [h for h in history if not h.get("empty_layer")]
    if len(diff_ids) != len(blobs) or len(history) != len(blobs):
        raise _Bad(
            f"the image config names {len(diff_ids)} layers and {len(history)} history entries, "
            f"its manifest {len(blobs)}"
        )
    layers = []
    for (ldigest, size, media), diff_id, hist in zip(blobs, diff_ids, history, strict=True):
        m = OURS.match(str(hist.get("created_by", "")))
        if m is None:
            continue  # the base's: the VM has its own system
        if not DIGEST.fullmatch(diff_id):
            raise _Bad(f"layer {ldigest} has no sha256 diff_id")
        layers.append(ImageLayer(ldigest, size, media, diff_id, m.group(1), m.group(2)))
    venv = env.get("VIRTUAL_ENV", "")
    if not layers or layers[0].kind != "venv" or not VENV_PATH.fullmatch(venv) or "/.." in venv:
        raise UserError(
            f"{ref}: not an image envbuild built (no `envbuild venv` layer and VIRTUAL_ENV)",
            hint="apply an image `envbuild build` or `envbuild ci` made",
        )
    src = ImageSource(ref, labels, venv, layers, api, traffic)
    log.info("image %s: %d venv layers of %d", src.name, len(layers), len(blobs))
    return src


def find_image(repo: ImageRef, inp: ApplyInput, endpoint: Endpoint, store: Store) -> ImageSource:
    """The image in ``repo`` built from ``inp``'s spec and lock (by its labels): the tag named
    after the spec first, then every other tag."""
    api = RegistryApi(repo.registry, repo.repository, endpoint)
    tags = api.tags()
    order = sorted(tags, key=lambda t: (t != inp.name, t))
    for tag in order:
        digest = api.manifest_digest(tag)
        if digest is None:
            continue
        try:
            src = open_image(repo.with_tag(tag).pinned(digest), endpoint, store, api=api)
        except (UserError, IntegrityError):
            continue  # not an envbuild image, an index, or a damaged one
        if _label_problems(src, inp) == []:
            return src
    raise UserError(
        f"{repo.registry}/{repo.repository} holds no image of {inp.spec_path} with this lock "
        f"(labels {LABEL_PREFIX}.spec-hash {inp.spec_hash[:12]}…, lock-hash "
        f"{inp.lock_sha256[:12]}…; {len(tags)} tags looked at)",
        hint="push one with `envbuild ci SPEC --push REGISTRY/REPO`, or apply SPEC without --from",
    )


def _label_problems(src: ImageSource, inp: ApplyInput) -> list[str]:
    want = {"spec-hash": inp.spec_hash, "lock-hash": inp.lock_sha256}
    return [
        f"{LABEL_PREFIX}.{k} is {src.labels.get(f'{LABEL_PREFIX}.{k}', 'absent')!r}, not {v!r}"
        for k, v in want.items()
        if src.labels.get(f"{LABEL_PREFIX}.{k}") != v
    ]


def check_image(src: ImageSource, inp: ApplyInput) -> str:
    """Refuse (exit 2) an image of another spec or lock, or one whose Python this machine
    cannot run; returns the interpreter the venv will run."""
    if problems := _label_problems(src, inp):
        raise UserError(
            f"{src.name} was not built from {inp.spec_path} and {inp.lock_path}: "
            + "; ".join(problems),
            hint="apply the spec the image was built from, or `--from REGISTRY/REPO` to find it",
        )
    return check_python(inp.spec, src)


def check_python(spec: Spec, src: ImageSource) -> str:
    """The image's venv runs ``spec.python.interpreter`` (its ``bin/python`` links to it) and
    holds ``lib/pythonX.Y``: this machine must have that interpreter, CPython X.Y."""
    interp, want = spec.python.interpreter, spec.python.version
    layout = f"Python {want} at {interp} ({src.venv}/lib/python{want})"
    hint = (
        f"install CPython {want} as {interp} on this machine, or apply the spec without "
        "--image/--from (the venv is then installed from the lock's wheels for this machine)"
    )
    if not os.path.exists(interp):
        raise UserError(
            f"{src.name} was built for {layout}; this machine has no {interp}", hint=hint
        )
    found = pyenv.probe(interp)
    have = ".".join(found.version.split(".")[:2])
    if have != want or found.implementation != "cpython":
        raise UserError(
            f"{src.name} was built for {layout}; {interp} here is {found.implementation} "
            f"{found.version}, which cannot run that venv",
            hint=hint,
        )
    return interp


def spec_of(src: ImageSource) -> Path:
    """``apply --image`` without SPEC: ``specs/<name>.toml`` of the current folder, the name
    the image's ``dev.envbuild.spec`` label gives (its hash is checked against the labels)."""
    name = src.labels.get(f"{LABEL_PREFIX}.spec", "")
    path = Path("specs") / f"{name}.toml"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) or not path.is_file():
        raise UserError(
            f"{src.name} was built from the spec {name!r}, and there is no {path} here",
            hint="run it from the repository the image was built from, or pass SPEC",
        )
    return path
