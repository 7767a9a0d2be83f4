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
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from packaging.markers import InvalidMarker, Marker
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from pydantic import BaseModel, ConfigDict, Field

from envbuild.build.install import INSTALL_FORMAT, VENV_FORMAT, VenvTarget, WheelRef
from envbuild.errors import ManifestError, UserError
from envbuild.lock.model import Lock
from envbuild.spec.knowledge import secret_args
from envbuild.spec.model import SECRET_REF, Spec
from envbuild.store.core import derivation_key

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
    name: str
    version: str
    filename: str
    sha256: str
    size: int = Field(description="the wheel's size in bytes")

    @classmethod
    def of(cls, w: WheelRef) -> PlanDist:
        return cls(
            name=w.canonical, version=w.version, filename=w.filename, sha256=w.sha256, size=w.size
        )

    def ref(self, url: str) -> WheelRef:
        return WheelRef(self.name, self.version, self.filename, url, self.sha256, self.size)


LayerKind = Literal["base", "venv", "dist", "group", "top", "build", "patch"]


class PlanLayer(_Model):
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
    kind: str
    description: str
    key: str
    layers: int = Field(description="layers the base contributes (an estimate before a pull)")


class PlanOptions(_Model):
    max_layers: int = 60
    big_bytes: int = BIG_BYTES
    groups: int = GROUPS


class ImageConfig(_Model):
    """The parts of the OCI image config that envbuild decides."""

    env: dict[str, str]
    cmd: list[str]
    entrypoint: list[str] | None = None
    labels: dict[str, str]
    workdir: str = "/"


class Plan(_Model):
    format: Literal[1] = 1
    spec: str
    spec_hash: str
    lock_hash: str
    source_date_epoch: int
    target: dict[str, str | None]
    installer: str = Field(description="`uv --version` of the installing uv")
    pack: dict[str, str | int] = Field(description="the pack stage's format and compression")
    options: PlanOptions
    base: PlanBase
    layers: list[PlanLayer]
    config: ImageConfig
    sources: list[PlannedDerivation] = Field(
        default_factory=list, description="source builds and patches, realized before the layers"
    )

    def layer(self, name: str) -> PlanLayer:
        return next(layer for layer in self.layers if layer.name == name)

    def with_layers(self, layers: Sequence[PlanLayer]) -> Plan:
        return self.model_copy(update={"layers": list(layers)})


def key_of(kind: str, inputs: Mapping[str, Any]) -> str:
    return derivation_key(kind, inputs)


# --- choosing the wheels ----------------------------------------------------------------------


def target_tags(python_version: str, platform: str) -> list[Tag]:
    """Wheel tags the image's CPython accepts on ``platform``, best first."""
    major, minor = (int(x) for x in python_version.split(".")[:2])
    platforms = _platforms(platform)
    tags = list(cpython_tags((major, minor), platforms=platforms))
    tags += list(compatible_tags((major, minor), platforms=platforms))
    return tags


def _platforms(platform: str) -> list[str]:
    if platform.startswith("manylinux_"):
        _, glibc_major, glibc_minor, arch = platform.split("_", 3)
        out = [f"manylinux_{glibc_major}_{m}_{arch}" for m in range(int(glibc_minor), 4, -1)]
        legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
        for m, name in legacy.items():
            if m <= int(glibc_minor):
                out.append(f"{name}_{arch}")
        return [*out, f"linux_{arch}"]
    return [platform]


def marker_env(python_version: str, platform: str) -> dict[str, str]:
    arch = "aarch64" if platform.endswith("aarch64") else "x86_64"
    return {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": arch,
        "extra": "",
    }


def select_wheels(lock: Lock, *, skip: frozenset[str] = frozenset()) -> list[WheelRef]:
    """One wheel per locked package that applies to the lock's target, best tag first.

    ``skip`` names distributions built from source (their wheel comes from the build stage).
    """
    meta = lock.envbuild
    tags = {t: i for i, t in enumerate(target_tags(meta.python, meta.platform))}
    env = marker_env(meta.python, meta.platform)
    out: list[WheelRef] = []
    for pkg in sorted(lock.packages, key=lambda p: p.name):
        name = canonicalize_name(pkg.name)
        if name in skip:
            continue
        if pkg.marker:
            try:
                if not Marker(pkg.marker).evaluate(env):
                    continue
            except InvalidMarker as exc:
                raise ManifestError(f"lock: {pkg.name}: bad marker {pkg.marker!r}: {exc}") from None
        best: tuple[int, str] | None = None
        chosen = None
        for f in pkg.wheels:
            try:
                _, _, _, wtags = parse_wheel_filename(f.name)
            except InvalidWheelFilename:
                raise ManifestError(f"lock: {pkg.name}: {f.name!r} is not a wheel name") from None
            rank = min((tags[t] for t in wtags if t in tags), default=None)
            if rank is not None and (best is None or (rank, f.name) < best):
                best, chosen = (rank, f.name), f
        if chosen is None:
            raise ManifestError(
                f"lock: {pkg.name} {pkg.version} has no wheel for CPython {meta.python} on "
                f"{meta.platform}",
                hint="relock (`envbuild lock`), or build it from source under [builds]",
            )
        out.append(
            WheelRef(name, pkg.version, chosen.name, chosen.url, chosen.hashes.sha256, chosen.size)
        )
    return out


# --- layering ---------------------------------------------------------------------------------


def bucket(name: str, groups: int) -> int:
    """The group of a small distribution: a hash of its name, so nothing else moves it."""
    digest = hashlib.sha256(canonicalize_name(name).encode()).digest()
    return int.from_bytes(digest[:4], "big") % groups


def layer_plan(
    wheels: Sequence[WheelRef],
    *,
    target: VenvTarget,
    installer: str,
    pack: Mapping[str, str | int],
    source_date_epoch: int,
    options: PlanOptions,
    base_layers: int,
    top: Sequence[str] = (),
    kinds: Mapping[str, LayerKind] | None = None,
    overlap_rules: Mapping[str, Mapping[str, str]] | None = None,
) -> list[PlanLayer]:
    """The Python layers, venv first. ``top`` names distributions (vLLM, patched, source-built)
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

    common: dict[str, object] = {
        "install_format": INSTALL_FORMAT,
        "installer": installer,
        "target": target.key(),
        "pack": dict(pack),
        "source_date_epoch": source_date_epoch,
    }

    def make(name: str, kind: LayerKind, members: Sequence[WheelRef]) -> PlanLayer:
        members = sorted(members, key=lambda w: w.canonical)
        loses = {w.canonical: dict(rules[w.canonical]) for w in members if w.canonical in rules}
        inputs = {
            **common,
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


# --- the image config -------------------------------------------------------------------------

#: PATH of a Debian system, after the venv's bin.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LABEL_PREFIX = "dev.envbuild"


def image_config(spec: Spec, *, spec_hash: str, lock_hash: str) -> ImageConfig:
    """Env, command and labels of the image. Nothing secret goes in: a ``${VAR}`` in
    ``[serve.env]`` is left for run time, and one anywhere else that would land in the image is an
    error."""
    venv = spec.python.venv.rstrip("/")
    env = {
        "PATH": f"{venv}/bin:{SYSTEM_PATH}",
        "VIRTUAL_ENV": venv,
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
    }
    if spec.serve:
        env.update({k: v for k, v in spec.serve.env.items() if not SECRET_REF.search(v)})
    env.update(spec.image.env)
    extra = list(spec.serve.extra_args) if spec.serve else []
    secret = set()
    for arg in secret_args(extra):
        if arg.value is None or not SECRET_REF.fullmatch(arg.value):
            raise UserError(
                f"serve.extra_args: the value of {arg.flag.flag} must be a ${{VAR}} reference "
                "(a literal secret would be written into the image)",
                hint=f'write it as "${{{arg.flag.env}}}" and pass {arg.flag.env} at run time',
            )
        secret.add(arg.index)
    run_time: set[int] = set()  # arguments of cmd filled in when the container starts
    if spec.image.cmd is not None:
        cmd = list(spec.image.cmd)
    elif spec.serve and spec.vllm and spec.model:
        cmd = vllm_serve_cmd(spec)
        run_time = {len(cmd) - len(extra) + i for i in secret}
    else:
        cmd = ["python3"]
    labels = {
        **spec.image.labels,
        f"{LABEL_PREFIX}.spec": spec.name,
        f"{LABEL_PREFIX}.spec-hash": spec_hash,
        f"{LABEL_PREFIX}.lock-hash": lock_hash,
    }
    for where, values in (
        ("image.env", list(spec.image.env.values())),
        ("image.cmd", [a for i, a in enumerate(cmd) if i not in run_time]),
        ("image.labels", list(spec.image.labels.values())),
        ("serve.extra_args", [a for i, a in enumerate(extra) if i not in secret]),
    ):
        for value in values:
            if m := SECRET_REF.search(value):
                raise UserError(
                    f"{where}: {value!r} references ${{{m.group(1)}}}, which would put a secret "
                    "into the image",
                    hint="pass secrets at run time through [serve.env] (they stay out of the "
                    "image) or `docker run -e`",
                )
    if any(SECRET_REF.search(cmd[i]) for i in run_time):
        cmd = run_time_command(cmd, run_time)
    return ImageConfig(env=env, cmd=cmd, labels=labels, workdir=spec.image.workdir)


def run_time_command(cmd: Sequence[str], secret: set[int]) -> list[str]:
    """``cmd`` as a ``/bin/sh -c`` command line that fills each ``${VAR}`` of the arguments at
    ``secret`` in from the container's environment as it starts (``docker run -e VAR``), and
    stops with "VAR: is not set" when it is missing. Every other argument is quoted as it is:
    the image's config names the variables, never their values."""
    words = []
    for i, arg in enumerate(cmd):
        if i not in secret:
            words.append(shlex.quote(arg))
            continue
        parts = SECRET_REF.split(arg)  # literal, name, literal, name, ...
        words.append(
            "".join(
                f'"${{{part}:?is not set}}"' if odd else (shlex.quote(part) if part else "")
                for odd, part in ((k % 2 == 1, p) for k, p in enumerate(parts))
            )
        )
    return ["/bin/sh", "-c", "exec " + " ".join(words)]


def vllm_serve_cmd(spec: Spec) -> list[str]:
    """``vllm serve <model> …`` with the spec's serving settings."""
    assert spec.serve is not None and spec.model is not None
    s = spec.serve
    cmd = ["vllm", "serve", spec.model.repo, "--revision", spec.model.revision]
    if s.served_model_name:
        cmd += ["--served-model-name", s.served_model_name]
    cmd += ["--host", s.host, "--port", str(s.port)]
    cmd += ["--tensor-parallel-size", str(s.tensor_parallel_size)]
    if s.pipeline_parallel_size > 1:
        cmd += ["--pipeline-parallel-size", str(s.pipeline_parallel_size)]
    if s.max_model_len is not None:
        cmd += ["--max-model-len", str(s.max_model_len)]
    cmd += ["--kv-cache-dtype", s.kv_cache_dtype]
    cmd += ["--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}"]
    return [*cmd, *s.extra_args]
