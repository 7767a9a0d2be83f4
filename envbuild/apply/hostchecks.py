"""Preflight's checks of the machine itself: its driver and the CUDA it runs, its GPUs (models,
count, enough of them for the parallelism), disk for the model, and a CUDA toolkit for the source
builds that must be compiled. Each takes what :class:`~envbuild.apply.probe.HostProbe` says and
returns the report's lines; :func:`envbuild.apply.preflight.run_preflight` puts them in order.
"""

from __future__ import annotations

from dataclasses import dataclass

from envbuild.apply.checks import Check, Kind, Status, gib
from envbuild.apply.modelcache import cached_bytes
from envbuild.apply.paths import Paths
from envbuild.apply.probe import Gpu, GpuProcess, HostProbe
from envbuild.errors import EnvironmentFailure
from envbuild.spec import knowledge as kb
from envbuild.spec.model import Spec


@dataclass(frozen=True)
class GpuState:
    """What the probe said of the driver and the GPUs. All None when the spec asks for neither;
    ``error`` when the probe failed (what it read before the failure is kept)."""

    driver: str | None = None
    gpus: list[Gpu] | None = None
    processes: list[GpuProcess] | None = None
    error: str | None = None


def probe_gpus(probe: HostProbe, spec: Spec) -> GpuState:
    """The driver, the GPUs and who holds their memory, when the spec has [host] or [serve]."""
    if spec.host is None and spec.serve is None:
        return GpuState()
    gpus: list[Gpu] | None = None
    try:
        driver = probe.driver_version()
        gpus = probe.gpus()
        processes = probe.gpu_processes()
    except EnvironmentFailure as exc:
        return GpuState(gpus=gpus, error=exc.message)
    return GpuState(driver, gpus, processes)


def driver_checks(
    spec: Spec, state: GpuState, probe: HostProbe, packages: list[tuple[str, str]]
) -> list[Check]:
    """The driver the spec pins, and (when it is the one) whether the lock's run-time compilers
    emit PTX it can load."""
    out: list[Check] = []
    if spec.host is None:
        out.append(
            Check("driver", Status.SKIP, "the spec has no [host]: driver and GPUs not checked")
        )
    elif state.error is not None:
        out.append(Check("driver", Status.FAIL, state.error, "install the driver the spec pins"))
    elif state.driver != spec.host.driver:
        out.append(
            Check(
                "driver",
                Status.FAIL,
                f"the driver is {state.driver}, the spec pins {spec.host.driver}",
                "install the pinned driver (`envbuild render host-setup SPEC`), or pin "
                f"host.driver = {state.driver!r} in the spec if this machine is right",
                Kind.FIT,
            )
        )
    else:
        out.append(Check("driver", Status.OK, f"driver {state.driver}"))

    if spec.host is not None and state.driver == spec.host.driver:
        newer = _jit_check(probe.cuda_driver_version(), packages)
        if newer is not None:
            out.append(newer)
    return out


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


def gpu_checks(spec: Spec, state: GpuState) -> list[Check]:
    """The GPUs [host.gpus] names, and enough of them for [serve]'s parallelism."""
    out: list[Check] = []
    gpus = state.gpus
    if spec.host is not None and gpus is not None:
        out.append(_gpu_check(spec, gpus))
    if spec.serve is not None and gpus is not None:
        need = spec.serve.tensor_parallel_size * spec.serve.pipeline_parallel_size
        if need > len(gpus):
            out.append(
                Check(
                    "parallelism",
                    Status.FAIL,
                    f"[serve] needs {need} GPUs (tensor {spec.serve.tensor_parallel_size} x "
                    f"pipeline {spec.serve.pipeline_parallel_size}); this machine has {len(gpus)}",
                    "lower serve.tensor_parallel_size",
                    Kind.FIT,
                )
            )
    return out


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


def disk_checks(spec: Spec, paths: Paths, probe: HostProbe) -> list[Check]:
    """Room in the Hugging Face cache for what of the model is not there yet."""
    if spec.model is None:
        return []
    have = cached_bytes(paths.hf_hub_cache, spec.model)
    need = max(int(spec.model.size_gb * 1e9) - have, 0)
    free = probe.free_bytes(paths.hf_hub_cache)
    where = f"{paths.hf_hub_cache} ({gib(free)} free)"
    if need == 0:
        return [Check("disk", Status.OK, f"{spec.model.repo} is already in {paths.hf_hub_cache}")]
    if free < need:
        return [
            Check(
                "disk",
                Status.FAIL,
                f"{spec.model.repo} needs {gib(need)} more in {where}",
                "free disk space there, or put the cache elsewhere with --hf-home",
            )
        ]
    return [Check("disk", Status.OK, f"{gib(need)} to fetch into {where}")]


def build_checks(spec: Spec, builds_missing: dict[str, bool], probe: HostProbe) -> list[Check]:
    """The source builds that will be compiled (``builds_missing``: dist -> needs nvcc), and an
    nvcc of the spec's CUDA major for those that need one."""
    out: list[Check] = []
    plain = [dist for dist, cuda in sorted(builds_missing.items()) if not cuda]
    if plain:
        out.append(
            Check("builds", Status.OK, f"{', '.join(plain)}: not in the store, will be compiled")
        )
    cuda_builds = [dist for dist, cuda in sorted(builds_missing.items()) if cuda]
    if not cuda_builds:
        return out
    toolkit = probe.cuda_toolkit()
    names = ", ".join(cuda_builds)
    want = spec.cuda.version if spec.cuda else None
    if toolkit is None:
        out.append(
            Check(
                "toolkit",
                Status.FAIL,
                f"{names} must be built from source and no CUDA toolkit (nvcc) was found",
                "install the toolkit (`envbuild render host-setup SPEC`) or set CUDA_HOME",
            )
        )
    elif want and toolkit.version.split(".")[0] != want.split(".")[0]:
        out.append(
            Check(
                "toolkit",
                Status.FAIL,
                f"nvcc {toolkit.version} ({toolkit.nvcc}) cannot build for CUDA {want}",
                f"install CUDA {want} and point CUDA_HOME at it",
            )
        )
    else:
        out.append(Check("toolkit", Status.OK, f"nvcc {toolkit.version} will build {names}"))
    return out
