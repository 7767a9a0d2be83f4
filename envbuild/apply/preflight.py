"""Preflight: does the spec fit this machine, and may apply go ahead? Every check runs, and the
whole report comes back at once, before anything changes.

A failed check is either a *fit* problem (the spec asks for another machine: driver, GPUs) —
exit 2 — or an *environment* problem (memory held, disk, toolkit, secrets) — exit 3.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from envbuild.apply.modelcache import cached_bytes
from envbuild.apply.paths import Paths
from envbuild.apply.probe import Gpu, GpuProcess, HostProbe
from envbuild.errors import EnvironmentFailure, ExitCode
from envbuild.spec import knowledge as kb
from envbuild.spec.model import Spec

GIB = 1 << 30


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"


class Kind(StrEnum):
    FIT = "fit"  # the spec does not fit this machine (exit 2)
    ENVIRONMENT = "environment"  # the machine is not ready (exit 3)


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    message: str
    hint: str | None = None
    kind: Kind = Kind.ENVIRONMENT

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status.value,
            "message": self.message,
            "hint": self.hint,
            "kind": self.kind.value,
        }


@dataclass
class PreflightReport:
    checks: list[Check] = field(default_factory=list)
    #: Units apply will stop (the user must agree with --yes).
    stop_units: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status is Status.FAIL]

    @property
    def exit_code(self) -> int:
        if not self.failures:
            return ExitCode.OK
        if any(c.kind is Kind.FIT for c in self.failures):
            return ExitCode.USER_ERROR
        return ExitCode.ENVIRONMENT

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "exit_code": self.exit_code,
            "checks": [c.as_dict() for c in self.checks],
            "stop_units": self.stop_units,
        }


@dataclass(frozen=True)
class PreflightInput:
    """What preflight is told besides the spec."""

    spec: Spec
    unit: str | None  # the unit this apply will run
    keep_units: frozenset[str]  # units that stay as they are (an up-to-date apply)
    running_units: list[str]  # envbuild's units that are running now
    builds_missing: dict[str, bool]  # source builds that will be compiled -> needs nvcc
    secrets_missing: list[str]  # environment variables the unit's secrets need
    python: str | None  # the interpreter uv found for the spec's Python, None if none
    agreed: bool  # --yes
    can_start: bool  # a service manager will start the unit
    services_note: str = ""
    #: Generations with these very inputs that were modified after their build: (number, problems)
    rejected: list[tuple[int, list[str]]] = field(default_factory=list)
    #: A switch that was cut short, which apply undoes first (said by a dry run, which does not).
    pending: str | None = None
    #: The locked packages, (name, version): some compile GPU code at run time.
    packages: list[tuple[str, str]] = field(default_factory=list)
    #: Model repos pinned to the all-zero placeholder: (where in the spec, dotted key, repo).
    placeholders: list[tuple[str, str, str]] = field(default_factory=list)
    #: vLLM's own parser on the unit's command, when the generation exists already: (accepted,
    #: its error); accepted is None when the parser could not be loaded.
    vllm_args: tuple[bool | None, str | None] | None = None
    #: The link check of the generation's venv, when the generation exists already.
    links: LinkResult | None = None


@dataclass(frozen=True)
class LinkResult:
    """What the link check said of a generation's venv (envbuild.linkcheck.Report, reduced)."""

    generation: int
    checked: int  # ELF files looked at
    findings: list[tuple[str, str]]  # (id, line) of each finding the spec does not accept
    accepted: int = 0  # findings the spec accepts in [image.link_findings]


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def run_preflight(probe: HostProbe, paths: Paths, given: PreflightInput) -> PreflightReport:
    spec = given.spec
    report = PreflightReport()
    add = report.checks.append

    gpus: list[Gpu] | None = None
    processes: list[GpuProcess] | None = None
    gpu_error: str | None = None
    if spec.host is not None or spec.serve is not None:
        try:
            driver = probe.driver_version()
            gpus = probe.gpus()
            processes = probe.gpu_processes()
        except EnvironmentFailure as exc:
            gpu_error = exc.message
            driver = None
    else:
        driver = None

    # -- driver ------------------------------------------------------------------------------
    if spec.host is None:
        add(Check("driver", Status.SKIP, "the spec has no [host]: driver and GPUs not checked"))
    elif gpu_error is not None:
        add(Check("driver", Status.FAIL, gpu_error, "install the driver the spec pins"))
    elif driver != spec.host.driver:
        add(
            Check(
                "driver",
                Status.FAIL,
                f"the driver is {driver}, the spec pins {spec.host.driver}",
                "install the pinned driver (`envbuild render host-setup SPEC`), or pin "
                f"host.driver = {driver!r} in the spec if this machine is right",
                Kind.FIT,
            )
        )
    else:
        add(Check("driver", Status.OK, f"driver {driver}"))

    if spec.host is not None and driver == spec.host.driver:
        newer = _jit_check(probe.cuda_driver_version(), given.packages)
        if newer is not None:
            add(newer)

    # -- GPUs --------------------------------------------------------------------------------
    if spec.host is not None and gpus is not None:
        add(_gpu_check(spec, gpus))
    if spec.serve is not None and gpus is not None:
        need = spec.serve.tensor_parallel_size * spec.serve.pipeline_parallel_size
        if need > len(gpus):
            add(
                Check(
                    "parallelism",
                    Status.FAIL,
                    f"[serve] needs {need} GPUs (tensor {spec.serve.tensor_parallel_size} x "
                    f"pipeline {spec.serve.pipeline_parallel_size}); this machine has {len(gpus)}",
                    "lower serve.tensor_parallel_size",
                    Kind.FIT,
                )
            )

    if given.pending:
        add(
            Check(
                "journal",
                Status.WARN,
                f"a switch was cut short ({given.pending}): apply undoes it first",
            )
        )
    for number, problems in given.rejected:
        add(
            Check(
                "generation",
                Status.WARN,
                f"generation {number} has these inputs but was modified after it was built "
                f"({'; '.join(problems[:3])}): a fresh generation will be built",
            )
        )

    # -- who holds GPU memory, which units stop ----------------------------------------------
    stop: set[str] = {u for u in given.running_units if u not in given.keep_units}
    up_to_date = given.unit is not None and given.unit in given.keep_units
    if processes and up_to_date:
        # The generation is current and its unit runs: nothing is switched, nothing stopped.
        others = [p for p in processes if p.unit not in given.keep_units]
        add(
            Check(
                "gpu-memory",
                Status.OK,
                f"{given.unit} runs this generation already"
                + ("; also held by " + "; ".join(_who(p) for p in others) if others else ""),
            )
        )
    elif processes:
        foreign = [p for p in processes if p.unit not in given.keep_units]
        loose = [p for p in foreign if p.unit is None]
        stop |= {p.unit for p in foreign if p.unit is not None}
        if loose:
            add(
                Check(
                    "gpu-memory",
                    Status.FAIL,
                    "GPU memory is held by processes outside any systemd unit: "
                    + "; ".join(_who(p) for p in loose),
                    "stop them yourself; envbuild stops only systemd units",
                )
            )
        held = [p for p in foreign if p.unit is not None]
        if held:
            add(
                Check(
                    "gpu-memory",
                    Status.OK if given.agreed else Status.FAIL,
                    "GPU memory is held by " + "; ".join(_who(p) for p in held),
                    None if given.agreed else "rerun with --yes to let envbuild stop their units",
                )
            )
    elif processes is not None:
        add(Check("gpu-memory", Status.OK, "no process holds GPU memory"))
    report.stop_units = sorted(stop)
    if report.stop_units:
        if not given.can_start:
            add(
                Check(
                    "units",
                    Status.WARN,
                    f"running units {', '.join(report.stop_units)} are not stopped: "
                    + given.services_note,
                )
            )
        elif given.agreed:
            add(Check("units", Status.OK, f"will stop {', '.join(report.stop_units)} (--yes)"))
        else:
            add(
                Check(
                    "units",
                    Status.FAIL,
                    f"apply would stop the running unit(s) {', '.join(report.stop_units)}",
                    "rerun with --yes to agree",
                )
            )
    if given.unit and not given.can_start:
        add(
            Check(
                "service",
                Status.WARN,
                f"{given.unit} will be installed, not started: " + given.services_note,
            )
        )

    # -- the model's revisions ---------------------------------------------------------------
    for where, key, repo in given.placeholders:
        add(
            Check(
                "model-revision",
                Status.FAIL,
                f"{where}: {key} is the all-zero placeholder, not a commit of {repo}: the "
                "download would fail after the generation is built",
                f"put the commit sha from https://huggingface.co/{repo}/commits/main there",
                Kind.FIT,
            )
        )
    if spec.model is not None and not given.placeholders:
        add(Check("model-revision", Status.OK, f"{spec.model.repo} is pinned to a commit"))

    # -- the unit's command, parsed by the generation's vLLM -----------------------------------
    if given.unit is not None:
        add(_vllm_args_check(given.vllm_args))

    # -- the link check of the generation's venv -----------------------------------------------
    add(_links_check(given.links))

    # -- disk for the model ------------------------------------------------------------------
    if spec.model is not None:
        have = cached_bytes(paths.hf_hub_cache, spec.model)
        need = max(int(spec.model.size_gb * 1e9) - have, 0)
        free = probe.free_bytes(paths.hf_hub_cache)
        where = f"{paths.hf_hub_cache} ({_gib(free)} free)"
        if need == 0:
            add(Check("disk", Status.OK, f"{spec.model.repo} is already in {paths.hf_hub_cache}"))
        elif free < need:
            add(
                Check(
                    "disk",
                    Status.FAIL,
                    f"{spec.model.repo} needs {_gib(need)} more in {where}",
                    "free disk space there, or put the cache elsewhere with --hf-home",
                )
            )
        else:
            add(Check("disk", Status.OK, f"{_gib(need)} to fetch into {where}"))

    # -- CUDA toolkit for source builds ------------------------------------------------------
    plain = [dist for dist, cuda in sorted(given.builds_missing.items()) if not cuda]
    if plain:
        add(Check("builds", Status.OK, f"{', '.join(plain)}: not in the store, will be compiled"))
    if cuda_builds := [dist for dist, cuda in sorted(given.builds_missing.items()) if cuda]:
        toolkit = probe.cuda_toolkit()
        names = ", ".join(cuda_builds)
        want = spec.cuda.version if spec.cuda else None
        if toolkit is None:
            add(
                Check(
                    "toolkit",
                    Status.FAIL,
                    f"{names} must be built from source and no CUDA toolkit (nvcc) was found",
                    "install the toolkit (`envbuild render host-setup SPEC`) or set CUDA_HOME",
                )
            )
        elif want and toolkit.version.split(".")[0] != want.split(".")[0]:
            add(
                Check(
                    "toolkit",
                    Status.FAIL,
                    f"nvcc {toolkit.version} ({toolkit.nvcc}) cannot build for CUDA {want}",
                    f"install CUDA {want} and point CUDA_HOME at it",
                )
            )
        else:
            add(Check("toolkit", Status.OK, f"nvcc {toolkit.version} will build {names}"))

    # -- Python and secrets ------------------------------------------------------------------
    if given.python is None:
        add(
            Check(
                "python",
                Status.FAIL,
                f"no Python {spec.python.version} on this machine for the venv",
                f"install Python {spec.python.version} (uv looks on PATH and in its own "
                "installs; downloads are off)",
            )
        )
    else:
        add(Check("python", Status.OK, f"Python {spec.python.version}: {given.python}"))
    if given.secrets_missing:
        add(
            Check(
                "secrets",
                Status.FAIL,
                f"the unit's secrets need {', '.join(given.secrets_missing)} in the environment",
                "export them before running envbuild (they go only into a 0600 file)",
            )
        )
    return report


def _vllm_args_check(parsed: tuple[bool | None, str | None] | None) -> Check:
    if parsed is None:
        return Check(
            "vllm-args",
            Status.SKIP,
            "the generation is not built yet: its vLLM parses the unit's command before the switch",
        )
    ok, error = parsed
    if ok:
        return Check("vllm-args", Status.OK, "the generation's vLLM accepts the unit's command")
    if ok is None:
        return Check(
            "vllm-args", Status.WARN, f"vLLM's argument parser could not be loaded: {error}"
        )
    return Check(
        "vllm-args",
        Status.FAIL,
        f"the generation's vLLM refuses the unit's command: {error}",
        "fix serve.extra_args (or the [serve] / [model] keys)",
        Kind.FIT,
    )


def _links_check(links: LinkResult | None) -> Check:
    if links is None:
        return Check(
            "links",
            Status.SKIP,
            "the generation is not built yet: the link check runs on its venv after the build, "
            "before the switch",
        )
    accepted = f" ({links.accepted} accepted by the spec)" if links.accepted else ""
    if not links.findings:
        return Check(
            "links",
            Status.OK,
            f"generation {links.generation}: its {links.checked} ELF files load{accepted}",
        )
    count = len(links.findings)
    ids = sorted({i for i, _ in links.findings})
    return Check(
        "links",
        Status.FAIL,
        f"generation {links.generation}: {count} file{'s' if count != 1 else ''} will not "
        f"load{accepted}: " + "; ".join(line for _, line in links.findings),
        "fix the distributions named (a build for this torch and CUDA), or accept each by its "
        "id in [image.link_findings] with the reason: " + ", ".join(f'"{i}"' for i in ids),
        Kind.FIT,
    )


def _jit_check(cuda: str | None, packages: list[tuple[str, str]]) -> Check | None:
    """A warning when the lock's run-time compilers come from a CUDA newer than the driver's:
    the driver cannot load PTX newer than its own CUDA (CUDA minor version compatibility runs
    the rest). SASS for the GPU's architecture still loads, so this does not stop apply."""
    newer = kb.newer_run_time_compilers(cuda, packages) if cuda else []
    if not newer:
        return None
    return Check(
        "cuda-jit",
        Status.WARN,
        f"the lock's run-time compilers ({', '.join(newer)}) are newer than CUDA {cuda}, the "
        "newest this driver runs: PTX they emit cannot be loaded (CUDA_ERROR_UNSUPPORTED_PTX_"
        "VERSION), so kernels compiled at run time to PTX fail; compiled to SASS they load",
        f"pin them to {cuda}.* in the spec's packages and relock, or upgrade the driver",
    )


def _who(p: GpuProcess) -> str:
    unit = f", unit {p.unit}" if p.unit else ""
    return f"pid {p.pid} ({p.command}) {_gib(p.used_bytes)} on GPU {p.gpu}{unit}"


def _gpu_check(spec: Spec, gpus: list[Gpu]) -> Check:
    assert spec.host is not None
    problems = []
    have: dict[str, int] = {}
    names: dict[str, str] = {}
    for gpu in gpus:
        have[kb.gpu_name_key(gpu.name)] = have.get(kb.gpu_name_key(gpu.name), 0) + 1
        names[kb.gpu_name_key(gpu.name)] = gpu.name
    for want in spec.host.gpus:
        key = kb.gpu_name_key(want.model)
        count = have.get(key, 0)
        if count < want.count:
            seen = ", ".join(f"{n} x {names[k]}" for k, n in sorted(have.items())) or "none"
            problems.append(f"the spec wants {want.count} x {want.model}, this machine has {seen}")
    if problems:
        return Check(
            "gpus",
            Status.FAIL,
            "; ".join(problems),
            "run this spec on a machine with those GPUs, or change [host.gpus]",
            Kind.FIT,
        )
    summary = ", ".join(f"{n} x {names[k]}" for k, n in sorted(have.items()))
    return Check("gpus", Status.OK, summary)
