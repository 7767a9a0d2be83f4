"""The plan stage: a spec and its lock -> the build's :class:`~envbuild.build.plan.Plan`.

Reads nothing but the spec, the lock and ``uv --version`` (the installer is part of every
layer's key); what ``envbuild build --dry-run`` prints. The layer plan itself is
:func:`envbuild.build.plan.layer_plan`; this module adds the base, the source builds and
patches, and the image config.
"""

from __future__ import annotations

import logging

from packaging.utils import canonicalize_name

from envbuild.build import image, layers
from envbuild.build.config import image_config
from envbuild.build.install import INSTALL_FORMAT
from envbuild.build.plan import (
    IMAGE_BASE_LAYERS,
    LayerKind,
    Plan,
    PlanBase,
    PlanDist,
    PlanLayer,
    PlanOptions,
    key_of,
    layer_plan,
    shared_inputs,
)
from envbuild.errors import UserError
from envbuild.fsio import sha256_file
from envbuild.installed.venv import VenvTarget
from envbuild.lock.core import find_lock
from envbuild.lock.io import read_lock
from envbuild.lock.model import Lock
from envbuild.lock.wheels import WheelRef, select_wheels
from envbuild.oci.layout import COMPRESSION as COMPRESSION  # noqa: PLC0414 (re-exported; defined there)
from envbuild.proc import core as proc
from envbuild.sourcebuild.requests import describe
from envbuild.spec import LoadedSpec

log = logging.getLogger(__name__)


def load_lock(loaded: LoadedSpec) -> tuple[Lock, str]:
    """The spec's lock and the sha256 of its bytes; refuses a lock made from another spec."""
    path = find_lock(loaded)
    lock = read_lock(path)
    if lock.envbuild.spec_hash != loaded.spec_hash():
        raise UserError(
            f"{loaded.display(path)} was locked from another version of "
            f"{loaded.display(loaded.path)} (spec hash {lock.envbuild.spec_hash[:12]}, now "
            f"{loaded.spec_hash()[:12]})",
            hint=f"run `envbuild lock {loaded.display(loaded.path)}`",
        )
    return lock, sha256_file(path)


def venv_target_of(loaded: LoadedSpec, lock: Lock) -> VenvTarget:
    """The image's venv and interpreter (the spec) for the locked Python and platform."""
    py = loaded.spec.python
    return VenvTarget(
        venv=py.venv,
        interpreter=py.interpreter,
        python_version=lock.envbuild.python,
        platform=lock.envbuild.platform,
    )


def pack_options(
    compression: layers.Compression, compressor: str | None = None
) -> dict[str, str | int]:
    """The pack stage's format and compression, as every layer's key holds them; ``compressor``
    names the compressor and its version (default: the one on this machine)."""
    return {
        "compression": compression.value,
        "compressor": compressor or layers.compressor_id(compression),
        "tar": "gnu-sorted-1",
    }


def compression_of(plan: Plan) -> layers.Compression:
    """The layer compression ``plan`` packs with."""
    return layers.Compression(str(plan.pack["compression"]))


def make_plan(
    loaded: LoadedSpec,
    lock: Lock,
    *,
    lock_hash: str,
    compression: layers.Compression = COMPRESSION,
    installer: str | None = None,
    compressor: str | None = None,
) -> Plan:
    """The plan from the spec and its lock; reads nothing but them, ``$SOURCE_DATE_EPOCH`` and
    the versions of the tools that make the layers, which are part of every layer's key: uv's
    unless ``installer`` names it (what ``uv --version`` says), the compressor's unless
    ``compressor`` does (see :func:`pack_options`)."""
    spec = loaded.spec
    meta = lock.envbuild
    target = venv_target_of(loaded, lock)
    builds = {canonicalize_name(b.name): b for b in meta.builds}
    wheels = select_wheels(lock, skip=frozenset(builds))
    installer = installer or proc.uv_version()
    pack = pack_options(compression, compressor)
    epoch = layers.source_date_epoch()  # the build's one read of $SOURCE_DATE_EPOCH
    sde = epoch or 0
    base = _plan_base(loaded, lock, pack)
    top = []
    kinds: dict[str, LayerKind] = {}
    if spec.vllm:
        top.append("vllm")
    for name in sorted({*map(canonicalize_name, spec.patches)} - set(builds)):
        if name != "vllm":
            top.append(name)
        kinds[name] = "patch"
    options = PlanOptions(max_layers=spec.image.max_layers)
    planned = layer_plan(
        wheels,
        shared=shared_inputs(target, installer, pack, sde),
        options=options,
        base_layers=base.layers,
        top=top,
        kinds=kinds,
        overlap_rules=_overlap_rules(loaded, wheels),
    )
    for name, b in sorted(builds.items()):
        inputs = {
            "layer": "build",
            "install_format": INSTALL_FORMAT,
            "installer": installer,
            "target": target.key(),
            "pack": pack,
            "sdist": {"filename": b.sdist.name, "sha256": b.sdist.hashes.sha256},
            "env": dict(sorted(b.env.items())),
            "source_date_epoch": sde,
        }
        dist = PlanDist(
            name=name,
            version=b.version,
            filename=b.sdist.name,
            sha256=b.sdist.hashes.sha256,
            size=b.sdist.size,
        )
        planned.append(
            PlanLayer(
                name=name,
                kind="build",
                key=key_of("layer", inputs),
                inputs=inputs,
                dists=[dist],
                wheel_bytes=b.sdist.size,
                provisional=True,
            )
        )
    return Plan(
        spec=spec.name,
        spec_hash=loaded.spec_hash(),
        lock_hash=lock_hash,
        source_date_epoch=sde,
        created=image.epoch_time(epoch),
        target={k: v for k, v in target.key().items() if isinstance(v, str | None)},
        installer=installer,
        pack=pack,
        options=options,
        base=base,
        layers=planned,
        config=image_config(spec, spec_hash=loaded.spec_hash(), lock_hash=lock_hash),
        sources=describe(loaded, lock),
    )


def _overlap_rules(loaded: LoadedSpec, wheels: list[WheelRef]) -> dict[str, dict[str, str]]:
    """For each losing distribution of a spec rule: the winner and its wheel's sha256 (what
    decides which paths the loser's layer leaves out)."""
    by_name = {w.canonical: w for w in wheels}
    out: dict[str, dict[str, str]] = {}
    for loser, winner in loaded.spec.image.overlaps.items():
        lo, wi = canonicalize_name(loser), canonicalize_name(winner)
        if lo in by_name and wi in by_name:
            out[lo] = {"winner": wi, "sha256": by_name[wi].sha256}
    return out


def _plan_base(loaded: LoadedSpec, lock: Lock, pack: dict[str, str | int]) -> PlanBase:
    base = loaded.spec.base
    locked = lock.envbuild.base
    if base.kind == "debian":
        extra = f" + {', '.join(base.packages)}" if base.packages else ""
        description = f"debian {base.suite} ({base.variant}){extra}"
        count = 1
    elif base.kind == "image":
        description, count = base.ref, IMAGE_BASE_LAYERS
    elif base.kind == "oci-layout":
        description, count = f"oci-layout {base.path}", IMAGE_BASE_LAYERS
    else:
        description, count = f"rootfs {base.path} ({base.sha256[:12]})", 1
    inputs = {
        "spec": base.model_dump(mode="json"),
        "lock": locked.model_dump(mode="json", by_alias=True) if locked else None,
        "pack": pack,
    }
    return PlanBase(
        kind=base.kind, description=description, key=key_of("base", inputs), layers=count
    )


def plan_target(plan: Plan) -> VenvTarget:
    """Where the plan's venv lives and which interpreter runs it."""
    t = plan.target
    return VenvTarget(
        venv=str(t["venv"]),
        interpreter=str(t["interpreter"]),
        python_version=str(t["python_version"]),
        platform=t.get("platform"),
    )


def wheel_refs(lock: Lock, plan: Plan) -> list[WheelRef]:
    """The locked wheels the plan's layers install (a patched distribution's original too)."""
    by_sha = {
        w.sha256: w
        for w in select_wheels(
            lock, skip=frozenset(layer.name for layer in plan.layers if layer.kind == "build")
        )
    }
    return [by_sha[d.sha256] for layer in plan.layers for d in layer.dists if d.sha256 in by_sha]
