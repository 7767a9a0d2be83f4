"""The snapshot stage: what a machine (or an image) really is, as a versioned manifest.

:func:`take_snapshot` asks each part (host, GPUs, Python environments, CUDA toolkits, Docker,
systemd, the Hugging Face cache) and assembles a
:class:`~envbuild.snapshot.model.core.Snapshot`. Each part reads only what its user can read
and changes nothing.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import tempfile
from dataclasses import dataclass, field

from envbuild import __version__
from envbuild.engine import ContainerEngine, DockerEngine
from envbuild.snapshot import (
    cuda,
    docker,
    gpu,
    hfcache,
    host,
    nvml,
    patchinfo,
    pyenv,
    records,
    refs,
    systemd,
    torchinfo,
)
from envbuild.snapshot.model.core import SCHEMA_VERSION, Snapshot, load_snapshot, parse_snapshot
from envbuild.snapshot.model.pyenv import LinkFinding, PythonEnv
from envbuild.snapshot.redact import Redactor

log = logging.getLogger(__name__)

__all__ = [
    "SCHEMA_VERSION",
    "Options",
    "Snapshot",
    "load_snapshot",
    "parse_snapshot",
    "take_snapshot",
]


@dataclass
class Options:
    pythons: list[str] = field(default_factory=list)
    integrity: records.Mode = "full"
    spec: str | None = None
    image: str | None = None
    hf_cache: str | None = None  # None: huggingface_hub's default
    services: str = systemd.DEFAULT_PATTERN
    docker: bool = True
    engine: ContainerEngine | None = None  # None: the Docker engine at the default socket
    systemd: bool = True
    models: bool = True
    cuda: bool = True
    nvml: nvml.Nvml | None = None  # None: the real NVML
    links: bool = True  # run the link check over each environment


def store_path() -> str:
    """The envbuild store's default place (the store module's own rule)."""
    if os.environ.get("ENVBUILD_STORE"):
        return os.environ["ENVBUILD_STORE"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "envbuild", "store")


def _taken_at() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    when = (
        dt.datetime.fromtimestamp(int(epoch), dt.UTC)
        if epoch and epoch.isdigit()
        else dt.datetime.now(dt.UTC)
    )
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def link_findings(env: PythonEnv) -> PythonEnv:
    """``env`` with what the link check finds in it (envbuild.linkcheck; cached per file)."""
    from envbuild.linkcheck import core as linkcheck

    log.info("checking the links of %s", env.requested)
    report = linkcheck.check_folder("/", env.prefix)
    found = [*report.findings, *report.optional]
    links = [LinkFinding.model_validate(f.as_dict()) for f in found]
    return env.model_copy(update={"links": links})


def take_snapshot(opts: Options) -> Snapshot:
    redactor = Redactor()
    spec = refs.spec_ref(opts.spec) if opts.spec else None
    image = refs.image_ref(opts.image) if opts.image else None
    hf_path = opts.hf_cache or hfcache.default_cache()
    if opts.models:  # before the long part: a bad path is an error of the input
        hfcache.check_path(hf_path)
    envs = []
    for python in opts.pythons:
        log.info("checking %s (%s)", python, opts.integrity)
        env = patchinfo.record_patches(pyenv.scan_env(python, opts.integrity))
        env = torchinfo.record_torch_build(env)
        envs.append(link_findings(env) if opts.links else env)
    disks = [("root", "/"), ("tmp", tempfile.gettempdir()), ("store", store_path())]
    if opts.models:
        disks.append(("hf-cache", hf_path))
    disks += [("venv", env.prefix) for env in envs]
    log.info("reading host and GPUs")
    snap = Snapshot(
        generator=f"envbuild {__version__}",
        taken_at=_taken_at(),
        host=host.read_host(disks),
        gpu=gpu.read_gpus(opts.nvml),
        pythons=envs,
        cuda_toolkits=cuda.read_toolkits() if opts.cuda else [],
        cuda_libraries=cuda.read_libraries() if opts.cuda else None,
        docker=docker.read_docker(redactor, opts.engine or DockerEngine()) if opts.docker else None,
        systemd=systemd.read_units(opts.services, redactor) if opts.systemd else None,
        hf_cache=(
            hfcache.read_cache(hf_path, check_blobs=opts.integrity == "full")
            if opts.models
            else None
        ),
        spec=spec,
        image=image,
        redacted=sorted(redactor.fields),
    )
    return snap
