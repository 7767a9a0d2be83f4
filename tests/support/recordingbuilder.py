"""A builder for source-build tests that builds nothing: it keeps each job and hands back a ready
wheel as the job's output, so what a build is given (its inputs, env, key) can be checked."""

from __future__ import annotations

import shutil
from pathlib import Path

from envbuild.sourcebuild.builder import Builder, BuildJob, BuildOutcome, Toolchain


class RecordingBuilder(Builder):
    """Builds nothing: each job is kept, and ``wheel`` (copied) is its output."""

    mode = "recording"

    def __init__(self, wheel: Path, toolchain: Toolchain) -> None:
        self.wheel = wheel
        self.toolchain = toolchain
        self.jobs: list[BuildJob] = []

    def identity(self) -> dict[str, str]:
        return {"mode": self.mode}

    def probe(self, *, cuda: bool) -> Toolchain:
        return self.toolchain

    def build(self, job: BuildJob) -> BuildOutcome:
        self.jobs.append(job)
        out = job.out_dir / self.wheel.name
        shutil.copyfile(self.wheel, out)
        return BuildOutcome(0, "built\n", out)
