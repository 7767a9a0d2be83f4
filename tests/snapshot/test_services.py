"""Secrets never reach a manifest; systemd, Docker and CUDA parts degrade or report cleanly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from envbuild.engine import DockerEngine
from envbuild.snapshot.core import Options, take_snapshot
from envbuild.snapshot.cuda import read_toolkits
from envbuild.snapshot.docker import read_docker
from envbuild.snapshot.redact import Redactor
from envbuild.snapshot.systemd import parse_show, read_units, running, to_service

HF = "hf_" + "a1B2c3D4" * 5
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpM"

#: `systemctl show -p Id,…,ExecStart,Environment vllm-glm5.service` as systemd 252 prints it.
SHOW = f"""Id=vllm-glm5.service
LoadState=loaded
ActiveState=active
SubState=running
UnitFileState=enabled
FragmentPath=/etc/systemd/system/vllm-glm5.service
ExecStart={{ path=/opt/venv/bin/vllm ; argv[]=/opt/venv/bin/vllm serve zai/GLM-5 \
--api-key sk-{"x" * 24} --port 8000 ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; \
pid=0 ; code=(null) ; status=0/0 }}
Environment=HF_TOKEN={HF} CUDA_VISIBLE_DEVICES=0,1 "PROXY=https://bob:hunter2@proxy:3128" \
VLLM_LOGGING_LEVEL=INFO

"""


def test_a_unit_is_recorded_with_its_secrets_redacted() -> None:
    redactor = Redactor()
    [block] = parse_show(SHOW)
    unit = to_service(block, redactor)
    assert (unit.unit, unit.active_state, unit.sub_state) == (
        "vllm-glm5.service",
        "active",
        "running",
    )
    assert unit.exec_start == ["/opt/venv/bin/vllm", "serve", "zai/GLM-5", "--api-key", "***",
                               "--port", "8000"]  # fmt: skip
    assert unit.environment == {
        "HF_TOKEN": "***",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "PROXY": "https://bob:***@proxy:3128",
        "VLLM_LOGGING_LEVEL": "INFO",
    }
    assert sorted(redactor.fields) == [
        "systemd.units[vllm-glm5.service].environment.HF_TOKEN",
        "systemd.units[vllm-glm5.service].environment.PROXY",
        "systemd.units[vllm-glm5.service].exec_start",
    ]
    assert HF not in unit.model_dump_json() and "hunter2" not in unit.model_dump_json()


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["--hf-token=" + HF], ["--hf-token=***"]),
        (["--token", "abc", "--model", "m"], ["--token", "***", "--model", "m"]),
        (["echo", f"x{HF}"], ["echo", "x" + HF]),  # not at a word boundary: not a token shape
        (["echo", HF], ["echo", "***"]),
        (["curl", "-H", f"Authorization: Bearer {JWT}"],
         ["curl", "-H", "Authorization: Bearer ***"]),
    ],
)  # fmt: skip
def test_redact_argv(argv: list[str], shown: list[str]) -> None:
    assert Redactor().argv("x", argv) == shown


def test_without_systemd_the_section_says_so() -> None:
    if running():
        pytest.skip("systemd runs here")
    section = read_units("vllm*", Redactor())
    assert (section.available, section.reason) == (False, "systemd is not running")


def test_without_a_docker_engine_the_section_says_so(tmp_path: Path) -> None:
    section = read_docker(Redactor(), DockerEngine(f"unix://{tmp_path}/no.sock"))
    assert section.available is False
    assert section.reason is not None and section.reason.startswith("no Docker engine")


def test_cuda_toolkits_are_found_with_their_versions(tmp_path: Path) -> None:
    found = read_toolkits()
    nvcc = [t for t in found if Path(t.path).name == "nvcc"]
    if not nvcc:
        pytest.skip("no nvcc on this machine")
    for t in nvcc:
        assert t.version.count(".") == 1 and t.build and t.build.startswith(t.version)
    # a script that is not nvcc is passed over, not an error
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho hello\n")
    fake.chmod(0o755)
    assert read_toolkits([str(fake)]) == []


def test_the_spec_and_its_hash_are_recorded(cli: Any, tmp_path: Path) -> None:
    from envbuild.spec import load_spec

    spec = Path(__file__).resolve().parents[2] / "specs" / "quickstart.toml"
    if not spec.is_file():
        pytest.skip("no quickstart spec")
    snap = take_snapshot(
        Options(spec=str(spec), docker=False, systemd=False, models=False, cuda=False)
    )
    assert snap.spec is not None
    assert snap.spec.spec_hash == load_spec(spec).spec_hash()
    assert snap.spec.name == load_spec(spec).name
    out = tmp_path / "s.json"
    assert (
        cli(
            "snapshot", "--spec", spec, "--no-docker", "--no-systemd", "--no-models", "-o", out
        ).exit_code
        == 0
    )
    assert json.loads(out.read_text())["spec"]["spec_hash"] == snap.spec.spec_hash
