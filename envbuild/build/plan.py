"""The layer plan: which layers the image will have and what each holds, before any tarball.

Like nix2container's JSON plan, :class:`Plan` is a versioned, serializable value computed from the
spec and the lock alone. Each layer carries a derivation key: the sha256 of everything that decides
its bytes (the wheels with their sha256, the install and pack formats, the venv path, the
interpreter, the uv version, SOURCE_DATE_EPOCH). A layer whose key the store already knows is not
installed or packed again.

Layering, bottom to top: the base; the venv itself (``pyvenv.cfg``, ``bin/python``); every big
distribution (torch, nvidia-*, triton … whose wheel is at least ``big_bytes``) in a layer of its
own, so two images share it; the small ones in ``groups`` buckets chosen by a hash of the name (a
package bumped or added moves no other package); vLLM, patched and source-built distributions on
top. The whole stays within the spec's layer budget (``[image] max_layers``, default 60).

The wheels are chosen by :mod:`envbuild.lock.wheels`, the image config by
:mod:`envbuild.build.config`; :func:`envbuild.pipeline.planner.make_plan` puts a plan together.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field

from envbuild.build.install import INSTALL_FORMAT, VENV_FORMAT
from envbuild.errors import UserError
from envbuild.installed.venv import VenvTarget
from envbuild.lock.wheels import WheelRef
from envbuild.store.core import derivation_key

log = logging.getLogger(__name__)

PLAN_FORMAT = 1
#: Wheels at least this big (compressed) get a layer of their own.
BIG_BYTES = 32 * 1024 * 1024
#: Buckets for the small distributions.
GROUPS = 8
#: Layers a registry base image is assumed to have before it is pulled.
IMAGE_BASE_LAYERS = 20


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlanDist(_Model):
    """One distribution a layer installs: its locked wheel."""

    name: str
    version: str
    filename: str
    sha256: str
    size: int = Field(description="the wheel's size in bytes")

    @classmethod
    def of(cls, w: WheelRef) -> PlanDist:
        """The plan's record of a locked wheel."""
        return cls(
            name=w.canonical, version=w.version, filename=w.filename, sha256=w.sha256, size=w.size
        )

    def ref(self, url: str) -> WheelRef:
        """The wheel again, fetched from ``url``."""
        return WheelRef(self.name, self.version, self.filename, url, self.sha256, self.size)


LayerKind = Literal["base", "venv", "dist", "group", "top", "build", "patch"]


class PlanLayer(_Model):
    """One layer the plan will build above the base, with its derivation key and inputs."""

    name: str = Field(description="venv, the distribution's name, group-NN, …")
    kind: LayerKind
    key: str = Field(description="derivation key: sha256 of every input of the layer's bytes")
    inputs: dict[str, Any] = Field(description="what the key is the hash of")
    dists: list[PlanDist] = Field(default_factory=list)
    loses_to: dict[str, str] = Field(
        default_factory=dict,
        description="distribution -> the one that wins their shared paths ([image.overlaps])",
    )
    wheel_bytes: int = 0
    provisional: bool = Field(
        False,
        description="a source-build or patch layer: its key is the plan's guess, replaced by the "
        "build once the wheel it installs exists (the key then names that wheel and the "
        "derivations that made it)",
    )


class PlannedDerivation(_Model):
    """A source build or patch set of the spec, before anything is built."""

    kind: Literal["source-build", "patch"]
    dist: str
    version: str
    summary: str = Field(description="one line for people")
    inputs: dict[str, Any] = Field(description="the inputs the spec and lock decide")
    key: str | None = Field(None, description="known before building for patches of locked wheels")
    patched_version: str | None = None


class PlanBase(_Model):
    """The base the layers go on, with the key its layers are stored under."""

    kind: str
    description: str
    key: str
    layers: int = Field(description="layers the base contributes (an estimate before a pull)")


class PlanOptions(_Model):
    """How the layers are cut: the layer budget, what counts as big, how many groups."""

    max_layers: int = 60
    big_bytes: int = BIG_BYTES
    groups: int = GROUPS


class PlanConfig(_Model):
    """The parts of the OCI image config that envbuild decides (env, command, labels, workdir),
    as the plan records them; the image's :class:`envbuild.build.image.ImageConfig` is this
    merged over the base image's."""

    env: dict[str, str]
    cmd: list[str]
    entrypoint: list[str] | None = None
    labels: dict[str, str]
    workdir: str = "/"


class Plan(_Model):
    """The whole build before any tarball: base, layers, config, source builds and patches."""

    format: Literal[1] = 1
    spec: str
    spec_hash: str
    lock_hash: str
    source_date_epoch: int = Field(description="SOURCE_DATE_EPOCH (0 when unset): every mtime")
    created: str | None = Field(
        None, description="SOURCE_DATE_EPOCH as RFC 3339 when set: the image's time"
    )
    target: dict[str, str | None]
    installer: str = Field(description="`uv --version` of the installing uv")
    pack: dict[str, str | int] = Field(description="the pack stage's format and compression")
    options: PlanOptions
    base: PlanBase
    layers: list[PlanLayer]
    config: PlanConfig
    sources: list[PlannedDerivation] = Field(
        default_factory=list, description="source builds and patches, realized before the layers"
    )

    def layer(self, name: str) -> PlanLayer:
        """The layer named ``name``."""
        return next(layer for layer in self.layers if layer.name == name)

    def with_layers(self, layers: Sequence[PlanLayer]) -> Plan:
        """This plan with other layers (provisional ones resolved)."""
        return self.model_copy(update={"layers": list(layers)})


def key_of(kind: str, inputs: Mapping[str, Any]) -> str:
    """The store's derivation key of ``inputs`` for a derivation of ``kind``."""
    return derivation_key(kind, inputs)


# --- layering ---------------------------------------------------------------------------------


def bucket(name: str, groups: int) -> int:
    """The group of a small distribution: a hash of its name, so nothing else moves it."""
    digest = hashlib.sha256(canonicalize_name(name).encode()).digest()
    return int.from_bytes(digest[:4], "big") % groups


def shared_inputs(
    target: VenvTarget, installer: str, pack: Mapping[str, str | int], source_date_epoch: int
) -> dict[str, object]:
    """The inputs every Python layer shares (:data:`COMMON_INPUTS`): the install format, the
    installing uv, the venv target, the pack stage's format and the layers' mtime."""
    return {
        "install_format": INSTALL_FORMAT,
        "installer": installer,
        "target": target.key(),
        "pack": dict(pack),
        "source_date_epoch": source_date_epoch,
    }


def layer_plan(
    wheels: Sequence[WheelRef],
    *,
    shared: Mapping[str, object],
    options: PlanOptions,
    base_layers: int,
    top: Sequence[str] = (),
    kinds: Mapping[str, LayerKind] | None = None,
    overlap_rules: Mapping[str, Mapping[str, str]] | None = None,
) -> list[PlanLayer]:
    """The Python layers, venv first, each keyed by its members and ``shared``
    (:func:`shared_inputs`). ``top`` names distributions (vLLM, patched, source-built)
    that go on top, each alone, in that order; ``kinds`` says which kind each top layer is.
    ``overlap_rules`` maps a distribution that loses an overlap to its winner and the winner's
    wheel sha256: they decide what its layer leaves out, so they are part of its key."""
    rules = overlap_rules or {}
    top_names = [canonicalize_name(t) for t in top]
    by_name = {w.canonical: w for w in wheels}
    rest = [w for w in sorted(wheels) if w.canonical not in top_names]
    big = sorted((w for w in rest if w.size >= options.big_bytes), key=lambda w: w.canonical)
    small = [w for w in rest if w.size < options.big_bytes]
    fixed = base_layers + 1 + sum(1 for t in top_names if t in by_name)
    groups = options.groups
    room = options.max_layers - fixed - groups
    if room < 0:
        raise UserError(
            f"a layer budget of {options.max_layers} cannot hold {base_layers} base layer(s), "
            f"the venv, {groups} groups and {fixed - base_layers - 1} top layer(s)",
            hint="raise [image] max_layers",
        )
    if len(big) > room:
        keep = {w.canonical for w in sorted(big, key=lambda w: (-w.size, w.canonical))[:room]}
        small += [w for w in big if w.canonical not in keep]
        big = [w for w in big if w.canonical in keep]

    def make(name: str, kind: LayerKind, members: Sequence[WheelRef]) -> PlanLayer:
        members = sorted(members, key=lambda w: w.canonical)
        loses = {w.canonical: dict(rules[w.canonical]) for w in members if w.canonical in rules}
        inputs = {
            **shared,
            "layer": kind,
            "dists": [w.key() for w in members],
            "overlaps": loses,
        }
        if kind == "venv":
            inputs["venv_format"] = VENV_FORMAT
        return PlanLayer(
            name=name,
            kind=kind,
            key=derivation_key("layer", inputs),
            inputs=inputs,
            dists=[PlanDist.of(w) for w in members],
            loses_to={d: r["winner"] for d, r in loses.items()},
            wheel_bytes=sum(w.size for w in members),
            provisional=kind in ("build", "patch"),
        )

    layers = [make("venv", "venv", [])]
    layers += [make(w.canonical, "dist", [w]) for w in big]
    buckets: dict[int, list[WheelRef]] = {}
    for w in small:
        buckets.setdefault(bucket(w.canonical, groups), []).append(w)
    layers += [make(f"group-{i:02d}", "group", buckets[i]) for i in sorted(buckets)]
    for name in top_names:
        if name in by_name:
            layers.append(make(name, (kinds or {}).get(name, "top"), [by_name[name]]))
    return layers


#: The inputs every Python layer shares (install and pack formats, target, SOURCE_DATE_EPOCH).
COMMON_INPUTS = ("install_format", "installer", "target", "pack", "source_date_epoch")


def resolve_layer(
    layer: PlanLayer, wheel: WheelRef, sources: Sequence[Mapping[str, str]]
) -> PlanLayer:
    """A provisional source-build or patch layer once its wheel exists: it installs ``wheel``,
    and its key names the wheel (name, version, sha256) and ``sources``, the derivations that
    made it (``{"kind": "source-build" | "patch", "key": …}``). A changed flag or patch gives
    another derivation key and so another layer key; nothing else in the plan moves."""
    inputs = {
        **{k: layer.inputs[k] for k in COMMON_INPUTS},
        "layer": layer.kind,
        "dists": [wheel.key()],
        "overlaps": layer.inputs.get("overlaps", {}),
        "sources": [dict(s) for s in sources],
    }
    return layer.model_copy(
        update={
            "key": derivation_key("layer", inputs),
            "inputs": inputs,
            "dists": [PlanDist.of(wheel)],
            "wheel_bytes": wheel.size,
            "provisional": False,
        }
    )
