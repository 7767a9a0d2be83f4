"""`envbuild dockerfile`: the same image as a Dockerfile, for teams that build with docker and as
the peer of ``envbuild build`` in the benchmark.

The Dockerfile starts FROM the base (``debian:<suite>`` or the digest-pinned image), installs
the spec's apt packages, then the lock's wheels with uv (``--require-hashes``) into the same
venv, and sets the same env, command and labels as :func:`envbuild.plan.image_config`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import jinja2

from envbuild.errors import UserError
from envbuild.install import uv_version
from envbuild.lock import Lock
from envbuild.plan import image_config, select_wheels
from envbuild.spec import LoadedSpec


@dataclass(frozen=True)
class Dockerfile:
    text: str
    base: str
    requirements: list[str]


def _dq(value: str) -> str:
    """A double-quoted Dockerfile word: backslash, quote and ``$`` escaped."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$")
    return f'"{escaped}"'


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("envbuild", "templates"),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["dq"] = _dq
    env.filters["json"] = lambda v: json.dumps(v, ensure_ascii=False)
    return env


def base_ref(loaded: LoadedSpec) -> str:
    base = loaded.spec.base
    if base.kind == "debian":
        return f"debian:{base.suite}"
    if base.kind == "image":
        return base.ref
    raise UserError(
        f"a {base.kind} base has no registry reference a Dockerfile could start FROM",
        hint="load it into docker first and use a spec with an [base] kind = 'image'",
    )


def render_dockerfile(
    loaded: LoadedSpec, lock: Lock, *, lock_hash: str, lock_file: str
) -> Dockerfile:
    spec = loaded.spec
    if lock.envbuild.builds or spec.patches:
        raise UserError(
            "the Dockerfile cannot express source builds or patches yet",
            hint="build this spec with `envbuild build`",
        )
    wheels = select_wheels(lock)
    requirements = [f"{w.canonical}=={w.version} --hash=sha256:{w.sha256}" for w in wheels]
    config = image_config(spec, spec_hash=loaded.spec_hash(), lock_hash=lock_hash)
    base = spec.base
    apt = sorted(base.packages) if base.kind == "debian" else []
    if base.kind == "debian" and "python3-venv" not in apt:
        apt = sorted({*apt, "python3-venv"})
    indexes = [i.url for i in lock.envbuild.indexes]
    text = (
        _environment()
        .get_template("Dockerfile.j2")
        .render(
            spec_file=loaded.display(loaded.path),
            spec_name=spec.name,
            spec_hash=loaded.spec_hash(),
            lock_file=lock_file,
            lock_hash=lock_hash,
            base_ref=base_ref(loaded),
            apt_packages=apt,
            uv_version=uv_version().split()[1],
            interpreter=spec.python.interpreter,
            venv=spec.python.venv.rstrip("/"),
            index_url=indexes[0] if indexes else "https://pypi.org/simple",
            extra_index_urls=indexes[1:],
            requirements=requirements,
            env=sorted(config.env.items()),
            labels=sorted(config.labels.items()),
            workdir=config.workdir,
            entrypoint=config.entrypoint,
            cmd=config.cmd,
        )
    )
    return Dockerfile(text, base_ref(loaded), requirements)
