"""How many compile jobs a source build runs (``MAX_JOBS``), and whether they fit in memory.

The memory a build may use (:func:`build_memory_budget`: free memory, the cgroup's limit and
``$ENVBUILD_BUILD_MEMORY``) and what one job needs (:func:`job_memory`) are here too.
``MAX_JOBS`` not pinned by the spec is chosen from the knowledge base's measured memory model of
one compile job (``[[build_memory]]``), the available memory and the cores; a pinned one that
would not fit is warned about at build start with a safe value. :func:`plan_jobs` gives the
:class:`JobsPlan` (``envbuild store plan`` shows it); the value used is recorded in the
derivation's meta, never in its key.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, computed_field

from envbuild.sourcebuild.checks import int_flags
from envbuild.sourcebuild.requests import SourceBuildRequest
from envbuild.sourcebuild.toolchain import requested_archs
from envbuild.spec import knowledge

log = logging.getLogger(__name__)

#: flash-attn's own estimate: about 9 GB of memory per compile job at 4 nvcc threads.
GB_PER_JOB_AT_4_THREADS = 9.0


def available_memory_bytes() -> int:
    """Memory a build may use: MemAvailable, capped by the cgroup's limit when there is one."""
    avail = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        avail = 0
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            avail = min(avail or int(limit), max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return avail


_SIZE = re.compile(r"^\s*(\d{1,15}(?:\.\d{1,6})?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """``12GiB``, ``12G`` or ``12GB`` (10^9), ``1500MB``, ``12000000000`` -> a positive number
    of bytes; ValueError otherwise."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"{text!r} is not a size (expected like 12GiB, 12GB or 12000000000)")
    power = "kmgt".find(m.group(2).lower()) + 1 if m.group(2) else 0
    if m.group(3) and not power:
        raise ValueError(f"{text!r} is not a size (expected like 12GiB, 12GB or 12000000000)")
    value = int(float(m.group(1)) * (1024 if m.group(3) else 1000) ** power)
    if value <= 0:
        raise ValueError(f"{text!r} is not a positive size")
    return value


def build_memory_budget(env: Mapping[str, str] | None = None) -> int:
    """Memory a source build may use: :func:`available_memory_bytes`, capped by
    ``$ENVBUILD_BUILD_MEMORY`` (``12GiB``) when set: on a machine shared with other work the
    memory free now is not all the build's to take."""
    env = os.environ if env is None else env
    avail = available_memory_bytes()
    if value := env.get("ENVBUILD_BUILD_MEMORY"):
        from envbuild.errors import UsageError

        try:
            cap = parse_size(value)
        except ValueError as exc:
            raise UsageError(
                f"ENVBUILD_BUILD_MEMORY: {exc}", hint="set it like ENVBUILD_BUILD_MEMORY=12GiB"
            ) from None
        return min(avail, cap) if avail else cap
    return avail


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def choose_max_jobs(
    nvcc_threads: int,
    *,
    memory: int | None = None,
    cores: int | None = None,
    per_job: JobMemory | None = None,
) -> int:
    """Compile jobs that fit: ``per_job`` (default :func:`job_memory` without a model: ~9 GB
    per job at 4 nvcc threads) into ``memory`` (default: what is available now), at most one
    per core, at least one."""
    memory = available_memory_bytes() if memory is None else memory
    cores = cpu_count() if cores is None else cores
    return (per_job or job_memory(nvcc_threads, 0)).jobs_that_fit(memory, cores)


@dataclass(frozen=True)
class JobMemory:
    """What one compile job of a build needs, and where that figure comes from."""

    per_job_bytes: int
    source: str

    def jobs_that_fit(self, memory: int, cores: int) -> int:
        """Compile jobs that fit in ``memory``: at most one per core, at least one."""
        return max(1, min(cores, memory // max(1, self.per_job_bytes)))


def job_memory(
    nvcc_threads: int, archs: int, *, gb_base: float | None = None, gb_per_arch: float | None = None
) -> JobMemory:
    """Peak memory of one compile job. nvcc's ``--threads T`` compiles min(T, archs) of a file's
    archs at once, each its own cicc and ptxas, so a job needs ``gb_base + gb_per_arch *
    min(T, archs)`` (a measured model from the knowledge base). Without one: flash-attn's own
    rule, ~9 GB per job at 4 threads, scaled by threads."""
    if gb_base is not None and gb_per_arch is not None:
        at_once = max(1, min(max(1, nvcc_threads), max(1, archs)))
        return JobMemory(
            int((gb_base + gb_per_arch * at_once) * 1e9),
            f"{gb_base:g} GB + {gb_per_arch:g} GB x {at_once} arch(s) at once "
            f"(NVCC_THREADS={nvcc_threads}, {archs} arch(s))",
        )
    return JobMemory(
        int(GB_PER_JOB_AT_4_THREADS * 1e9 * max(1, nvcc_threads) / 4),
        f"flash-attn's estimate, ~{GB_PER_JOB_AT_4_THREADS:g} GB per job at 4 nvcc threads, "
        f"scaled to {nvcc_threads}",
    )


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobsPlan(_Model):
    """How many compile jobs a build runs, why, and whether that fits the builder's memory."""

    dist: str
    max_jobs: int
    pinned: bool = Field(description="MAX_JOBS is the spec's, not envbuild's choice")
    nvcc_threads: int
    archs: int = Field(description="archs each file is compiled for")
    per_job_bytes: int
    per_job_source: str
    memory_bytes: int = Field(
        description="what the build may use: MemAvailable, capped by the cgroup limit and "
        "$ENVBUILD_BUILD_MEMORY"
    )
    cores: int
    safe_max_jobs: int = Field(description="the most jobs that fit the memory and cores")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def peak_bytes(self) -> int:
        """The estimated peak: MAX_JOBS jobs at once, each at its model's peak."""
        return self.max_jobs * self.per_job_bytes

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.memory_bytes

    def render(self) -> str:
        how = "pinned by the spec" if self.pinned else "chosen from the memory model"
        return (
            f"MAX_JOBS={self.max_jobs} ({how}) x NVCC_THREADS={self.nvcc_threads}: about "
            f"{self.peak_bytes / 1e9:.1f} GB at peak ({self.per_job_bytes / 1e9:.1f} GB per job: "
            f"{self.per_job_source}); {self.memory_bytes / 1e9:.1f} GB available, "
            f"{self.cores} cores"
        )

    def warning(self) -> str | None:
        if self.fits:
            return None
        return (
            f"{self.dist}: MAX_JOBS={self.max_jobs} x NVCC_THREADS={self.nvcc_threads} needs "
            f"about {self.peak_bytes / 1e9:.1f} GB ({self.max_jobs} jobs x "
            f"{self.per_job_bytes / 1e9:.1f} GB: {self.per_job_source}) but "
            f"{self.memory_bytes / 1e9:.1f} GB is available: the build may be killed; a safe "
            f"value here is MAX_JOBS={self.safe_max_jobs} (or leave MAX_JOBS out to have it "
            "chosen from free memory)"
        )

    def warn(self) -> JobsPlan:
        log.info("%s: building with %s", self.dist, self.render())
        if text := self.warning():
            log.warning("%s", text)
        return self


def plan_jobs(
    req: SourceBuildRequest, *, memory: int | None = None, cores: int | None = None
) -> JobsPlan:
    """MAX_JOBS for ``req`` on this machine: the spec's when pinned (checked against the
    memory model), else as many jobs as fit. The per-job memory is the knowledge base's
    measured model (``[[build_memory]]``) for the distribution, else flash-attn's rule."""
    pinned = int_flags(req)
    threads = pinned.get("NVCC_THREADS", 4)
    try:
        archs = len({r.arch for r in requested_archs(req.build_env) if r.sass or r.ptx})
    except ValueError:
        archs = 0
    fact = knowledge.build_memory(req.dist, req.version)
    per_job: JobMemory = (
        job_memory(threads, archs, gb_base=fact.gb_base, gb_per_arch=fact.gb_per_arch)
        if fact
        else job_memory(threads, archs)
    )
    memory = build_memory_budget() if memory is None else memory
    cores = cpu_count() if cores is None else cores
    safe = per_job.jobs_that_fit(memory, cores)
    return JobsPlan(
        dist=req.dist,
        max_jobs=pinned.get("MAX_JOBS") or safe,
        pinned="MAX_JOBS" in pinned,
        nvcc_threads=threads,
        archs=archs,
        per_job_bytes=per_job.per_job_bytes,
        per_job_source=per_job.source,
        memory_bytes=memory,
        cores=cores,
        safe_max_jobs=safe,
    )
