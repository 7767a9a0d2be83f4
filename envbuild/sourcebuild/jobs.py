"""How many compile jobs a source build runs (``MAX_JOBS``), and whether they fit in memory.

``MAX_JOBS`` not pinned by the spec is chosen from the knowledge base's measured memory model of
one compile job (``[[build_memory]]``), the available memory and the cores; a pinned one that
would not fit is warned about at build start with a safe value. :func:`plan_jobs` gives the
:class:`JobsPlan` (``envbuild store plan`` shows it); the value used is recorded in the
derivation's meta, never in its key.
"""

from __future__ import annotations

import logging

from pydantic import BaseModel, ConfigDict, Field, computed_field

from envbuild.sourcebuild.checks import int_flags
from envbuild.sourcebuild.requests import SourceBuildRequest
from envbuild.sourcebuild.toolchain import (
    JobMemory,
    build_memory_budget,
    cpu_count,
    job_memory,
    requested_archs,
)
from envbuild.spec import knowledge

log = logging.getLogger(__name__)


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
