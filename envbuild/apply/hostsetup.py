"""``envbuild render host-setup``: a shell script that installs the driver and CUDA toolkit a
spec pins, from NVIDIA's apt repository. Rendered for the people who provision machines; envbuild
never runs it."""

from __future__ import annotations

from envbuild.errors import UserError
from envbuild.spec.load import LoadedSpec
from envbuild.templates import core as templates

#: The open kernel modules: required on Blackwell and Grace Hopper, recommended from Turing on.
DRIVER_PACKAGE = "nvidia-open"


def toolkit_package(version: str) -> str:
    """``13.1`` or ``13.1.1`` -> ``cuda-toolkit-13-1`` (NVIDIA's apt package)."""
    major, minor = version.split(".")[:2]
    return f"cuda-toolkit-{major}-{minor}"


def render_host_setup(loaded: LoadedSpec) -> str:
    """The script's text, for the driver and CUDA toolkit ``loaded`` pins."""
    spec = loaded.spec
    if spec.host is None:
        raise UserError(
            f"{loaded.display(loaded.path)}: the spec has no [host] table, so no driver to install",
            hint='add [host] with driver = "590.48.01" and its [[host.gpus]]',
        )
    cuda = spec.cuda.version if spec.cuda else None
    return templates.render(
        "host-setup.sh.j2",
        spec_file=loaded.repo_path(loaded.path),
        spec_name=spec.name,
        spec_hash=loaded.spec_hash(),
        driver=spec.host.driver,
        driver_package=DRIVER_PACKAGE,
        cuda=cuda or "",
        toolkit_package=toolkit_package(cuda) if cuda else "",
    )
