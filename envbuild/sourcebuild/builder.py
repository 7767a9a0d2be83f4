"""Where a source build runs: on the host, or in a builder container.

A :class:`Builder` does two things for :mod:`envbuild.sourcebuild.realize`: it reports the
toolchain a build
would use (:meth:`Builder.probe`: Python, gcc, g++, nvcc versions — inputs of the derivation key),
and it turns an sdist into a wheel (:meth:`Builder.build`), returning the exit status and the whole
log. It never touches the store: the caller decides what to keep.

* :class:`HostBuilder` makes a build venv with uv holding the build requirements (the locked
  torch among them, pinned by the lock's versions as constraints) and runs
  ``uv build --wheel --no-build-isolation`` in it.
* :class:`ContainerBuilder` (in :mod:`envbuild.sourcebuild.container`) runs the same steps inside a
  container made from the image's own lower layers.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from envbuild.errors import ToolNotFound
from envbuild.proc import core as proc
from envbuild.sourcebuild.toolchain import (
    Nvcc,
    assemble_cuda_home,
    check_toolkit,
    compiler_version,
    find_nvcc,
    nvcc_info,
    toolkit_home,
)

log = logging.getLogger(__name__)

#: Build outputs may not depend on the wall clock: setuptools/wheel honour this for zip times.
SOURCE_DATE_EPOCH = "315532800"  # 1980-01-01, the earliest time a zip can hold


@dataclass(frozen=True)
class Toolchain:
    """What a build runs with. ``python`` is the full version; ``compilers`` name -> version."""

    python: str
    compilers: dict[str, str]
    nvcc: Nvcc | None = None


@dataclass(frozen=True)
class BuildJob:
    dist: str
    version: str
    sdist: Path
    env: dict[str, str]  # the build flags, MAX_JOBS as chosen
    requires: list[str]  # build requirements (PEP 508), torch among them when the build needs it
    constraints: list[str] = field(default_factory=list)  # name==version from the lock
    index_url: str | None = None
    extra_index_urls: Sequence[str | proc.Secret] = ()
    exclude_newer: str | None = None
    out_dir: Path = Path("out")
    work_dir: Path = Path("work")


@dataclass(frozen=True)
class BuildOutcome:
    returncode: int
    log: str
    wheel: Path | None


class Builder(ABC):
    """Runs source builds somewhere. Subclasses document where."""

    mode: str = "?"

    @abstractmethod
    def identity(self) -> dict[str, str]:
        """What distinguishes this builder in a derivation key (no host path, no secret)."""

    @abstractmethod
    def probe(self, *, cuda: bool) -> Toolchain:
        """The toolchain a build would use; raises ToolNotFound for a missing compiler."""

    @abstractmethod
    def build(self, job: BuildJob) -> BuildOutcome:
        """Build ``job.sdist`` into a wheel in ``job.out_dir``. Never raises for a failed build:
        the outcome carries the exit status and the log."""


class _Log:
    """The build log: every command with its output, in order."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def command(self, argv: Sequence[object], done: proc.Completed) -> None:
        self.parts.append(f"$ {' '.join(str(a) for a in argv)}\n")
        self.parts.append(done.stdout + done.stderr)
        if done.returncode != 0:
            self.parts.append(f"[exit status {done.returncode}]\n")

    def text(self) -> str:
        return "".join(p if p.endswith("\n") or not p else p + "\n" for p in self.parts)


class HostBuilder(Builder):
    """Builds on this machine, in a fresh uv venv, without build isolation.

    ``python`` is what uv's ``--python`` accepts (``3.11``, a path). ``base_env`` replaces
    ``os.environ`` as the environment compilers are looked up in and builds run with.
    """

    mode = "host"

    def __init__(self, python: str, *, base_env: Mapping[str, str] | None = None) -> None:
        self.python = python
        self.base_env = dict(os.environ if base_env is None else base_env)
        self._interpreter: str | None = None

    def identity(self) -> dict[str, str]:
        return {"mode": self.mode}

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = proc.child_env(dict(extra or {}), base=self.base_env)
        env["UV_PYTHON_DOWNLOADS"] = "never"
        return env

    def interpreter(self) -> str:
        if self._interpreter is None:
            uv = proc.find_uv()
            found = proc.run(
                [uv, "python", "find", "--no-project", "--", self.python],
                tool="uv",
                env=self._env(),
                check=False,
            )
            path = found.stdout.strip()
            if found.returncode != 0 or not path:
                raise ToolNotFound(
                    f"Python {self.python} (for the build venv)",
                    hint="install that Python (apt-get install python3) or change [python] version",
                )
            self._interpreter = path
        return self._interpreter

    def probe(self, *, cuda: bool) -> Toolchain:
        python = proc.run(
            [self.interpreter(), "-c", "import platform; print(platform.python_version())"],
            tool="python",
            env=self._env(),
        ).stdout.strip()
        compilers = {
            "gcc": compiler_version(self.base_env.get("CC", "gcc"), env=self.base_env),
            "g++": compiler_version(self.base_env.get("CXX", "g++"), env=self.base_env),
        }
        nvcc = None
        if cuda:
            found = find_nvcc(env=self.base_env)
            assert found is not None
            nvcc = nvcc_info(found)
            check_toolkit(nvcc)
            compilers["nvcc"] = nvcc.version
        return Toolchain(python=python, compilers=compilers, nvcc=nvcc)

    def build(self, job: BuildJob) -> BuildOutcome:
        uv = proc.find_uv()
        blog = _Log()
        venv = job.work_dir / "venv"
        env = self._env()

        def step(argv: list[str | proc.Secret], run_env: Mapping[str, str]) -> bool:
            done = proc.run(argv, tool="uv", env=run_env, stream=True, check=False)
            blog.command(argv, done)
            return done.returncode == 0

        if not step(
            [uv, "venv", "--quiet", f"--python={self.interpreter()}", "--", str(venv)], env
        ):
            return BuildOutcome(1, blog.text(), None)
        python = str(venv / "bin" / "python")
        install: list[str | proc.Secret] = [uv, "pip", "install", "--python", python]
        if job.constraints:
            constraints = job.work_dir / "constraints.txt"
            constraints.write_text("\n".join(job.constraints) + "\n")
            install += ["--constraint", str(constraints)]
        if job.exclude_newer:
            install.append(f"--exclude-newer={job.exclude_newer}")
        if job.index_url:
            install += proc.option("--index-url", self._expand(job.index_url))
        for url in job.extra_index_urls:
            install += proc.option("--extra-index-url", self._expand(url))
        if job.requires and not step([*install, "--", *job.requires], env):
            return BuildOutcome(1, blog.text(), None)
        build_env = self._build_env(job, venv)
        argv: list[str | proc.Secret] = [
            uv,
            "build",
            "--wheel",
            "--no-build-isolation",
            "--python",
            python,
            "--out-dir",
            str(job.out_dir),
            str(job.sdist),
        ]
        done = proc.run(
            argv,
            tool="uv build",
            env=build_env,
            stream=True,
            check=False,
            on_line=NinjaProgress(f"{job.dist} {job.version}"),
        )
        blog.command(argv, done)
        wheels = sorted(job.out_dir.glob("*.whl"))
        wheel = wheels[0] if done.returncode == 0 and len(wheels) == 1 else None
        return BuildOutcome(done.returncode, blog.text(), wheel)

    def _expand(self, url: str | proc.Secret) -> str | proc.Secret:
        """An index URL with ``${NAME}`` references filled from the environment, as a Secret."""
        if isinstance(url, proc.Secret) or not _REF.search(url):
            return url
        return proc.Secret(_REF.sub(lambda m: self.base_env.get(m.group(1), ""), url))

    def _build_env(self, job: BuildJob, venv: Path) -> dict[str, str]:
        """The build's environment: the flags, SOURCE_DATE_EPOCH, and, when there is an nvcc,
        ``CUDA_HOME`` made for this build
        (:func:`envbuild.sourcebuild.toolchain.assemble_cuda_home`: the
        toolkit plus the venv's NVIDIA wheels' headers and libraries) with its ``bin`` first on
        PATH."""
        extra = dict(job.env)
        extra["SOURCE_DATE_EPOCH"] = SOURCE_DATE_EPOCH
        nvcc = find_nvcc(required=False, env=self.base_env)
        env = self._env(extra)
        if nvcc is not None:
            toolkit = Path(toolkit_home(nvcc))
            home = assemble_cuda_home(
                toolkit, sorted(venv.glob("lib/python*/site-packages")), job.work_dir / "cuda"
            )
            env["CUDA_HOME"] = str(home)
            env["PATH"] = str(home / "bin") + os.pathsep + env.get("PATH", "")
        return env


_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NINJA = re.compile(r"^\[(\d+)/(\d+)\] ")


class NinjaProgress:
    """Reads a build's output line by line and logs ninja's ``[n/N]`` lines (torch's
    cpp_extension builds with ``ninja -v``; in a pipe ninja prints one when a compile ends) as
    progress at INFO: ``flash-attn 2.8.3.post2: 12/73 objects compiled (37 min, 3.1 min each
    so far)``. A build that prints nothing for an hour is a build that seems hung."""

    def __init__(self, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.what = what
        self.clock = clock
        self.start = clock()
        self.done = 0
        self.total = 0

    def __call__(self, line: str) -> None:
        m = _NINJA.match(line)
        if not m:
            return
        n, total = int(m.group(1)), int(m.group(2))
        if n <= self.done and total == self.total:
            return
        self.done, self.total = n, total
        minutes = (self.clock() - self.start) / 60
        log.info(
            "%s: %d/%d objects compiled (%.0f min, %.1f min each so far)",
            self.what,
            n,
            total,
            minutes,
            minutes / n,
        )


# --- recognising how a build failed ----------------------------------------------------------

_KILLED = re.compile(
    r"\bKilled\b|signal 9\b|SIGKILL|Kill signal|out of memory|Cannot allocate memory|"
    r"std::bad_alloc|virtual memory exhausted",
    re.IGNORECASE,
)
_BAD_ARCH = re.compile(r"Unsupported gpu architecture '([^']+)'")


def was_killed(outcome: BuildOutcome) -> bool:
    """A build killed by the kernel (the OOM killer's SIGKILL) or out of memory."""
    return outcome.returncode in (-9, 137) or bool(_KILLED.search(_tail(outcome.log, 200)))


def unsupported_arch(outcome: BuildOutcome) -> str | None:
    m = _BAD_ARCH.search(outcome.log)
    return m.group(1) if m else None


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def which_in(name: str, env: Mapping[str, str]) -> str | None:
    return shutil.which(name, path=env.get("PATH"))
