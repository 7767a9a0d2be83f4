"""torch's build as torch/version.py says it (what collect_env prints), read as text."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from envbuild.snapshot.torchinfo import read_torch_build

# the layout torch's setup writes (torch 2.x: tools/generate_torch_version.py)
VERSION_PY = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'xpu']
__version__ = '2.11.0+cu130'
debug = False
cuda: Optional[str] = '13.0'
git_version = '70d99e998b8955e778d1bc4a5e8d7bcc1cf2d0e7'
hip: Optional[str] = None
xpu: Optional[str] = None
"""


def test_the_cuda_build_and_commit_are_read(tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "version.py").write_text(VERSION_PY)
    build = read_torch_build([str(tmp_path / "nothing"), str(tmp_path)])
    assert build is not None
    assert (build.version, build.cuda, build.hip, build.debug) == ("2.11.0+cu130", "13.0", None,
                                                                  False)  # fmt: skip
    assert build.git_version == "70d99e998b8955e778d1bc4a5e8d7bcc1cf2d0e7"


def test_no_torch_is_none(tmp_path: Path) -> None:
    assert read_torch_build([str(tmp_path)]) is None


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=400))
def test_any_version_py_is_read_or_refused_quietly(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "torch").mkdir()
        (Path(tmp) / "torch" / "version.py").write_text(text)
        build = read_torch_build([tmp])
        assert build is None or build.version in text
