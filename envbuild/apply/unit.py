"""The systemd unit that serves the model with vLLM, rendered from the spec's ``[serve]``.

Secrets (``[serve.env]`` values that reference the caller's environment as ``${NAME}``) never
enter the unit: they go to an EnvironmentFile of mode 0600 the unit names. Everything else is an
``Environment=`` line. Every value is quoted the way systemd reads it back (``%`` specifiers and
``$`` expansions escaped), so what the spec says is what vLLM gets.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from envbuild.apply.modelcache import repo_folder
from envbuild.errors import EnvironmentFailure, UserError
from envbuild.spec.knowledge import secret_args
from envbuild.spec.model import SECRET_REF, Spec
from envbuild.templates import core as templates

_SAFE = re.compile(r"[A-Za-z0-9_@+=:,./-]+")
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t"}


def unit_name(spec_name: str) -> str:
    return f"envbuild-{spec_name}.service"


def _quote(value: str, *, dollar: bool) -> str:
    text = value.replace("%", "%%")
    if dollar:
        text = text.replace("$", "$$")
    if _SAFE.fullmatch(value):
        return text
    return '"' + "".join(_ESCAPES.get(c, c) for c in text) + '"'


class RunTimeArg(str):
    """An ExecStart argument whose ``${NAME}`` systemd fills in from the unit's environment (the
    EnvironmentFile): the value of a secret flag in ``serve.extra_args``."""

    __slots__ = ()


def quote_arg(value: str) -> str:
    """One ExecStart argument as systemd parses it back (a :class:`RunTimeArg` keeps its
    ``${NAME}`` for systemd to expand, as exactly one argument)."""
    return _quote(value, dollar=not isinstance(value, RunTimeArg))


def quote_env(assignment: str) -> str:
    """One ``Environment=`` assignment (``KEY=value``)."""
    return _quote(assignment, dollar=False)


def quote_path(path: object) -> str:
    text = str(path)
    if not _SAFE.fullmatch(text):
        raise UserError(
            f"{text}: systemd cannot take this path unquoted (spaces or special characters)",
            hint="use a --root and state dir whose paths have no spaces",
        )
    return text.replace("%", "%%")


def _unit_argv(argv: Sequence[object]) -> str:
    return " ".join(quote_arg(a if isinstance(a, str) else str(a)) for a in argv)


#: How the unit's template quotes what it writes.
_FILTERS = {"unit_argv": _unit_argv, "unit_env": quote_env, "unit_path": quote_path}


@dataclass(frozen=True)
class ServeSettings:
    """What the unit needs besides the spec: where things are on the target machine."""

    generation: int
    generation_path: Path
    venv: Path
    hf_home: Path
    env_file: Path
    #: The venv's interpreter, when its scripts' shebangs name another path (a venv taken
    #: from an image keeps the image's ``#!/opt/venv/bin/python``): ExecStart runs the
    #: ``vllm`` script with it.
    python: Path | None = None


def pycache_prefix(generation_path: Path) -> Path:
    """Where the unit's Python writes its bytecode: the state dir's ``pycache/`` (beside
    ``generations/``), under which each generation's sources have their own paths."""
    return generation_path.parent.parent / "pycache"


def split_env(spec: Spec) -> tuple[dict[str, str], dict[str, str]]:
    """``[serve.env]`` as (plain values, secret templates that reference ``${NAME}``)."""
    plain: dict[str, str] = {}
    secret: dict[str, str] = {}
    for key, value in (spec.serve.env if spec.serve else {}).items():
        (secret if SECRET_REF.search(value) else plain)[key] = value
    return plain, secret


def _secret_arg_names(spec: Spec) -> list[str]:
    """The variables the secret flags of ``serve.extra_args`` name (``--api-key ${NAME}``)."""
    args = spec.serve.extra_args if spec.serve else []
    return sorted(
        {m.group(1) for a in secret_args(args) if a.value for m in SECRET_REF.finditer(a.value)}
    )


def secret_names(spec: Spec) -> list[str]:
    """The caller's environment variables the unit's secrets are read from."""
    _plain, secret = split_env(spec)
    names = {m.group(1) for v in secret.values() for m in SECRET_REF.finditer(v)}
    return sorted(names | set(_secret_arg_names(spec)))


def exec_start(spec: Spec, venv: Path, hub_cache: Path) -> list[str]:
    """The unit's command. Every repo it names is read at its pinned commit: the model by repo
    id with ``--revision`` (vLLM asks the cache for that commit, never for a branch); a GGUF
    model, a tokenizer or a config from another repo by its snapshot folder in ``hub_cache``
    (one ``--revision`` cannot name commits of two repos, and vllm-gguf-plugin loads the config
    repo's revision for the weights too)."""
    serve, model = spec.serve, spec.model
    if serve is None or model is None:
        raise UserError(f"spec {spec.name}: [serve] needs a [model] to serve")

    def snapshot(repo: str, revision: str) -> Path:
        return repo_folder(hub_cache, repo) / "snapshots" / revision

    if model.gguf is not None:
        # vllm-gguf-plugin knows a local GGUF by its file's path (its <dir>:<quant> form takes
        # GGML's own quant names only, not Unsloth's UD- ones) and finds the shards beside it
        folder = snapshot(model.repo, model.revision)
        if model.gguf.folder:
            folder = folder / model.gguf.folder
        argv = [str(venv / "bin" / "vllm"), "serve", str(folder / model.gguf.file)]
    else:
        argv = [str(venv / "bin" / "vllm"), "serve", model.repo]
        argv += ["--revision", model.revision, "--code-revision", model.revision]
    if model.tokenizer is not None:
        argv += ["--tokenizer", str(snapshot(model.tokenizer.repo, model.tokenizer.revision))]
    elif model.gguf is None:
        argv += ["--tokenizer-revision", model.revision]
    if model.config is not None:
        argv += ["--hf-config-path", str(snapshot(model.config.repo, model.config.revision))]
    argv += ["--tensor-parallel-size", str(serve.tensor_parallel_size)]
    if serve.pipeline_parallel_size != 1:
        argv += ["--pipeline-parallel-size", str(serve.pipeline_parallel_size)]
    if serve.max_model_len is not None:
        argv += ["--max-model-len", str(serve.max_model_len)]
    argv += [
        "--kv-cache-dtype",
        serve.kv_cache_dtype,
        "--gpu-memory-utilization",
        f"{serve.gpu_memory_utilization:g}",
    ]
    if serve.served_model_name:
        argv += ["--served-model-name", serve.served_model_name]
    run_time = {a.index for a in secret_args(serve.extra_args) if a.value}
    extra = [RunTimeArg(a) if i in run_time else a for i, a in enumerate(serve.extra_args)]
    argv += ["--host", serve.host, "--port", str(serve.port), *extra]
    return argv


def render_unit(spec: Spec, spec_hash: str, settings: ServeSettings) -> str:
    """The unit file's text."""
    plain, _secret = split_env(spec)
    environment = {
        "HF_HOME": str(settings.hf_home),
        # The model was fetched by apply; serving never reaches the hub unless the spec says so.
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        # A generation is read-only and exactly its manifest (root writes into 0555 folders
        # anyway): Python's bytecode cache goes beside the generations, never into one.
        "PYTHONPYCACHEPREFIX": str(pycache_prefix(settings.generation_path)),
        **plain,
    }
    assert spec.model is not None  # exec_start checks it
    return templates.render(
        "vllm.service.j2",
        _FILTERS,
        spec_name=spec.name,
        spec_hash=spec_hash,
        generation=settings.generation,
        generation_path=settings.generation_path,
        model_repo=spec.model.repo if spec.model else "",
        environment=sorted(environment.items()),
        env_file=settings.env_file,
        exec_start=[
            *([str(settings.python)] if settings.python is not None else []),
            *exec_start(spec, settings.venv, settings.hf_home / "hub"),
        ],
    )


def render_env_file(spec: Spec, environ: Mapping[str, str]) -> str:
    """The EnvironmentFile's text: each secret with ``${NAME}`` filled in from ``environ``.

    Raises :class:`EnvironmentFailure` naming every variable that is not set."""
    _plain, secret = split_env(spec)
    missing = [n for n in secret_names(spec) if n not in environ]
    if missing:
        raise EnvironmentFailure(
            f"the unit's secrets need {', '.join(missing)} in the environment",
            hint="export them before running envbuild (they are written only to a 0600 file)",
        )
    lines = [f"# Secrets for {unit_name(spec.name)}, written by envbuild; mode 0600."]
    # the variables secret flags name are expanded by systemd in ExecStart
    templates = {**{n: f"${{{n}}}" for n in _secret_arg_names(spec)}, **secret}
    for key in sorted(templates):
        value = SECRET_REF.sub(lambda m: environ[m.group(1)], templates[key])
        if "\n" in value or "\0" in value:
            raise EnvironmentFailure(
                f"the secret for {key} holds a newline or NUL, which an EnvironmentFile "
                "cannot carry"
            )
        lines.append(f"{key}={env_file_quote(value)}")
    return "\n".join(lines) + "\n"


def env_file_quote(value: str) -> str:
    """A value as systemd's EnvironmentFile parser reads it back (double quotes, backslash)."""
    return '"' + "".join("\\" + c if c in '\\"$`' else c for c in value) + '"'


def exec_start_line(argv: Sequence[str]) -> str:
    return " ".join(quote_arg(a) for a in argv)


@dataclass(frozen=True)
class Preview:
    """The unit apply would install for a spec, and its EnvironmentFile's keys (no values)."""

    unit: str  # its name
    text: str
    env_file: Path
    env_keys: list[str]
    #: Whether the generation's folder is known (its name holds a content hash that needs the
    #: store's built wheels); when not, the unit names ``<number>-unbuilt``.
    exact_path: bool
    generation: int = 0
    #: Whether apply would reuse that generation (it exists with these inputs and verifies).
    reused: bool = False


def preview(
    spec: Spec, spec_hash: str, *, generation: int, generation_path: Path, hf_home: Path,
    env_file: Path, exact_path: bool, reused: bool = False,
) -> Preview:  # fmt: skip
    text = render_unit(
        spec,
        spec_hash,
        ServeSettings(generation, generation_path, generation_path / "venv", hf_home, env_file),
    )
    _plain, secret = split_env(spec)
    return Preview(
        unit_name(spec.name), text, env_file, sorted(secret), exact_path, generation, reused
    )
