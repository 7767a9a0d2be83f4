"""The image config the spec decides: env (the venv first on PATH, ``[serve.env]`` and
``[image.env]``), the command (``[image] cmd``, else ``vllm serve`` with the spec's serving
settings), labels and workdir.

Nothing secret goes into it: a ``${VAR}`` of ``[serve.env]`` is left for run time, one in a
``vllm serve`` argument that takes a secret is filled in by ``/bin/sh`` as the container starts,
and one anywhere else is an error.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Sequence

from envbuild.build.plan import PlanConfig
from envbuild.errors import UserError
from envbuild.spec import secrets
from envbuild.spec.knowledge import secret_args
from envbuild.spec.model import SECRET_REF, Spec

log = logging.getLogger(__name__)

#: PATH of a Debian system, after the venv's bin.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LABEL_PREFIX = "dev.envbuild"


def image_config(spec: Spec, *, spec_hash: str, lock_hash: str) -> PlanConfig:
    """Env, command and labels of the image. Nothing secret goes in: a ``${VAR}`` in
    ``[serve.env]`` is left for run time, and one anywhere else that would land in the image is an
    error."""
    venv = spec.python.venv.rstrip("/")
    env = {
        "PATH": f"{venv}/bin:{SYSTEM_PATH}",
        "VIRTUAL_ENV": venv,
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
    }
    if spec.serve:
        env.update({k: v for k, v in spec.serve.env.items() if not SECRET_REF.search(v)})
    env.update(spec.image.env)
    extra = list(spec.serve.extra_args) if spec.serve else []
    secret = set()
    for arg in secret_args(extra):
        if arg.value is None or not SECRET_REF.fullmatch(arg.value):
            raise UserError(
                f"serve.extra_args: the value of {arg.flag.flag} must be a ${{VAR}} reference "
                "(a literal secret would be written into the image)",
                hint=f'write it as "${{{arg.flag.env}}}" and pass {arg.flag.env} at run time',
            )
        secret.add(arg.index)
    run_time: set[int] = set()  # arguments of cmd filled in when the container starts
    if spec.image.cmd is not None:
        cmd = list(spec.image.cmd)
    elif spec.serve and spec.vllm and spec.model:
        cmd = vllm_serve_cmd(spec)
        run_time = {len(cmd) - len(extra) + i for i in secret}
    else:
        cmd = ["python3"]
    labels = {
        **spec.image.labels,
        f"{LABEL_PREFIX}.spec": spec.name,
        f"{LABEL_PREFIX}.spec-hash": spec_hash,
        f"{LABEL_PREFIX}.lock-hash": lock_hash,
    }
    for where, values in (
        ("image.env", list(spec.image.env.values())),
        ("image.cmd", [a for i, a in enumerate(cmd) if i not in run_time]),
        ("image.labels", list(spec.image.labels.values())),
        ("serve.extra_args", [a for i, a in enumerate(extra) if i not in secret]),
    ):
        for value in values:
            if m := SECRET_REF.search(value):
                raise UserError(
                    f"{where}: {value!r} references ${{{m.group(1)}}}, which would put a secret "
                    "into the image",
                    hint="pass secrets at run time through [serve.env] (they stay out of the "
                    "image) or `docker run -e`",
                )
    _refuse_literal_secrets(spec, cmd, run_time)
    if any(SECRET_REF.search(cmd[i]) for i in run_time):
        cmd = run_time_command(cmd, run_time)
    return PlanConfig(env=env, cmd=cmd, labels=labels, workdir=spec.image.workdir)


def _refuse_literal_secrets(spec: Spec, cmd: Sequence[str], run_time: set[int]) -> None:
    """What validate refuses (:mod:`envbuild.spec.secrets`), refused again where the image's
    config is written: a literal secret in its command, env or labels."""
    places = [
        *((f"image.env.{k}", k, v) for k, v in spec.image.env.items()),
        *((f"image.labels.{k}", k, v) for k, v in spec.image.labels.items()),
        *((f"serve.env.{k}", k, v) for k, v in (spec.serve.env if spec.serve else {}).items()),
    ]
    for where, name, value in places:
        if secrets.named_secret(name, value) or secrets.token_kind(value):
            raise UserError(
                f"{where}: a literal secret would be written into the image",
                hint=f'reference the environment instead: "${{{name}}}" in [serve.env]',
            )
    for hit in secrets.arg_secrets(cmd, skip=frozenset(run_time)):
        raise UserError(
            f"image.cmd: the value of {hit.name} is a literal secret that would be written into "
            "the image",
            hint="pass it at run time ([serve.env], `docker run -e`)",
        )


def run_time_command(cmd: Sequence[str], secret: set[int]) -> list[str]:
    """``cmd`` as a ``/bin/sh -c`` command line that fills each ``${VAR}`` of the arguments at
    ``secret`` in from the container's environment as it starts (``docker run -e VAR``), and
    stops with "VAR: is not set" when it is missing. Every other argument is quoted as it is:
    the image's config names the variables, never their values."""
    words = []
    for i, arg in enumerate(cmd):
        if i not in secret:
            words.append(shlex.quote(arg))
            continue
        parts = SECRET_REF.split(arg)  # literal, name, literal, name, ...
        words.append(
            "".join(
                f'"${{{part}:?is not set}}"' if odd else (shlex.quote(part) if part else "")
                for odd, part in ((k % 2 == 1, p) for k, p in enumerate(parts))
            )
        )
    return ["/bin/sh", "-c", "exec " + " ".join(words)]


def vllm_serve_cmd(spec: Spec) -> list[str]:
    """``vllm serve <model> …`` with the spec's serving settings."""
    assert spec.serve is not None and spec.model is not None
    s = spec.serve
    cmd = ["vllm", "serve", spec.model.repo, "--revision", spec.model.revision]
    if s.served_model_name:
        cmd += ["--served-model-name", s.served_model_name]
    cmd += ["--host", s.host, "--port", str(s.port)]
    cmd += ["--tensor-parallel-size", str(s.tensor_parallel_size)]
    if s.pipeline_parallel_size > 1:
        cmd += ["--pipeline-parallel-size", str(s.pipeline_parallel_size)]
    if s.max_model_len is not None:
        cmd += ["--max-model-len", str(s.max_model_len)]
    cmd += ["--kv-cache-dtype", s.kv_cache_dtype]
    cmd += ["--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}"]
    return [*cmd, *s.extra_args]
