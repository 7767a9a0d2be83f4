"""Preflight: does the spec fit this machine, and may apply go ahead? Every check runs, and the
whole report comes back at once, before anything changes.

:func:`run_preflight` takes the probe, the paths and a :class:`PreflightInput` (what apply found
out before: the units running, the source builds missing, the secrets unset, the generation's
vLLM and link check when it exists) and returns a :class:`~envbuild.apply.checks.PreflightReport`.
The machine's own checks (driver, GPUs, disk, toolkit) are in :mod:`envbuild.apply.hostchecks`;
here are those about apply's inputs and what it would stop. A failed check is either a *fit*
problem (the spec asks for another machine: driver, GPUs) — exit 2 — or an *environment* problem
(memory held, disk, toolkit, secrets) — exit 3.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from envbuild.apply import hostchecks
from envbuild.apply.checks import Check, Kind, PreflightReport, Status, gib
from envbuild.apply.paths import Paths
from envbuild.apply.probe import GpuProcess, HostProbe
from envbuild.spec.model import Spec


@dataclass(frozen=True)
class LinkResult:
    """What the link check said of a generation's venv (envbuild.linkcheck.core.Report, reduced)."""

    generation: int
    checked: int  # ELF files looked at
    findings: list[tuple[str, str]]  # (id, line) of each finding the spec does not accept
    accepted: int = 0  # findings the spec accepts in [image.link_findings]


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


def run_preflight(probe: HostProbe, paths: Paths, given: PreflightInput) -> PreflightReport:
    """Every check, in the order the report shows them: the driver and GPUs, a switch cut short,
    who holds GPU memory and which units stop, the model's revisions, the unit's command, the
    link check, disk, toolkit, Python and secrets."""
    spec = given.spec
    report = PreflightReport()
    add = report.checks.extend

    state = hostchecks.probe_gpus(probe, spec)
    add(hostchecks.driver_checks(spec, state, probe, given.packages))
    add(hostchecks.gpu_checks(spec, state))
    add(_earlier_notes(given))
    checks, report.stop_units = _gpu_memory_checks(given, state.processes)
    add(checks)
    add(_unit_checks(given, report.stop_units))
    add(_model_revision_checks(given))
    if given.unit is not None:
        add([_vllm_args_check(given.vllm_args)])
    add([_links_check(given.links)])
    add(hostchecks.disk_checks(spec, paths, probe))
    add(hostchecks.build_checks(spec, given.builds_missing, probe))
    add(_python_and_secrets(given))
    return report


def _earlier_notes(given: PreflightInput) -> list[Check]:
    """What earlier applies left: a switch cut short, generations modified after their build."""
    out: list[Check] = []
    if given.pending:
        out.append(
            Check(
                "journal",
                Status.WARN,
                f"a switch was cut short ({given.pending}): apply undoes it first",
            )
        )
    for number, problems in given.rejected:
        out.append(
            Check(
                "generation",
                Status.WARN,
                f"generation {number} has these inputs but was modified after it was built "
                f"({'; '.join(problems[:3])}): a fresh generation will be built",
            )
        )
    return out


def _gpu_memory_checks(
    given: PreflightInput, processes: list[GpuProcess] | None
) -> tuple[list[Check], list[str]]:
    """Who holds GPU memory, and the units apply would stop (sorted): envbuild's other running
    units and the units of processes holding GPU memory."""
    out: list[Check] = []
    stop: set[str] = {u for u in given.running_units if u not in given.keep_units}
    up_to_date = given.unit is not None and given.unit in given.keep_units
    if processes and up_to_date:
        # The generation is current and its unit runs: nothing is switched, nothing stopped.
        others = [p for p in processes if p.unit not in given.keep_units]
        out.append(
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
            out.append(
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
            out.append(
                Check(
                    "gpu-memory",
                    Status.OK if given.agreed else Status.FAIL,
                    "GPU memory is held by " + "; ".join(_who(p) for p in held),
                    None if given.agreed else "rerun with --yes to let envbuild stop their units",
                )
            )
    elif processes is not None:
        out.append(Check("gpu-memory", Status.OK, "no process holds GPU memory"))
    return out, sorted(stop)


def _who(p: GpuProcess) -> str:
    unit = f", unit {p.unit}" if p.unit else ""
    return f"pid {p.pid} ({p.command}) {gib(p.used_bytes)} on GPU {p.gpu}{unit}"


def _unit_checks(given: PreflightInput, stop_units: list[str]) -> list[Check]:
    """Whether the units to stop may be stopped (--yes), and whether the new one will start."""
    out: list[Check] = []
    if stop_units:
        if not given.can_start:
            out.append(
                Check(
                    "units",
                    Status.WARN,
                    f"running units {', '.join(stop_units)} are not stopped: "
                    + given.services_note,
                )
            )
        elif given.agreed:
            out.append(Check("units", Status.OK, f"will stop {', '.join(stop_units)} (--yes)"))
        else:
            out.append(
                Check(
                    "units",
                    Status.FAIL,
                    f"apply would stop the running unit(s) {', '.join(stop_units)}",
                    "rerun with --yes to agree",
                )
            )
    if given.unit and not given.can_start:
        out.append(
            Check(
                "service",
                Status.WARN,
                f"{given.unit} will be installed, not started: " + given.services_note,
            )
        )
    return out


def _model_revision_checks(given: PreflightInput) -> list[Check]:
    """Each model repo pinned to the all-zero placeholder fails: its download would."""
    out = [
        Check(
            "model-revision",
            Status.FAIL,
            f"{where}: {key} is the all-zero placeholder, not a commit of {repo}: the "
            "download would fail after the generation is built",
            f"put the commit sha from https://huggingface.co/{repo}/commits/main there",
            Kind.FIT,
        )
        for where, key, repo in given.placeholders
    ]
    model = given.spec.model
    if model is not None and not given.placeholders:
        out.append(Check("model-revision", Status.OK, f"{model.repo} is pinned to a commit"))
    return out


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


def _python_and_secrets(given: PreflightInput) -> list[Check]:
    """An interpreter for the venv, and the environment variables the unit's secrets need."""
    spec = given.spec
    out: list[Check] = []
    if given.python is None:
        out.append(
            Check(
                "python",
                Status.FAIL,
                f"no Python {spec.python.version} on this machine for the venv",
                f"install Python {spec.python.version} (uv looks on PATH and in its own "
                "installs; downloads are off)",
            )
        )
    else:
        out.append(Check("python", Status.OK, f"Python {spec.python.version}: {given.python}"))
    if given.secrets_missing:
        out.append(
            Check(
                "secrets",
                Status.FAIL,
                f"the unit's secrets need {', '.join(given.secrets_missing)} in the environment",
                "export them before running envbuild (they go only into a 0600 file)",
            )
        )
    return out
