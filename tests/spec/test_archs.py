"""One Arch, one arch-list reader, one "runs on" rule: the tables of what each spelling means.

Spec validation (``envbuild.spec.checks.builds``), the toolchain's check before a build
(``envbuild.sourcebuild.toolchain.requested_archs``) and the audit after it
(``envbuild.sourcebuild.audit``) all use ``envbuild.spec.archs``. Where two copies of the rules
once disagreed, the case below says which way it is decided and why (``# decided:``).
"""

from __future__ import annotations

import pytest

from envbuild.sourcebuild.toolchain import requested_archs
from envbuild.spec.archs import Arch, parse_list, runs_on, uncovered

#: (spelling, the Arch it names): one arch as nvcc, cuobjdump and the knowledge base write it
NAMES = [
    ("9.0", Arch(9, 0)),
    ("90", Arch(9, 0)),
    ("sm_90", Arch(9, 0)),
    ("compute_90", Arch(9, 0)),
    ("lto_90", Arch(9, 0)),
    ("9.0a", Arch(9, 0, "a")),
    ("sm_90a", Arch(9, 0, "a")),
    ("compute_100a", Arch(10, 0, "a")),
    ("12.0f", Arch(12, 0, "f")),
    ("120f", Arch(12, 0, "f")),
    ("compute_120f", Arch(12, 0, "f")),
    ("sm_121", Arch(12, 1)),
    ("12.1", Arch(12, 1)),
]


@pytest.mark.parametrize(("text", "arch"), NAMES)
def test_one_arch_many_spellings(text: str, arch: Arch) -> None:
    assert Arch.parse(text) == arch
    assert Arch.parse(arch.sass) == Arch.parse(arch.ptx) == Arch.parse(str(arch)) == arch


@pytest.mark.parametrize("text", ["", "9", "sm_9", "sm90", "9.0x", "9.0+PTX", "twelve", "SM_90"])
def test_not_an_arch(text: str) -> None:
    with pytest.raises(ValueError, match="not a GPU architecture"):
        Arch.parse(text)


#: (format, value, items read, items refused). "torch" is TORCH_CUDA_ARCH_LIST as torch's
#: cpp_extension reads it (spaces become ';', split on ';', each item exactly X.Y[a|f][+PTX]);
#: "sm" is an SM-number list as flash-attn's setup.py reads it (split on ';', compared as written).
LISTS = [
    ("torch", "8.0;9.0;12.0+PTX", ["8.0", "9.0", "12.0+PTX"], []),
    ("torch", "8.0 9.0", ["8.0", "9.0"], []),  # torch turns spaces into ';'
    ("torch", "9.0a;10.0f;12.0f+PTX", ["9.0a", "10.0f", "12.0f+PTX"], []),
    ("torch", "9.0a+PTX", ["9.0a+PTX"], []),
    ("torch", "", [], []),  # unset: torch's own default
    # decided: refused. Validation used to read ',' as a separator, the toolchain raised;
    # torch splits on ';' and ' ' only and raises "Unknown CUDA arch (8.0,9.0)".
    ("torch", "8.0,9.0", [], ["8.0,9.0"]),
    # decided: refused. The toolchain used to accept sm_90 and compute_90 (validation refused
    # them); torch accepts only the X.Y spelling.
    ("torch", "sm_90", [], ["sm_90"]),
    ("torch", "compute_90;12.0", ["12.0"], ["compute_90"]),
    ("torch", "90", [], ["90"]),
    ("torch", "12.0+ptx", [], ["12.0+ptx"]),  # torch compares '+PTX' as written
    # torch raises on an empty item: "8.0; 9.0" is "8.0;;9.0" to it
    ("torch", "8.0; 9.0", ["8.0", "9.0"], [""]),
    ("torch", "8.0;", ["8.0"], [""]),
    ("torch", "7.0;12.0+PTX;twelve", ["7.0", "12.0+PTX"], ["twelve"]),
    ("sm", "80;90;120", ["8.0", "9.0", "12.0"], []),
    ("sm", "100a;120f", ["10.0a", "12.0f"], []),
    ("sm", "80;90;", ["8.0", "9.0"], []),  # flash-attn ignores an empty item
    ("sm", "", [], []),
    # refused: flash-attn splits on ';' only, so "80,90" or " 90" matches none of its archs
    ("sm", "80,90", [], ["80,90"]),
    ("sm", "80 90", [], ["80 90"]),
    ("sm", "80; 90", ["8.0"], [" 90"]),
    ("sm", "sm_90;9.0;x9", [], ["sm_90", "9.0", "x9"]),
]


@pytest.mark.parametrize(("fmt", "value", "read", "refused"), LISTS)
def test_arch_lists_as_their_tool_reads_them(
    fmt: str, value: str, read: list[str], refused: list[str]
) -> None:
    assert fmt in ("torch", "sm")
    found, bad = parse_list("FLAG", value, "torch" if fmt == "torch" else "sm")
    assert [str(r) for r in found] == read
    assert [b.text for b in bad] == refused
    assert all(b.variable == "FLAG" and b.hint for b in bad)


@pytest.mark.parametrize(("fmt", "value", "read", "refused"), LISTS)
def test_the_toolchain_refuses_what_validation_refuses(
    fmt: str, value: str, read: list[str], refused: list[str]
) -> None:
    variable = "TORCH_CUDA_ARCH_LIST" if fmt == "torch" else "FLASH_ATTN_CUDA_ARCHS"
    if refused:
        with pytest.raises(ValueError, match=variable):
            requested_archs({variable: value})
    else:
        assert [str(r) for r in requested_archs({variable: value})] == read


def test_refusals_say_why() -> None:
    _, bad = parse_list("TORCH_CUDA_ARCH_LIST", "8.0,9.0;sm_90;12.0+ptx;; x", "torch")
    assert [b.message for b in bad] == [
        "'8.0,9.0' in TORCH_CUDA_ARCH_LIST is not a compute capability (torch separates items "
        "with ';' or ' ', not ',')",
        "'sm_90' in TORCH_CUDA_ARCH_LIST is not a compute capability (torch reads 9.0, not sm_90)",
        "'12.0+ptx' in TORCH_CUDA_ARCH_LIST is not a compute capability (torch reads '+PTX' in "
        "capitals only)",
        "TORCH_CUDA_ARCH_LIST ('8.0,9.0;sm_90;12.0+ptx;; x') has an empty item (a doubled, "
        "leading or trailing ';' or space), which torch refuses",
        "'x' in TORCH_CUDA_ARCH_LIST is not a compute capability",
    ]
    _, bad = parse_list("FLASH_ATTN_CUDA_ARCHS", "80,90;9.0", "sm")
    assert [b.message for b in bad] == [
        "'80,90' in FLASH_ATTN_CUDA_ARCHS is not an SM number (the list is split on ';' only; "
        "spaces and ',' are kept in its items)",
        "'9.0' in FLASH_ATTN_CUDA_ARCHS is not an SM number (write 90)",
    ]


#: (code, GPU's compute capability, SASS for code runs, PTX for code runs)
RUNS_ON = [
    # SASS: the same major, an equal or higher minor. PTX: JIT-compiled for any newer GPU.
    ("sm_120", "12.1", True, True),
    ("sm_120", "12.0", True, True),
    ("sm_121", "12.0", False, False),
    ("sm_80", "8.6", True, True),
    ("sm_80", "8.9", True, True),
    ("sm_86", "8.0", False, False),
    ("sm_90", "10.0", False, True),  # SASS never crosses a major; PTX JITs forward
    ("sm_90", "13.0", False, True),
    ("sm_100", "10.3", True, True),
    ("sm_80", "12.0", False, True),
    ("sm_120", "10.0", False, False),
    # a (arch-specific): exactly that capability, SASS and PTX alike.
    ("sm_90a", "9.0", True, True),
    # decided: no. Validation used to let 9.0a+PTX cover any newer GPU; compute_90a PTX is
    # arch-specific and never JIT-compiles for another capability.
    ("sm_90a", "12.0", False, False),
    ("sm_100a", "10.3", False, False),
    ("sm_120a", "12.1", False, False),
    # f (family-specific, CUDA 12.9+): the same major, an equal or higher minor, PTX included.
    ("sm_100f", "10.0", True, True),
    ("sm_100f", "10.3", True, True),
    ("sm_103f", "10.0", False, False),
    ("sm_100f", "11.0", False, False),
    ("sm_100f", "12.0", False, False),
    ("sm_120f", "12.0", True, True),
    ("sm_120f", "12.1", True, True),
    # decided: no. Validation used to let 12.0f+PTX cover 13.0; family PTX stays in its family.
    ("sm_120f", "13.0", False, False),
]


@pytest.mark.parametrize(("code", "device", "sass", "ptx"), RUNS_ON)
def test_what_runs_where(code: str, device: str, sass: bool, ptx: bool) -> None:
    arch, gpu = Arch.parse(code), Arch.parse(device)
    assert runs_on(arch, gpu) is sass
    assert runs_on(arch, gpu, ptx=True) is ptx


#: (TORCH_CUDA_ARCH_LIST, compute capability, covered): a list covers a GPU when one item's
#: SASS or (with +PTX) PTX runs on it.
COVERS = [
    ("8.0;9.0;12.0+PTX", "12.0", True),
    ("8.0;9.0;12.0+PTX", "12.1", True),  # sm_120 code runs on 12.1
    ("8.0;9.0", "12.0", False),
    ("8.0;9.0+PTX", "12.0", True),  # PTX is JIT-compiled on newer GPUs
    ("9.0a", "9.0", True),
    ("9.0a", "10.0", False),
    ("9.0a+PTX", "9.0", True),
    ("9.0a+PTX", "12.0", False),  # decided: no (see RUNS_ON)
    ("9.0a+PTX", "13.0", False),
    ("12.0f+PTX", "12.0", True),
    ("12.0f+PTX", "12.1", True),
    ("12.0f+PTX", "13.0", False),  # decided: no (see RUNS_ON)
    ("12.0+PTX", "13.0", True),
    ("10.0", "10.3", True),
    ("10.0", "12.0", False),  # different major: no binary compatibility
    ("8.6", "8.0", False),  # newer minor code does not run on an older GPU
]


@pytest.mark.parametrize(("written", "cc", "covered"), COVERS)
def test_coverage(written: str, cc: str, covered: bool) -> None:
    found, bad = parse_list("TORCH_CUDA_ARCH_LIST", written, "torch")
    assert not bad
    assert (uncovered(found, [cc]) == []) is covered


def test_sm_lists_cover_like_their_sass() -> None:
    found, _ = parse_list("FLASH_ATTN_CUDA_ARCHS", "80;90;120", "sm")
    assert [r.arch.number for r in found] == ["80", "90", "120"]
    assert not any(r.ptx for r in found)
    assert uncovered(found, ["8.6", "9.0", "10.0", "12.1"]) == ["10.0"]
