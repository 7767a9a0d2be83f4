"""Images: the OCI config and manifest, the OCI image layout, and the ``docker load`` archive.

Public API (stable; E and H build on it)::

    config = ImageConfig(env={"PATH": ...}, cmd=[...], labels={...})
    image = write_image(store, layers=[*base.layers, *mine], config=config,
                        history=[*base.history, History(created_by="envbuild: torch 2.9")])
    image.manifest_digest          # "sha256:…": the image digest a build prints
    image.blobs()                  # every blob the image needs: give them to store.set_root
    write_oci_layout(store, image, out_dir, ref_name="quickstart")      # oci-layout, index.json,
                                                                        # blobs/ (hardlinks)
    write_docker_archive(store, image, out_dir / DOCKER_ARCHIVE, repo_tags=["envbuild/q:tag"])
    layout = read_oci_layout(dir)  # the one image of a layout: manifest, config, blob paths

Every JSON document (config, manifest, index.json, Docker's manifest.json) is compact canonical
JSON (sorted keys, no whitespace), so the same inputs give the same digests. Times are inputs:
a build dates its image with :func:`created_for` (``SOURCE_DATE_EPOCH``, else the lock's cutoff);
without ``created`` only ``SOURCE_DATE_EPOCH`` dates one.

The Docker archive is an OCI layout plus Docker's ``manifest.json`` in one deterministic tar.
Docker before 23 cannot read zstd layers (``archive/tar: invalid tar header``, checked with 20.10),
so when the image has zstd layers the archive holds them uncompressed (their digest is then their
diff_id; the config, hence Docker's image ID, is the same), decompressed on the fly.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import logging
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, Field

from envbuild.build import layers as layers_mod
from envbuild.build.layers import Compression, Entry, Kind, Layer
from envbuild.errors import (
    EnvironmentFailure,
    InputFileError,
    IntegrityError,
    ManifestError,
    OutputError,
    ToolFailed,
    ToolNotFound,
)
from envbuild.fsio import atomic_writer, compact_json, write_atomic
from envbuild.store.blobs import DIGEST_RE, digest_hex
from envbuild.store.core import Store

log = logging.getLogger("envbuild.build.image")

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
DOCKER_ARCHIVE = "docker-archive.tar"
API_VERSION = "1.41"
DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"
OCI_LAYOUT = b'{"imageLayoutVersion":"1.0.0"}'


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class History(_Model):
    """One entry of the config's history; ``empty_layer`` entries name no layer."""

    created_by: str = ""
    comment: str = ""
    empty_layer: bool = False
    created: str | None = None  # kept from a base image; ours come from SOURCE_DATE_EPOCH

    def as_json(self, created: str | None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.created_by:
            out["created_by"] = self.created_by
        if self.comment:
            out["comment"] = self.comment
        if self.empty_layer:
            out["empty_layer"] = True
        if self.created or created:
            out["created"] = self.created or created
        return out


class ImageConfig(_Model):
    """What the container runs with (the ``config`` part of an OCI image config)."""

    architecture: str = "amd64"
    os: str = "linux"
    variant: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    workdir: str = "/"
    user: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    exposed_ports: list[str] = Field(default_factory=list)
    stop_signal: str | None = None

    def merged_over(self, base: ImageConfig) -> ImageConfig:
        """This config on top of a base image's: env and labels merged (ours win), the rest
        ours when set."""
        return self.model_copy(
            update={
                "env": {**base.env, **self.env},
                "labels": {**base.labels, **self.labels},
                "entrypoint": self.entrypoint if self.entrypoint is not None else base.entrypoint,
                "cmd": self.cmd if self.cmd is not None else base.cmd,
                "user": self.user or base.user,
                "exposed_ports": sorted({*base.exposed_ports, *self.exposed_ports}),
            }
        )

    @classmethod
    def from_oci(cls, doc: dict[str, Any]) -> ImageConfig:
        """The parts of an OCI/Docker image config envbuild keeps from a base image."""
        c = doc.get("config") or {}
        env = {}
        for item in c.get("Env") or []:
            key, _, value = str(item).partition("=")
            env[key] = value
        return cls(
            architecture=doc.get("architecture", "amd64"),
            os=doc.get("os", "linux"),
            variant=doc.get("variant"),
            env=env,
            entrypoint=c.get("Entrypoint"),
            cmd=c.get("Cmd"),
            workdir=c.get("WorkingDir") or "/",
            user=c.get("User") or "",
            labels=c.get("Labels") or {},
            exposed_ports=sorted(c.get("ExposedPorts") or {}),
            stop_signal=c.get("StopSignal"),
        )


class Image(_Model):
    """An image whose config and manifest blobs are in the store."""

    manifest_digest: str
    manifest_size: int
    config_digest: str
    config_size: int
    architecture: str
    os: str
    layers: list[Layer]

    def blobs(self) -> list[str]:
        return sorted({self.manifest_digest, self.config_digest, *(x.digest for x in self.layers)})

    def descriptor(self, ref_name: str | None = None) -> dict[str, Any]:
        desc: dict[str, Any] = {
            "mediaType": MANIFEST,
            "digest": self.manifest_digest,
            "size": self.manifest_size,
            "platform": {"architecture": self.architecture, "os": self.os},
        }
        if ref_name:
            desc["annotations"] = {REF_NAME: ref_name}
        return desc


def created_time() -> str | None:
    """``SOURCE_DATE_EPOCH`` as RFC 3339, or None when it is not set (then no times at all)."""
    if not os.environ.get("SOURCE_DATE_EPOCH", "").strip():
        return None
    moment = datetime.fromtimestamp(layers_mod.source_date_epoch(), tz=UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def created_for(cutoff: datetime) -> str:
    """An image's ``created``: ``SOURCE_DATE_EPOCH`` when set, else the lock's cutoff
    (``exclude_newer``: nothing in the image is newer), so the time is an input, never the
    clock's, and ``docker images`` shows a real date instead of N/A."""
    return created_time() or cutoff.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: Longest ``created_by`` a layer's history entry gets; past it the names end with "(+N more)".
HISTORY_MAX = 200


def layer_history(label: str, distributions: Sequence[str], *, limit: int = HISTORY_MAX) -> str:
    """``created_by`` for a layer: ``label`` and the distributions it holds (``name==version``,
    as given), cut at a name boundary with the count of those left out when past ``limit``
    (the first is always named)."""
    if not distributions:
        return label
    text = f"{label}: {distributions[0]}"
    for i, dist in enumerate(distributions[1:], 1):
        left = len(distributions) - i  # this one included
        longer = f"{text}, {dist}"
        if len(longer) + (len(f" (+{left - 1} more)") if left > 1 else 0) > limit:
            return f"{text} (+{left} more)"
        text = longer
    return text


def config_json(
    layers: Sequence[Layer],
    config: ImageConfig,
    history: Sequence[History],
    *,
    created: str | None = None,
) -> bytes:
    """The OCI image config document, compact and canonical. ``created`` (RFC 3339) dates the
    image and every history entry without its own; default ``SOURCE_DATE_EPOCH``, else none."""
    non_empty = sum(1 for h in history if not h.empty_layer)
    if history and non_empty != len(layers):
        raise ValueError(f"history names {non_empty} layers but the image has {len(layers)}")
    created = created or created_time()
    inner: dict[str, Any] = {
        "Env": [f"{k}={v}" for k, v in sorted(config.env.items())],
        "WorkingDir": config.workdir,
    }
    if config.entrypoint is not None:
        inner["Entrypoint"] = config.entrypoint
    if config.cmd is not None:
        inner["Cmd"] = config.cmd
    if config.user:
        inner["User"] = config.user
    if config.labels:
        inner["Labels"] = dict(sorted(config.labels.items()))
    if config.exposed_ports:
        inner["ExposedPorts"] = {p: {} for p in sorted(config.exposed_ports)}
    if config.stop_signal:
        inner["StopSignal"] = config.stop_signal
    doc: dict[str, Any] = {
        "architecture": config.architecture,
        "os": config.os,
        "config": inner,
        "rootfs": {"type": "layers", "diff_ids": [x.diff_id for x in layers]},
        "history": [h.as_json(created) for h in history],
    }
    if config.variant:
        doc["variant"] = config.variant
    if created:
        doc["created"] = created
    return compact_json(doc)


def manifest_json(config_digest: str, config_size: int, layers: Sequence[Layer]) -> bytes:
    return compact_json(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": {"mediaType": CONFIG, "digest": config_digest, "size": config_size},
            "layers": [
                {"mediaType": x.media_type, "digest": x.digest, "size": x.size} for x in layers
            ],
        }
    )


def write_image(
    store: Store,
    *,
    layers: Sequence[Layer],
    config: ImageConfig,
    history: Sequence[History] = (),
    created: str | None = None,
) -> Image:
    """Write the config and manifest blobs of an image of ``layers`` (bottom first)."""
    for layer in layers:
        if not store.has_blob(layer.digest):
            raise ManifestError(f"layer {layer.digest} is not in the store {store.root}")
    cfg = config_json(layers, config, history, created=created)
    config_digest = store.add_bytes(cfg)
    man = manifest_json(config_digest, len(cfg), layers)
    return Image(
        manifest_digest=store.add_bytes(man),
        manifest_size=len(man),
        config_digest=config_digest,
        config_size=len(cfg),
        architecture=config.architecture,
        os=config.os,
        layers=list(layers),
    )


def uncompressed_variant(store: Store, image: Image) -> Image:
    """The same image (same config, same image ID) with every layer uncompressed."""
    plain = [
        x.model_copy(
            update={
                "digest": x.diff_id,
                "size": x.uncompressed_size,
                "media_type": layers_mod.MEDIA_TYPES[Compression.NONE],
                "compression": Compression.NONE,
                "compressor": "none",
            }
        )
        for x in image.layers
    ]
    man = manifest_json(image.config_digest, image.config_size, plain)
    return image.model_copy(
        update={"manifest_digest": store.add_bytes(man), "manifest_size": len(man), "layers": plain}
    )


@dataclass(frozen=True)
class Referrer:
    """An OCI 1.1 artifact about the image (its SBOM): the descriptor ``index.json`` lists after
    the image (with its ``artifactType``, so readers that want the image skip it) and the store
    blobs it is made of."""

    descriptor: dict[str, Any]
    blobs: tuple[str, ...]


def index_json(image: Image, ref_name: str | None, referrers: Sequence[Referrer] = ()) -> bytes:
    manifests = [image.descriptor(ref_name), *(r.descriptor for r in referrers)]
    return compact_json({"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests})


def write_oci_layout(
    store: Store,
    image: Image,
    out_dir: Path,
    *,
    ref_name: str | None,
    keep: Callable[[Path], bool] | None = None,
    referrers: Sequence[Referrer] = (),
) -> Path:
    """Write ``image`` as an OCI image layout in ``out_dir`` (blobs hardlinked from the store,
    copied across file systems). Every blob is checked first (:meth:`Store.verified_path`): a
    corrupt one stops the write. A blob already in ``out_dir`` stays when it is the store's own
    file (a hard link) or ``keep(path)`` says it is unchanged since it was written; any other is
    replaced. Blobs of an earlier image in ``blobs/`` are removed; other files in ``out_dir``
    are left alone. ``referrers`` (the SBOM) are store blobs placed and listed the same way.
    ``index.json`` is written last."""
    out_dir = Path(out_dir)
    blob_dir = out_dir / "blobs" / "sha256"
    try:
        blob_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create {blob_dir}: {exc.strerror}") from exc
    wanted = set(image.blobs()) | {d for r in referrers for d in r.blobs}
    for path in blob_dir.iterdir():
        if f"sha256:{path.name}" not in wanted:
            path.unlink()
    for digest in sorted(wanted):
        src = store.verified_path(digest, what=_blob_role(image, digest))
        dest = blob_dir / digest_hex(digest)
        if _place_blob(src, dest, digest, keep):
            store.linked(digest)
    write_atomic(out_dir / "oci-layout", OCI_LAYOUT)
    write_atomic(out_dir / "index.json", index_json(image, ref_name, referrers))
    return out_dir


def _blob_role(image: Image, digest: str) -> str:
    if digest == image.manifest_digest:
        return "the image manifest"
    if digest == image.config_digest:
        return "the image config"
    if digest in image.blobs():
        return "a layer"
    return "the SBOM"


def _place_blob(src: Path, dest: Path, digest: str, keep: Callable[[Path], bool] | None) -> bool:
    """Put the (checked) store blob ``src`` at ``dest``; True when it was hard-linked now."""
    try:
        st = dest.lstat()
    except FileNotFoundError:
        st = None
    if st is not None:
        if os.path.samestat(st, src.stat()) or (keep is not None and keep(dest)):
            return False
        dest.unlink()
    try:
        os.link(src, dest)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            raise OutputError(f"cannot write {dest}: {exc.strerror}") from exc
    h = hashlib.sha256()  # the copy reads every byte: hash them on the way
    with atomic_writer(dest, 0o444) as out, src.open("rb") as f:
        while chunk := f.read(layers_mod.CHUNK):
            h.update(chunk)
            out.write(chunk)
        if f"sha256:{h.hexdigest()}" != digest:
            raise IntegrityError(
                f"store blob {digest} changed while it was copied to {dest}",
                hint="run `envbuild store verify --repair`, then build again",
            )
    return False


class _Closing:
    """A readable stream whose close also ends the context that opened it."""

    def __init__(self, f: IO[bytes], stack: contextlib.ExitStack) -> None:
        self._f, self._stack = f, stack

    def readinto(self, buf: memoryview) -> int:
        return self._f.readinto(buf)  # type: ignore[attr-defined, no-any-return]

    def read(self, n: int = -1) -> bytes:
        return self._f.read(n)

    def __enter__(self) -> _Closing:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()


def _bytes_opener(data: bytes) -> layers_mod.Opener:
    return lambda: io.BytesIO(data)


class _Hashing:
    """A blob's stream that hashes what is read; at its end (``__exit__``) the digest must be
    ``digest``, else :class:`IntegrityError` names the store blob ``origin`` and the fix."""

    def __init__(self, f: Any, digest: str, origin: str, store: Store) -> None:
        self._f, self._digest, self._origin, self._store = f, digest, origin, store
        self._hash = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data: bytes = self._f.read(n)
        self._hash.update(data)
        return data

    def __enter__(self) -> _Hashing:
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        try:
            self._f.__exit__(kind, exc, tb)
        except ToolFailed as failed:  # a decompressor that cannot read the blob
            raise self._store.corrupt_error(
                self._origin, f"{failed.tool}: {failed.message}"
            ) from None
        if kind is None and f"sha256:{self._hash.hexdigest()}" != self._digest:
            raise self._store.corrupt_error(self._origin)


def _hashing_opener(
    store: Store, origin: str, digest: str, media_type: str | None = None
) -> layers_mod.Opener:
    """The bytes of store blob ``origin`` (uncompressed when ``media_type`` is given), checked
    against ``digest`` as the archive reads them."""
    path = store.blob_path(origin)

    def opener() -> IO[bytes]:
        if media_type is None:
            return _Hashing(path.open("rb"), digest, origin, store)  # type: ignore[return-value]
        stack = contextlib.ExitStack()
        f = stack.enter_context(layers_mod.open_uncompressed(path, media_type))
        return _Hashing(_Closing(f, stack), digest, origin, store)  # type: ignore[return-value]

    return opener


def write_docker_archive(
    store: Store,
    image: Image,
    out_path: Path,
    *,
    repo_tags: Sequence[str],
    ref_name: str | None = None,
    uncompressed: bool | None = None,
) -> Image:
    """Write a tar that ``docker load`` accepts: an OCI layout plus Docker's ``manifest.json``.

    ``uncompressed`` (default: when any layer is zstd) stores the layers uncompressed so that
    Docker before 23 can load them. Returns the image as the archive holds it.
    """
    if uncompressed is None:
        uncompressed = any(x.compression is Compression.ZSTD for x in image.layers)
    inside = uncompressed_variant(store, image) if uncompressed else image
    entries: list[Entry] = []

    def add_bytes(name: str, data: bytes) -> None:
        entries.append(Entry(name, Kind.FILE, 0o644, size=len(data), source=_bytes_opener(data)))

    # a corrupt blob is refused before it is read (a damaged zstd stream would otherwise read
    # as a decompressor failure); what is read is hashed on the way all the same
    for digest in (inside.manifest_digest, inside.config_digest):
        path = store.verified_path(digest, what=_blob_role(inside, digest))
        entries.append(
            Entry(
                f"blobs/sha256/{digest_hex(digest)}",
                Kind.FILE,
                0o644,
                size=path.stat().st_size,
                source=_hashing_opener(store, digest, digest),
            )
        )
    for orig, layer in zip(image.layers, inside.layers, strict=True):
        name = f"blobs/sha256/{digest_hex(layer.digest)}"
        if any(e.path == name for e in entries):
            continue
        store.verified_path(orig.digest, what="a layer")
        plain = layer.digest != orig.digest
        source = _hashing_opener(
            store, orig.digest, layer.digest, orig.media_type if plain else None
        )
        entries.append(Entry(name, Kind.FILE, 0o644, size=layer.size, source=source))
    docker_manifest = [
        {
            "Config": f"blobs/sha256/{digest_hex(inside.config_digest)}",
            "RepoTags": list(repo_tags),
            "Layers": [f"blobs/sha256/{digest_hex(x.digest)}" for x in inside.layers],
        }
    ]
    add_bytes("manifest.json", compact_json(docker_manifest))
    add_bytes("oci-layout", OCI_LAYOUT)
    add_bytes("index.json", index_json(inside, ref_name))
    arranged = layers_mod.arrange(entries)
    with atomic_writer(Path(out_path), 0o644) as f:

        def out(data: bytes | bytearray | memoryview) -> None:
            f.write(data)

        sink = layers_mod.Sink(out)
        layers_mod.write_tar(arranged, sink, layers_mod.source_date_epoch())
    return inside


@dataclass(frozen=True)
class LayoutImage:
    """The image an OCI layout holds (after choosing one manifest)."""

    root: Path
    manifest_digest: str
    manifest: dict[str, Any]
    config_digest: str
    config: dict[str, Any]

    def blob_path(self, digest: str) -> Path:
        return self.root / "blobs" / "sha256" / digest_hex(digest)

    def layer_descriptors(self) -> list[dict[str, Any]]:
        return list(self.manifest.get("layers") or [])


def read_oci_layout(
    root: Path,
    *,
    ref_name: str | None = None,
    digest: str | None = None,
    architecture: str = "amd64",
) -> LayoutImage:
    """Open the OCI layout at ``root`` and pick one image manifest: by ``digest``, by
    ``ref_name``, or the only one (an index is followed to its ``linux/architecture`` entry)."""
    root = Path(root)
    try:
        index = json.loads((root / "index.json").read_bytes())
        json.loads((root / "oci-layout").read_bytes())
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{root} is not an OCI image layout: {exc}") from exc
    candidates = list(index.get("manifests") or [])
    if not digest:  # an OCI 1.1 referrer (the SBOM) is listed with its artifactType: not an image
        candidates = [m for m in candidates if not (isinstance(m, dict) and "artifactType" in m)]
    if digest:
        candidates = [m for m in candidates if m.get("digest") == digest] or [
            {"digest": digest, "mediaType": MANIFEST}
        ]
    elif ref_name:
        candidates = [
            m for m in candidates if (m.get("annotations") or {}).get(REF_NAME) == ref_name
        ]
    if len(candidates) != 1:
        raise ManifestError(
            f"{root}: expected one image in index.json, found {len(candidates)}",
            hint="name the image by digest or by its org.opencontainers.image.ref.name",
        )
    desc = candidates[0]
    for _ in range(4):
        d = str(desc.get("digest", ""))
        if not DIGEST_RE.match(d):
            raise ManifestError(f"{root}: bad digest {d!r} in index.json")
        data = _read_verified(root, d)
        doc = json.loads(data)
        if doc.get("manifests") is not None:  # an index: choose the platform
            wanted = [
                m
                for m in doc["manifests"]
                if (m.get("platform") or {}).get("os") == "linux"
                and (m.get("platform") or {}).get("architecture") == architecture
            ]
            if not wanted:
                raise ManifestError(f"{root}: no linux/{architecture} image in index {d}")
            desc = wanted[0]
            continue
        config_digest = str((doc.get("config") or {}).get("digest", ""))
        config = json.loads(_read_verified(root, config_digest))
        return LayoutImage(root, d, doc, config_digest, config)
    raise ManifestError(f"{root}: indexes nested too deep")


def _read_verified(root: Path, digest: str) -> bytes:
    if not DIGEST_RE.match(digest):
        raise ManifestError(f"{root}: bad digest {digest!r}")
    path = root / "blobs" / "sha256" / digest_hex(digest)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ManifestError(f"{root}: blob {digest} is missing") from exc
    if f"sha256:{hashlib.sha256(data).hexdigest()}" != digest:
        raise IntegrityError(f"{path} does not match its digest")
    return data


def iter_layer_blobs(layout: LayoutImage) -> Iterator[tuple[dict[str, Any], Path]]:
    for desc in layout.layer_descriptors():
        yield desc, layout.blob_path(str(desc["digest"]))


@dataclass(frozen=True)
class Loaded:
    """What ``docker load`` made of an archive."""

    archive: str
    image_id: str
    tags: list[str]
    engine_version: str | None = None  # the engine's `docker version`, when it says
    reads_zstd: bool | None = None  # whether that engine can pull images with zstd layers

    def engine_note(self) -> str | None:
        """What to say when the engine cannot pull zstd images (``load`` itself works with any
        engine: the archive's layers are uncompressed)."""
        if self.reads_zstd is not False:
            return None
        return (
            f"this engine (Docker {self.engine_version}) cannot pull images with zstd layers "
            "('archive/tar: invalid tar header'): this load works (its layers are "
            "uncompressed), but for `docker pull` here build with --compression gzip"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "archive": self.archive,
            "image_id": self.image_id,
            "tags": self.tags,
            "engine_version": self.engine_version,
            "reads_zstd": self.reads_zstd,
        }


def find_archive(path: Path) -> Path:
    """The docker archive ``path`` names: the file itself, or ``DIR/docker-archive.tar`` of a
    build's output folder whose build finished."""
    path = Path(path)
    if path.is_file():
        return path
    if (path / "oci").is_dir() and not (path / "build-manifest.json").is_file():
        # a build output folder whose build did not finish: what it holds is not one image
        raise InputFileError(
            path,
            "holds an unfinished build (no build-manifest.json: a build into it was interrupted)",
            hint="build into it again (`envbuild build --output` this folder)",
        )
    candidate = path / DOCKER_ARCHIVE
    if candidate.is_file():
        return candidate
    if path.is_dir():
        raise InputFileError(
            path,
            f"holds no {DOCKER_ARCHIVE}",
            hint="point at the output folder of `envbuild build` (images/<spec>/) or at the tar",
        )
    raise InputFileError(path, "does not exist")


def _probe(url: str) -> None:
    """Fail early and cleanly when a unix socket does not answer (the docker SDK leaks the
    socket of a failed connection)."""
    if not url.startswith("unix://"):
        return
    path = url[len("unix://") :]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(10)
            probe.connect(path)
    except OSError as exc:
        raise EnvironmentFailure(
            f"no Docker engine answers at {url}: {exc.strerror or exc}",
            hint="start dockerd, or set DOCKER_HOST to an engine's socket",
        ) from exc


def load_into_engine(path: Path, *, base_url: str | None = None) -> Loaded:
    """``docker load`` the archive at ``path`` (a tar, or a build's output folder) through the
    docker SDK; the engine is ``base_url``, else ``$DOCKER_HOST``, else the default socket."""
    archive = find_archive(path)
    try:
        import docker  # type: ignore[import-untyped]
        import docker.errors  # type: ignore[import-untyped]
        import requests
    except ImportError as exc:  # pragma: no cover - docker is a dependency
        raise ToolNotFound("the docker SDK", hint="pip install docker") from exc
    where = base_url or os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
    _probe(where)
    client = None
    try:
        # a fixed API version: "auto" asks the engine inside the constructor, and a failed
        # constructor leaks its socket. 1.41 (Docker 20.10) is served by every later engine.
        # loading gigabytes into a vfs engine takes minutes: the SDK's 60 s default is too short
        if base_url:
            client = docker.DockerClient(base_url=base_url, version=API_VERSION, timeout=1800)
        else:
            client = docker.from_env(version=API_VERSION, timeout=1800)
        client.ping()
        engine_version = str(client.version().get("Version") or "") or None
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        if client is not None:
            client.close()
        raise EnvironmentFailure(
            f"no Docker engine answers at {where}: {exc}",
            hint="start dockerd, or set DOCKER_HOST to an engine's socket",
        ) from exc
    try:
        with archive.open("rb") as f:
            images = client.images.load(f)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise EnvironmentFailure(f"the engine at {where} refused {archive}: {exc}") from exc
    finally:
        client.close()
    if not images:
        raise EnvironmentFailure(f"the engine at {where} loaded no image from {archive}")
    image = images[0]
    from envbuild.registry.compat import reads_zstd

    zstd = reads_zstd("docker", engine_version) if engine_version else None
    return Loaded(str(archive), str(image.id), sorted(image.tags), engine_version, zstd)
