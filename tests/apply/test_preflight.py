"""Preflight reports every problem at once, before anything changes; a spec that does not fit the
machine exits 2, a machine that is not ready exits 3."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from apply.conftest import Experiment, Machine
from support.fakesystemd import FakeNvml

from envbuild.apply.checks import Kind, PreflightReport, Status
from envbuild.apply.paths import Paths
from envbuild.apply.preflight import LinkResult, PreflightInput, run_preflight
from envbuild.apply.probe import SystemProbe, Toolkit
from envbuild.lock.core import lock_spec
from envbuild.spec import load_spec
from envbuild.spec.model import Cuda


def checks(out: dict[str, object]) -> dict[str, tuple[str, str]]:
    pre = out["preflight"]
    assert isinstance(pre, dict)
    return {c["name"]: (c["status"], c["message"]) for c in pre["checks"]}


def untouched(root: Path) -> bool:
    """Nothing apply would write exists under the root."""
    return not any(
        (root / p).exists() for p in ("var/lib/envbuild/generations", "etc/systemd", "etc/envbuild")
    )


def test_a_machine_that_fits_passes_and_dry_run_changes_nothing(
    cli, experiment: Experiment, machine: Machine
) -> None:
    spec = experiment("tiny-a")
    r = cli("apply", spec, "--root", machine.root, "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    got = checks(r.json())
    assert got["driver"] == ("ok", "driver 590.48.01")
    assert got["gpus"] == ("ok", "2 x NVIDIA H200")
    assert got["gpu-memory"] == ("ok", "no process holds GPU memory")
    assert got["disk"][0] == "ok" and "hub" in got["disk"][1]
    assert got["python"][0] == "ok"
    assert got["links"] == (
        "skip",
        "the generation is not built yet: the link check runs on its venv after the build, "
        "before the switch",
    )
    assert r.json()["generation"] is None
    assert sorted(p.name for p in machine.root.iterdir()) == []  # not even the lock file


def test_every_misfit_is_reported_at_once(
    cli, experiment: Experiment, machine: Machine, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine.options.update(
        gpus=1, driver="580.95.05", gpu_name="NVIDIA A100-SXM4-80GB", other_holders=(os.getpid(),)
    )
    monkeypatch.delenv("HF_TOKEN")
    spec = experiment("tiny-a", size_gb=10_000_000.0)
    r = cli("apply", spec, "--root", machine.root, "--json")
    assert r.exit_code == 2  # the spec does not fit: fit problems win over environment ones
    got = checks(r.json())
    assert got["driver"] == ("fail", "the driver is 580.95.05, the spec pins 590.48.01")
    assert got["gpus"][0] == "fail"
    assert "the spec wants 2 x H200, this machine has 1 x NVIDIA A100-SXM4-80GB" in got["gpus"][1]
    assert got["parallelism"][0] == "fail"
    assert got["gpu-memory"][0] == "fail"
    assert f"pid {os.getpid()} (?) 100.0 GiB on GPU 0" in got["gpu-memory"][1]
    assert "outside any systemd unit" in got["gpu-memory"][1]
    assert got["disk"][0] == "fail" and "needs 9313225.7 GiB more" in got["disk"][1]
    assert got["secrets"] == ("fail", "the unit's secrets need HF_TOKEN in the environment")
    kinds = {c["name"]: c["kind"] for c in r.json()["preflight"]["checks"]}
    assert kinds["driver"] == kinds["gpus"] == "fit" and kinds["disk"] == "environment"
    assert untouched(machine.root)

    # the same in text: one line each, with the fix
    r = cli("apply", spec, "--root", machine.root)
    assert r.exit_code == 2
    assert "FAIL  driver      the driver is 580.95.05, the spec pins 590.48.01" in r.stdout
    assert "fix: install the pinned driver (`envbuild render host-setup SPEC`)" in r.stdout
    assert "preflight failed: the spec does not fit this machine; nothing was changed" in r.stdout


def test_environment_problems_alone_exit_3(cli, experiment: Experiment, machine: Machine) -> None:
    spec = experiment("tiny-a", size_gb=10_000_000.0)
    r = cli("apply", spec, "--root", machine.root)
    assert r.exit_code == 3
    assert "FAIL  disk" in r.stdout
    assert "preflight failed: the machine is not ready; nothing was changed" in r.stdout


def test_no_gpu_facts_is_an_environment_failure(
    cli, experiment: Experiment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real probe on this machine (no NVIDIA driver): preflight says why, exit 3."""
    from envbuild.apply import host as hostmod
    from envbuild.apply.host import HostAccess
    from envbuild.apply.services import NoServices

    spec = experiment("tiny-a")
    monkeypatch.setattr(
        hostmod,
        "real_host",
        lambda root, hf_home: HostAccess(Paths(root, hf_home), SystemProbe(), NoServices("test")),
    )
    r = cli("apply", spec, "--root", tmp_path / "r", "--dry-run", "--json")
    if r.json()["preflight"]["checks"][0]["status"] == "ok":
        pytest.skip("this machine has an NVIDIA driver")
    assert r.exit_code == 3
    assert checks(r.json())["driver"][0] == "fail"
    assert "no GPU facts" in checks(r.json())["driver"][1]


class ToolkitProbe(SystemProbe):
    """The real probe with the toolkit answer fixed (CI machines differ in what nvcc they have)."""

    def __init__(self, toolkit: Toolkit | None) -> None:
        super().__init__(FakeNvml())
        self.toolkit = toolkit

    def cuda_toolkit(self) -> Toolkit | None:
        return self.toolkit


@pytest.mark.parametrize(
    ("toolkit", "status", "words"),
    [
        (None, Status.FAIL, "no CUDA toolkit (nvcc) was found"),
        (Toolkit("12.8", "/usr/local/cuda-12.8/bin/nvcc"), Status.FAIL, "cannot build for CUDA"),
        (Toolkit("13.0", "/usr/local/cuda/bin/nvcc"), Status.OK, "nvcc 13.0 will build flashy"),
    ],
)
def test_a_source_build_needs_a_matching_toolkit(
    experiment: Experiment, tmp_path: Path, toolkit: Toolkit | None, status: Status, words: str
) -> None:
    spec = load_spec(experiment("tiny-a", lock=False)).spec
    spec = spec.model_copy(update={"cuda": Cuda(version="13.1")})
    report = run_preflight(
        ToolkitProbe(toolkit),
        Paths(tmp_path),
        PreflightInput(
            spec=spec,
            unit=None,
            keep_units=frozenset(),
            running_units=[],
            builds_missing={"flashy": True},
            secrets_missing=[],
            python="/usr/bin/python3",
            agreed=False,
            can_start=True,
        ),
    )
    [check] = [c for c in report.checks if c.name == "toolkit"]
    assert check.status is status and words in check.message
    assert check.kind is Kind.ENVIRONMENT
    assert report.exit_code == (3 if status is Status.FAIL else 0)


def _preflight(
    spec_path: Path, root: Path, packages: list[tuple[str, str]], links: LinkResult | None = None
) -> PreflightReport:
    return run_preflight(
        SystemProbe(FakeNvml()),  # driver 590.48.01, which runs CUDA 13.1
        Paths(root),
        PreflightInput(
            spec=load_spec(spec_path).spec, unit=None, keep_units=frozenset(), running_units=[],
            builds_missing={}, secrets_missing=[], python="/usr/bin/python3", agreed=False,
            can_start=True, packages=packages, links=links,
        ),
    )  # fmt: skip


def test_link_findings_of_an_existing_generation_are_a_fit_failure(
    experiment: Experiment, tmp_path: Path
) -> None:
    found = [
        ("torchao:symbols", "torchao: …/torchao/_C.abi3.so needs undefined symbols c10::…"),
        ("torchao:libcudart.so.12", "torchao: …/torchao/_C.abi3.so needs libcudart.so.12"),
        ("torchao:symbols", "torchao: …/torchao/_C2.abi3.so needs undefined symbols at::…"),
    ]
    spec = experiment("tiny-a", lock=False)
    report = _preflight(spec, tmp_path, [], LinkResult(3, 812, found, accepted=1))
    [check] = [c for c in report.checks if c.name == "links"]
    assert check.status is Status.FAIL and check.kind is Kind.FIT
    assert check.message.startswith("generation 3: 3 files will not load (1 accepted by the spec)")
    assert all(line in check.message for _, line in found)
    assert check.hint is not None and check.hint.endswith(
        '[image.link_findings] with the reason: "torchao:libcudart.so.12", "torchao:symbols"'
    )
    assert report.exit_code == 2

    report = _preflight(spec, tmp_path, [], LinkResult(3, 812, []))
    [check] = [c for c in report.checks if c.name == "links"]
    assert (check.status, check.message) == (Status.OK, "generation 3: its 812 ELF files load")
    assert report.exit_code == 0


def test_apply_warns_of_the_locks_run_time_compilers(
    cli, experiment: Experiment, machine: Machine
) -> None:
    spec = experiment("jit", lock=False)
    with spec.open("a") as f:
        f.write('\n[packages]\nnvidia-nvjitlink = "==13.5.37"\n')
    lock_spec(load_spec(spec))
    r = cli("apply", spec, "--root", machine.root, "--dry-run", "--json")
    assert r.exit_code == 0, r.stderr
    status, message = checks(r.json())["cuda-jit"]
    assert status == "warn" and "(nvidia-nvjitlink 13.5.37)" in message


def test_run_time_compilers_newer_than_the_driver_are_a_warning(
    experiment: Experiment, tmp_path: Path
) -> None:
    """The seed locks' case: CUDA 13.5 JIT wheels on a driver that runs CUDA 13.1."""
    spec = experiment("tiny-a", lock=False)
    locked = [
        ("nvidia-nvjitlink", "13.5.37"),
        ("nvidia-cuda-nvrtc-cu13", "13.2.51"),
        ("nvidia-cuda-nvcc", "13.1.80"),
        ("nvidia-cublas", "13.5.1.2"),
        ("torch", "2.14.0"),
    ]
    report = _preflight(spec, tmp_path, locked)  # fmt: skip
    [check] = [c for c in report.checks if c.name == "cuda-jit"]
    assert check.status is Status.WARN
    assert "nvidia-nvjitlink 13.5.37, nvidia-cuda-nvrtc-cu13 13.2.51)" in check.message
    assert "newer than CUDA 13.1" in check.message and "PTX" in check.message
    assert check.hint is not None and "13.1.*" in check.hint
    assert report.exit_code == 0  # SASS still loads: apply goes ahead


@pytest.mark.parametrize(
    "locked",
    [[("nvidia-nvjitlink", "13.1.80"), ("nvidia-nvvm", "13.0.88")],
     [("nvidia-cuda-nvrtc-cu12", "12.9.86")],  # another major: not this driver's minor rule
     []],
)  # fmt: skip
def test_run_time_compilers_the_driver_runs_say_nothing(
    experiment: Experiment, tmp_path: Path, locked: list[tuple[str, str]]
) -> None:
    report = _preflight(experiment("tiny-a", lock=False), tmp_path, locked)
    assert [c.name for c in report.checks if c.name == "cuda-jit"] == []


def test_the_placeholder_revision_is_refused_before_anything_is_built(
    cli, experiment: Experiment, machine: Machine
) -> None:
    spec = experiment("tiny-a", revision="0" * 40)
    line = next(i for i, text in enumerate(spec.read_text().splitlines(), 1) if "revision" in text)
    r = cli("apply", spec, "--root", machine.root, "--json")
    assert r.exit_code == 2, r.stderr
    [check] = [c for c in r.json()["preflight"]["checks"] if c["name"] == "model-revision"]
    assert check["status"] == "fail" and check["kind"] == "fit"
    assert check["message"].startswith(f"{spec}:{line}: model.revision is the all-zero")
    assert check["hint"] == (
        "put the commit sha from https://huggingface.co/org/tiny-a/commits/main there"
    )
    assert untouched(machine.root)
    # a pinned one passes the check
    r = cli("apply", experiment("tiny-b"), "--root", machine.root, "--dry-run", "--json")
    assert checks(r.json())["model-revision"][0] == "ok"
