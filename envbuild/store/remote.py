"""A remote build cache in an OCI registry, as a binary cache is for Nix.

Each derivation of the store (a layer, a source-built wheel, the base rootfs) is kept in the
cache repository as a small OCI artifact tagged ``drv-<key>``: an image manifest whose
``artifactType`` and config media type are envbuild's own
(``application/vnd.envbuild.derivation.v1+json``), whose config blob is the derivation record
(kind, inputs, outputs, meta) and whose layers are the output blobs, each annotated with its
output name. Blobs shared by several derivations are stored once per registry.

:class:`RemoteCache` answers two questions: ``fetch(store, key)`` (is it there? then pull it,
verify every digest, check the record really is the one for ``key``, and import it into the
store) and ``publish(store, drv)``. :class:`CachedStore` is a :class:`~envbuild.store.core.Store`
that asks the cache before running a producer and publishes what it built, so every stage that
takes a store gets the cache without knowing about it.

Trust: whoever may push to the cache repository can change what it serves for a key. The record
is checked against its key and every blob against its digest, but nothing is signed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envbuild.engine import ContainerEngine
from envbuild.errors import IntegrityError, RegistryUnreachable
from envbuild.oci.blobs import open_blob
from envbuild.oci.layout import LayoutImage, open_layout
from envbuild.registry import core as registry
from envbuild.registry.api import Endpoint, RegistryApi
from envbuild.registry.core import PushResult
from envbuild.registry.layout import add_blob, write_artifact
from envbuild.registry.ref import ImageRef
from envbuild.registry.transport import Transport
from envbuild.store.core import Derivation, Output, Realized, Store, derivation_key

log = logging.getLogger(__name__)

DERIVATION_TYPE = "application/vnd.envbuild.derivation.v1+json"
OUTPUT_TYPE = "application/vnd.envbuild.output.v1"
OUTPUT_NAME = "dev.envbuild.output"
KEY_ANNOTATION = "dev.envbuild.key"
KIND_ANNOTATION = "dev.envbuild.kind"


def cache_tag(key: str) -> str:
    """The tag a derivation is kept under in the cache repository."""
    return f"drv-{key}"


@dataclass
class CacheStats:
    """What one run took from and gave to the cache (derivation keys, bytes)."""

    hits: list[str] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)
    published: list[str] = field(default_factory=list)
    bytes_fetched: int = 0
    bytes_uploaded: int = 0
    bytes_not_uploaded: int = 0
    #: Why the cache was done without (it did not answer), or None.
    unreachable: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "published": self.published,
            "bytes_fetched": self.bytes_fetched,
            "bytes_uploaded": self.bytes_uploaded,
            "bytes_not_uploaded": self.bytes_not_uploaded,
            "unreachable": self.unreachable,
        }


class RemoteCache:
    """Derivation outputs in the repository ``repo`` (``REGISTRY/REPO``, no tag)."""

    def __init__(
        self,
        repo: ImageRef,
        *,
        endpoint: Endpoint | None = None,
        transport: Transport | None = None,
        engine: ContainerEngine | None = None,
        push: bool = True,
    ) -> None:
        self.repo = repo
        self.endpoint = endpoint or Endpoint()
        self._transport = transport
        self._engine = engine  # for a transport chosen when first needed
        self.push = push
        self.stats = CacheStats()
        self._api: RegistryApi | None = None
        # the base's thread and the layer workers ask at once: one warning, no lost counts
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"RemoteCache({self.repo.name!r})"

    @property
    def api(self) -> RegistryApi:
        if self._api is None:
            self._api = RegistryApi(self.repo.registry, self.repo.repository, self.endpoint)
        return self._api

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            self._transport = registry.get_transport(engine=self._engine)
        return self._transport

    def ref(self, key: str) -> ImageRef:
        return self.repo.with_tag(cache_tag(key))

    def has(self, key: str) -> bool:
        """Whether the cache holds ``key``. A cache that does not answer at all is, for the
        rest of this run, an empty one (a warning, once): the build goes on locally, as Nix
        does without its substituter. A refusal (credentials) or a TLS mismatch still fails:
        those are a configuration to fix, not an outage to wait out."""
        if self.stats.unreachable is not None:
            return False
        try:
            return self.api.manifest_digest(cache_tag(key)) is not None
        except RegistryUnreachable as exc:
            with self._lock:
                first = self.stats.unreachable is None
                if first:
                    self.stats.unreachable = exc.message
            if first:
                log.warning("%s; building without the cache %s", exc.message, self.repo.name)
            return False

    # -- fetch -------------------------------------------------------------------------------
    def fetch(self, store: Store, key: str) -> Derivation | None:
        """Import derivation ``key`` from the cache into ``store``; None when the cache lacks it.
        Raises :class:`IntegrityError` when what the cache holds is not what ``key`` names."""
        ref = self.ref(key)
        if not self.has(key):
            self.stats.misses.append(key)
            log.debug("cache miss: %s", key[:12])
            return None
        with store.temp_dir("cache-") as tmp:
            result = registry.pull(
                ref, tmp / "layout", endpoint=self.endpoint, transport=self.transport, api=self.api
            )
            image = open_layout(tmp / "layout", ref.tag)
            drv = self._check(image, key, ref)
            for desc in image.layers:
                with open_blob(image.blob_path(desc), desc, layout=image.root) as f:
                    store.add_stream(f, expected=desc.digest)
            recorded = store.record(drv.kind, drv.inputs, drv.outputs, drv.meta, drv.references)
        with self._lock:
            self.stats.hits.append(key)
            self.stats.bytes_fetched += result.size
        log.info("cache hit: %s %s from %s", drv.kind, key[:12], self.repo.name)
        return recorded

    def _check(self, image: LayoutImage, key: str, ref: ImageRef) -> Derivation:
        def bad(reason: str) -> IntegrityError:
            return IntegrityError(
                f"cache entry {ref} is not the derivation {key[:12]}: {reason}",
                hint="the cache holds a wrong or foreign entry: delete that tag from the cache",
            )

        if image.artifact_type != DERIVATION_TYPE or image.config.media_type != DERIVATION_TYPE:
            raise bad(f"it is a {image.artifact_type}, not an envbuild derivation")
        try:
            drv = Derivation.model_validate_json(image.blob_path(image.config).read_bytes())
        except (ValidationError, ValueError) as exc:
            raise bad(f"its record does not parse ({exc.__class__.__name__})") from exc
        if drv.key != key or derivation_key(drv.kind, drv.inputs) != key:
            raise bad("its record's inputs hash to another key")
        named = {d.annotations.get(OUTPUT_NAME, ""): d.digest for d in image.layers}
        if named != drv.outputs:
            raise bad("its blobs are not the outputs its record names")
        return drv

    # -- publish -----------------------------------------------------------------------------
    def publish(self, store: Store, drv: Derivation) -> PushResult | None:
        """Push ``drv`` and its output blobs, unless the cache already has the key (the first
        writer wins) or the cache is read-only."""
        if not self.push:
            return None
        if self.has(drv.key):
            log.debug("cache already has %s", drv.key[:12])
            return None
        if self.stats.unreachable is not None:
            return None
        ref = self.ref(drv.key)
        with store.temp_dir("cache-") as tmp:
            root = tmp / "layout"
            layers = [
                add_blob(
                    root,
                    # a corrupt blob is never published
                    store.verified_path(digest, what=f"{name} of {drv.kind} {drv.key[:12]}"),
                    OUTPUT_TYPE,
                    **{OUTPUT_NAME: name},
                )
                for name, digest in sorted(drv.outputs.items())
            ]
            write_artifact(
                root,
                artifact_type=DERIVATION_TYPE,
                config=drv.record_json(),
                layers=layers,
                annotations={KEY_ANNOTATION: drv.key, KIND_ANNOTATION: drv.kind},
                tag=ref.tag or "",
            )
            image = open_layout(root)
            result = registry.push_image(
                image, ref, endpoint=self.endpoint, transport=self.transport, api=self.api
            )
        with self._lock:
            self.stats.published.append(drv.key)
            self.stats.bytes_uploaded += result.bytes_uploaded
            self.stats.bytes_not_uploaded += result.bytes_skipped
        log.info(
            "cache: published %s %s (%d blobs uploaded, %d already there)",
            drv.kind, drv.key[:12], len(result.uploaded), len(result.skipped),
        )  # fmt: skip
        return result


class CachedStore(Store):
    """A store that substitutes from a :class:`RemoteCache` before building and publishes what
    it builds. Everything else is the plain store's."""

    def __init__(self, root: Path | str, remote: RemoteCache) -> None:
        super().__init__(root)
        self.remote = remote

    @classmethod
    def over(cls, store: Store, remote: RemoteCache | None) -> Store:
        """``store`` with ``remote`` in front of it (``store`` itself when no cache is given)."""
        return store if remote is None else cls(store.root, remote)

    def available(self, key: str) -> bool:
        return super().available(key) or self.remote.has(key)

    def realize(
        self, kind: str, inputs: Mapping[str, Any], produce: Callable[[], Output]
    ) -> Realized:
        key = derivation_key(kind, inputs)
        with self.session():
            if (drv := self.lookup(key)) is not None:
                self._publish(drv)
                return Realized(drv, reused=True)
            with self.guard(key):
                if (drv := self.lookup(key)) is not None:
                    return Realized(drv, reused=True)
                if (drv := self.remote.fetch(self, key)) is not None:
                    return Realized(drv, reused=True)
                log.debug("%s %s: building (not in the cache)", kind, key[:12])
                out = produce()
                drv = self.record(kind, inputs, out.outputs, out.meta, out.references)
                self.remote.publish(self, drv)
                return Realized(drv, reused=False)

    def _publish(self, drv: Derivation) -> None:
        """A derivation built before the cache was configured goes up once too."""
        if self.remote.push and drv.key not in self.remote.stats.published:
            self.remote.publish(self, drv)
