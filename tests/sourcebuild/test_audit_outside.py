"""Libraries whose kernels live outside the fatbin (cuFFT) get the verdict "unknown", never
"cannot run": on the H200, libcufft.so.12's .nv_fatbin read as an sm_75 stub while torch.fft ran
on the GPU (tests/fixtures/h200-capture.log)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from envbuild.sourcebuild.audit import Audit, ObjectAudit, outside_fatbin

LOG = Path(__file__).resolve().parent.parent / "fixtures" / "h200-capture.log"


def h200_cufft() -> list[ObjectAudit]:
    """The audits of cuFFT's files as the H200 run printed them."""
    found = []
    for line in LOG.read_text().splitlines():
        m = re.match(r"(/\S+/(libcufftw?\.so\.\d+)) (\d+) (\{.*\})$", line)
        if m:
            found.append(ObjectAudit.model_validate(ast.literal_eval(m.group(4))))
    return found


def test_the_h200_run_saw_a_stub_fatbin_and_a_working_torch_fft() -> None:
    audits = h200_cufft()
    assert [a.path for a in audits] == ["libcufft.so.12", "libcufftw.so.12"]
    assert all(a.sass == ["sm_75"] and a.ptx == [] for a in audits)
    assert "torch.fft on NVIDIA H200 max err" in LOG.read_text()


@pytest.mark.parametrize("cc", ["9.0", "10.0", "12.0"])
def test_cufft_is_unknown_not_cannot_run(cc: str) -> None:
    for audit in h200_cufft():
        assert audit.verdict(cc) == "unknown"
        assert audit.missing([cc]) == []
        assert audit.code_elsewhere is not None and audit.code_elsewhere.startswith("cuFFT: ")
    whole = Audit(files=h200_cufft())
    assert whole.missing([cc]) == {}
    assert set(whole.unknown()) == {"libcufft.so.12", "libcufftw.so.12"}


def test_other_files_keep_their_verdicts() -> None:
    stub = ObjectAudit(path="flash_attn_2_cuda.cpython-311-x86_64-linux-gnu.so", sass=["sm_75"])
    assert stub.verdict("9.0") == "cannot run"
    assert stub.missing(["9.0"]) == ["9.0"]
    assert ObjectAudit(path="x.so", sass=["sm_90"]).verdict("9.0") == "runs"
    assert ObjectAudit(path="plain.so").verdict("9.0") == "no GPU code"


@pytest.mark.parametrize(
    ("name", "outside"),
    [
        ("nvidia/cu13/lib/libcufft.so.12", True),
        ("libcufft.so", True),
        ("lib/libcufftw.so.12.0.0", True),
        ("libcufftMp.so.11", False),
        ("libcufft_static.a", False),
        ("torch/lib/libtorch_cuda.so", False),
    ],
)
def test_which_files_are_known_to_keep_kernels_elsewhere(name: str, outside: bool) -> None:
    assert (outside_fatbin(name) is not None) == outside
