"""The content-addressed store: blobs named by their sha256, derivations named by their inputs.

Use::

    store = Store(root)        # or default_store(): $ENVBUILD_STORE, else
                               # $XDG_CACHE_HOME/envbuild/store, else ~/.cache/envbuild/store
    key = derivation_key("layer", {"dists": [...], "compression": "zstd"})  # 64 hex digits

    with store.session():      # hold for a whole build: gc waits until every session ends
        got = store.realize("layer", inputs, produce)  # produce() -> Output(outputs=, meta=,
                                                     #                    references=[key, ...])
        got.drv.outputs["layer"]       # "sha256:<hex>" of a blob; got.reused: was it cached
        with store.blob_writer() as w:  # stream bytes in; named by their digest on close
            w.write(b"...")
        w.digest                       # "sha256:<hex>"
        store.add_bytes(b"..."), store.add_file(path, expected="sha256:...")
        store.blob_path(digest)        # blobs/sha256/<hex> (read-only: never write to it)
        store.check_blob(digest)       # do its bytes still hash to its name? (see stamps)
        store.verified_path(digest)    # its path, or IntegrityError naming the fix
        store.set_root(output_root_name(out), blobs=[...], derivations=[key, ...],
                       output=out, image=digest, files={...})
    store.find("3fa2")                 # derivation keys (or, "sha256:3fa2", blobs) by prefix
    envbuild.store.gc.collect(store, dry_run=True) -> GcResult
    envbuild.store.verify.verify(store, repair=False, workers=N) -> VerifyResult

This module holds the records: a :class:`Derivation` (``drv/<key>.json``: kind, inputs, outputs
by name, the derivations it references, meta) under the key its inputs hash to, and a
:class:`Root` (``roots/<name>.json``: what ``gc`` keeps). The folder, the blobs and the lock
protocol are :mod:`envbuild.store.blobs`'s; which blobs need a re-hash is
:mod:`envbuild.store.stamps`'s; :mod:`envbuild.store.gc` removes what no root keeps and
:mod:`envbuild.store.verify` hashes everything; a remote cache in front is
:mod:`envbuild.store.remote`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envbuild.errors import StoreError, UsageError
from envbuild.fsio import canonical_json, compact_json
from envbuild.store.blobs import STORE_FORMAT, BlobStore, FileGuard, default_root, digest_hex
from envbuild.store.blobs import output_root_name as output_root_name  # noqa: PLC0414 (re-exported)

log = logging.getLogger(__name__)

KEY_RE = re.compile(r"^[0-9a-f]{64}$")
ROOT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@+-]{0,199}$")
_HEX_PREFIX_RE = re.compile(r"^[0-9a-f]{1,64}$")


def default_store() -> Store:
    """The store at :func:`~envbuild.store.blobs.default_root`."""
    return Store(default_root())


def derivation_key(kind: str, inputs: Mapping[str, Any]) -> str:
    """sha256 (64 hex digits) of the compact canonical JSON of ``{kind, inputs, store format}``.

    ``inputs`` must be JSON data (str, int, bool, None, lists, str-keyed dicts): the parent's key,
    locked files with their sha256, flags, file digests. Never put a host path, a time or a secret
    into ``inputs``: the key must be the same on every machine.
    """
    try:
        payload = compact_json({"kind": kind, "inputs": inputs, "store_format": STORE_FORMAT})
    except (TypeError, ValueError) as exc:
        raise TypeError(f"derivation inputs of {kind!r} are not JSON data: {exc}") from None
    return hashlib.sha256(payload).hexdigest()


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Derivation(_Model):
    """The record of one built step: what went in (``inputs``), what came out (``outputs``: name ->
    blob digest), the other derivations it keeps alive (``references``: their keys) and anything
    else the step wants to remember (``meta``, JSON).

    What a record keeps through ``gc`` is what it says: its outputs and its references, nothing
    found by reading a blob. ``references`` is not part of the key (the key is the inputs)."""

    store_format: int = STORE_FORMAT
    key: str
    kind: str
    inputs: dict[str, Any]
    outputs: dict[str, str] = Field(default_factory=dict)
    references: list[str] = Field(default_factory=list)
    meta: dict[str, Any] = Field(default_factory=dict)

    def record_json(self) -> bytes:
        """The record as it is written (``drv/<key>.json``, a remote cache's config blob):
        canonical JSON, ``references`` left out when there are none, so that such a record is
        the same bytes that stores without references have always held."""
        data = self.model_dump(exclude=set() if self.references else {"references"})
        return canonical_json(data).encode()


class Root(_Model):
    """What one output folder (or a user) keeps alive through ``gc``: every blob it needs, each
    named (``blobs``: an image's manifest, config and every layer; ``gc`` reads no blob to find
    more), and the derivations it keeps (``derivations``: keys; with their outputs and
    references).

    A root of an output folder (``output``: its absolute path; ``image``: the digest it holds)
    lives as long as the folder holds that image, the way a Nix out-link does: ``gc`` drops it
    once the folder is removed or holds another image. ``files`` records the stat of what the
    build wrote there (see :func:`envbuild.store.stamps.file_stamp`), so the next build can
    tell the folder is unchanged without reading it."""

    name: str
    blobs: list[str] = Field(default_factory=list)
    derivations: list[str] = Field(default_factory=list)
    output: str | None = None
    image: str | None = None
    files: dict[str, str] = Field(default_factory=dict)
    #: Install trees (:mod:`envbuild.store.trees`) a generation links.
    trees: list[str] = Field(default_factory=list)
    #: The generation folder this root belongs to: it lives while that folder is a complete
    #: generation (holds ``generation.json``), as an output root lives while its folder holds
    #: its image.
    generation: str | None = None

    def record_json(self) -> bytes:
        """The root as it is written: canonical JSON, the generation fields left out when
        unset, so roots of images are the bytes they have always been."""
        data = self.model_dump()
        if not self.trees:
            data.pop("trees")
        if self.generation is None:
            data.pop("generation")
        return canonical_json(data).encode()


@dataclass(frozen=True)
class Output:
    """What a producer returns to :meth:`Store.realize`: blob digests by name, metadata, and the
    keys of the derivations its outputs need kept (see :attr:`Derivation.references`)."""

    outputs: Mapping[str, str]
    meta: Mapping[str, Any] = field(default_factory=dict)
    references: Sequence[str] = ()


@dataclass(frozen=True)
class Realized:
    """What :meth:`Store.realize` returns: the derivation, and whether it was there already."""

    drv: Derivation
    reused: bool


class Store(BlobStore):
    """A content-addressed store rooted at ``root`` (created on first use): the blobs of
    :class:`~envbuild.store.blobs.BlobStore` and the derivation and root records over them."""

    def guard(self, key: str) -> contextlib.AbstractContextManager[object]:
        """An exclusive lock on one derivation key (what :meth:`realize` holds while building)."""
        self._ensure()
        if not KEY_RE.match(key):
            raise ValueError(f"not a derivation key: {key!r}")
        return FileGuard(
            self.guards / f"{key}.lock", shared=False, what=f"another build of {key[:12]}"
        )

    # -- derivations -------------------------------------------------------------------------

    def lookup(self, key: str) -> Derivation | None:
        """The recorded derivation ``key`` if it and every output blob are present, else None."""
        self._ensure()
        path = self.drvs / f"{key}.json"
        try:
            drv = Derivation.model_validate_json(path.read_bytes())
        except FileNotFoundError:
            return None
        except (ValidationError, ValueError):
            log.warning("ignoring unreadable derivation record %s", path)
            return None
        missing = [d for d in drv.outputs.values() if not self.has_blob(d)]
        if missing:
            log.warning(
                "derivation %s lost output %s; it will be built again", key[:12], missing[0]
            )
            return None
        for name, digest in drv.outputs.items():
            if not self.check_blob(digest):
                log.warning(
                    "output %s (%s) of %s %s is corrupt; removing it, it will be built again",
                    name, digest, drv.kind, key[:12],
                )  # fmt: skip
                self.drop_blob(digest)
                return None
        return drv

    def available(self, key: str) -> bool:
        """Whether derivation ``key`` can be had without running its producer: it is here (a
        store with a remote cache in front also asks the cache)."""
        return self.lookup(key) is not None

    def record(
        self,
        kind: str,
        inputs: Mapping[str, Any],
        outputs: Mapping[str, str],
        meta: Mapping[str, Any] | None = None,
        references: Iterable[str] = (),
    ) -> Derivation:
        """Record that derivation ``(kind, inputs)`` produced ``outputs`` (blobs already stored)
        and keeps the derivations ``references`` (keys) alive as long as it lives."""
        key = derivation_key(kind, inputs)
        for name, digest in outputs.items():
            if not self.has_blob(digest):
                raise StoreError(f"output {name!r} of {kind} {key[:12]}: blob {digest} not stored")
        refs = sorted(set(references) - {key})
        for ref in refs:
            if not KEY_RE.match(ref):
                raise ValueError(f"{kind} {key[:12]} references {ref!r}: not a derivation key")
        drv = Derivation(
            key=key,
            kind=kind,
            inputs=json.loads(compact_json(dict(inputs))),
            outputs=dict(outputs),
            references=refs,
            meta=json.loads(compact_json(dict(meta or {}))),
        )
        with self.session():
            self._write_file(self.drvs / f"{key}.json", drv.record_json())
        return drv

    def realize(
        self, kind: str, inputs: Mapping[str, Any], produce: Callable[[], Output]
    ) -> Realized:
        """Return the derivation ``(kind, inputs)``, running ``produce`` only if it is not yet
        in the store. Two processes asking for the same key at once: one builds, the other waits
        on the key's lock and then reuses the result."""
        key = derivation_key(kind, inputs)
        with self.session():
            if (drv := self.lookup(key)) is not None:
                log.debug("%s %s: reused", kind, key[:12])
                return Realized(drv, reused=True)
            with self.guard(key):
                if (drv := self.lookup(key)) is not None:
                    log.debug("%s %s: built by another process", kind, key[:12])
                    return Realized(drv, reused=True)
                log.debug("%s %s: building", kind, key[:12])
                out = produce()
                drv = self.record(kind, inputs, out.outputs, out.meta, out.references)
                return Realized(drv, reused=False)

    def derivations(self) -> list[str]:
        """The keys of every derivation record here, sorted."""
        self._ensure()
        return sorted(p.name[: -len(".json")] for p in self.drvs.glob("*.json"))

    def find(self, prefix: str) -> list[str]:
        """What ``prefix`` can name, sorted: the derivation keys that start with it (hex
        digits), or, for ``sha256:<hex digits>``, the digests of the blobs that start with it.
        Anything else (an empty prefix, a name) matches nothing. More than one is for the
        caller to call ambiguous."""
        self._ensure()
        blob = prefix.startswith("sha256:")
        hex_part = prefix.removeprefix("sha256:")
        if not _HEX_PREFIX_RE.match(hex_part):
            return []
        if blob:
            return sorted(f"sha256:{p.name}" for p in self.blobs.glob(f"{hex_part}*"))
        return sorted(p.name[: -len(".json")] for p in self.drvs.glob(f"{hex_part}*.json"))

    # -- roots -------------------------------------------------------------------------------

    def set_root(
        self,
        name: str,
        *,
        blobs: Iterable[str] = (),
        derivations: Iterable[str] = (),
        output: Path | None = None,
        image: str | None = None,
        files: Mapping[str, str] | None = None,
        trees: Iterable[str] = (),
        generation: Path | None = None,
    ) -> Root:
        """Make ``name`` keep ``blobs`` and ``derivations`` (with their outputs and references)
        alive; replaces an earlier root of that name. Name every blob the root needs: for an
        image its manifest, its config and each layer (``gc`` does not read a manifest to find
        them). With ``output`` (and the ``image`` digest it holds) the root lives only as long
        as that folder holds that image (see :class:`Root`)."""
        if not ROOT_NAME_RE.match(name):
            raise UsageError(
                f"{name!r} is not a valid root name", hint="use letters, digits and . _ @ + -"
            )
        blob_list = sorted(set(blobs))
        for digest in blob_list:
            digest_hex(digest)
        drv_list = sorted(set(derivations))
        for key in drv_list:
            if not KEY_RE.match(key):
                raise ValueError(f"not a derivation key: {key!r}")
        root = Root(
            name=name,
            blobs=blob_list,
            derivations=drv_list,
            output=str(Path(output).absolute()) if output is not None else None,
            image=image,
            files=dict(sorted((files or {}).items())),
            trees=sorted(set(trees)),
            generation=str(Path(generation).absolute()) if generation is not None else None,
        )
        for key in root.trees:
            if not KEY_RE.match(key):
                raise ValueError(f"not a tree key: {key!r}")
        with self.session():
            self._write_file(self.roots_dir / f"{name}.json", root.record_json())
        return root

    def remove_root(self, name: str) -> bool:
        """Remove the root ``name``; whether there was one."""
        self._ensure()
        try:
            (self.roots_dir / f"{name}.json").unlink()
            return True
        except FileNotFoundError:
            return False

    def get_root(self, name: str) -> Root | None:
        """The root ``name``, or None when there is none (or it is unreadable)."""
        self._ensure()
        try:
            return Root.model_validate_json((self.roots_dir / f"{name}.json").read_bytes())
        except (OSError, ValidationError, ValueError):
            return None

    def roots(self) -> dict[str, Root]:
        """Every root by name; an unreadable one is a :class:`StoreError` (gc must not guess)."""
        self._ensure()
        found: dict[str, Root] = {}
        for path in sorted(self.roots_dir.glob("*.json")):
            try:
                root = Root.model_validate_json(path.read_bytes())
            except (ValidationError, ValueError) as exc:
                raise StoreError(
                    f"root {path} is unreadable; gc will not guess what it kept alive",
                    hint="remove the file if you no longer need that image",
                ) from exc
            found[root.name] = root
        return found
