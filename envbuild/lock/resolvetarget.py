"""What a spec is resolved *for*: Python version, wheel platform tag, cutoff, indexes, and the
requirements handed to the resolver."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from envbuild.errors import Problem, SpecError, UserError
from envbuild.lock.model import Index
from envbuild.proc.core import Secret
from envbuild.spec.knowledge import target_platform
from envbuild.spec.load import LoadedSpec
from envbuild.spec.model import SECRET_REF

log = logging.getLogger(__name__)

PYPI = "https://pypi.org/simple"
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(x86_64|aarch64)$")
_MUSLLINUX = re.compile(r"^musllinux_(\d+)_(\d+)_(x86_64|aarch64)$")
#: The manylinux glibc range uv 0.13's --python-platform knows. A newer glibc is resolved as the
#: newest uv knows: every wheel chosen still runs, only wheels needing the newer glibc are missed.
UV_GLIBC = ((2, 17), (2, 40))


@dataclass(frozen=True)
class ResolveTarget:
    python: str
    platform: str
    exclude_newer: datetime
    indexes: list[Index]  # the default first, then extras, then the torch index if any
    torch_index: str | None

    @property
    def arch(self) -> str:
        return "aarch64" if self.platform.endswith("aarch64") else "x86_64"

    def uv_platform(self) -> str:
        """The value of uv's ``--python-platform`` for :attr:`platform`."""
        if m := _MANYLINUX.match(self.platform):
            glibc = (int(m.group(1)), int(m.group(2)))
            low, high = UV_GLIBC
            use = min(max(glibc, low), high)
            if use != glibc:
                log.info(
                    "uv knows manylinux_%d_%d at most; resolving %s as manylinux_%d_%d",
                    *high,
                    self.platform,
                    *use,
                )
            return f"{m.group(3)}-manylinux_{use[0]}_{use[1]}"
        if m := _MUSLLINUX.match(self.platform):
            return f"{m.group(3)}-unknown-linux-musl"
        raise UserError(f"platform tag {self.platform!r} is not a Linux wheel platform tag")

    def environment_marker(self) -> str:
        return (
            f"sys_platform == 'linux' and platform_machine == '{self.arch}' and "
            f"python_version == '{self.python}'"
        )

    def cutoff(self) -> str:
        """The cutoff as uv wants it: RFC 3339 in UTC."""
        return self.exclude_newer.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def resolve_target_of(loaded: LoadedSpec) -> ResolveTarget:
    spec = loaded.spec
    indexes = [Index(name="default", url=spec.resolution.index_url)]
    indexes += [
        Index(name=f"extra-{i}", url=url)
        for i, url in enumerate(spec.resolution.extra_index_urls, 1)
    ]
    torch_index = None
    if spec.torch and spec.torch.index != "pypi":
        torch_index = spec.torch.index
        indexes.append(Index(name="torch", url=torch_index))
    return ResolveTarget(
        python=spec.python.version,
        platform=platform_tag(loaded),
        exclude_newer=spec.resolution.exclude_newer,
        indexes=indexes,
        torch_index=torch_index,
    )


# --- the platform tag -------------------------------------------------------------------------


def platform_tag(loaded: LoadedSpec) -> str:
    """The spec's ``python.platform``, else derived from the base's glibc by the knowledge base."""
    tag = target_platform(loaded.spec)
    if tag:
        return tag
    base = loaded.spec.base
    if base.kind == "debian":
        problem = loaded.problem(
            ("base", "suite"),
            f"cannot derive the wheel platform tag: the glibc of Debian {base.suite!r} is not in "
            "the knowledge base",
            "set python.platform, e.g. manylinux_2_36_x86_64",
        )
    else:
        problem = Problem(
            *loaded.where(("python",)),
            "python.platform",
            f"a {base.kind} base's glibc cannot be read without fetching it, so the wheel "
            "platform tag cannot be derived",
            "set python.platform to the base's glibc, e.g. manylinux_2_39_x86_64 for Ubuntu 24.04",
        )
    raise SpecError([problem])


# --- requirements -----------------------------------------------------------------------------


def requirements_of(loaded: LoadedSpec) -> list[str]:
    """What the spec asks the resolver for, one PEP 508 string each, sorted."""
    spec = loaded.spec
    reqs: list[str] = []
    if spec.torch:
        version = spec.torch.version
        if spec.torch.index != "pypi" and "+" not in version:
            # a PyTorch-style index serves every CUDA variant as a local version: pin the one
            # the spec names (PyPI's torch carries no local version)
            version += f"+{spec.torch.cuda}"
        reqs.append(f"torch=={version}")
    if spec.vllm:
        extras = f"[{','.join(sorted(spec.vllm.extras))}]" if spec.vllm.extras else ""
        reqs.append(f"vllm{extras}=={spec.vllm.version}")
    reqs += [f"{canonicalize_name(n)}{s}" for n, s in spec.packages.items()]
    reqs += [str(Requirement(r)) for r in spec.requirements]
    reqs += [f"{canonicalize_name(n)}=={b.version}" for n, b in spec.builds.items()]
    return sorted(set(reqs), key=lambda r: (canonicalize_name(Requirement(r).name), r))


def build_names(loaded: LoadedSpec) -> list[str]:
    return sorted(canonicalize_name(n) for n in loaded.spec.builds)


# --- secrets in index URLs --------------------------------------------------------------------


def expand_url(url: str) -> str | Secret:
    """An index URL with its ``${VAR}`` references filled from the caller's environment. A URL
    that references nothing is returned as is; one that does becomes a :class:`Secret`."""
    if not SECRET_REF.search(url):
        return url
    missing = [m.group(1) for m in SECRET_REF.finditer(url) if m.group(1) not in os.environ]
    if missing:
        raise UserError(
            f"index URL {url} references ${{{missing[0]}}}, which is not set",
            hint=f"export {missing[0]} before locking",
        )
    return Secret(SECRET_REF.sub(lambda m: os.environ[m.group(1)], url))
