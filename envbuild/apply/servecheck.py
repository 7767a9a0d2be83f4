"""The unit's command checked by the vLLM it runs: the generation's own interpreter runs
:mod:`envbuild.apply.vllm_probe`, which builds ``vllm serve``'s real argument parser and parses
the exact arguments of ``ExecStart`` (parse only: no GPU is probed and no model is read).

A command the parser refuses would make the unit fail at start, after the old service has been
stopped; apply checks it before switching.
"""

from __future__ import annotations

import json
import logging
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from envbuild.apply.generations import Generation
from envbuild.apply.venv import INSTALL_LOCK
from envbuild.errors import EnvbuildError, EnvironmentFailure
from envbuild.fsio import compact_json, sha256_file
from envbuild.proc import core as proc
from envbuild.store.core import Store, derivation_key

log = logging.getLogger(__name__)

PROBE = Path(__file__).with_name("vllm_probe.py")
#: Importing vLLM takes seconds to tens of seconds on a busy machine.
TIMEOUT = 600.0


#: A generation is read-only and exactly its manifest: the probe runs its Python isolated
#: (``-I``) and writes no bytecode into it (``-B``; root would write into its 0555 folders).
PYTHON_FLAGS = ("-I", "-B")


def probe_env(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """The probe's environment: the caller's, cleaned, and no bytecode written anywhere (also
    by a child the imported code starts, which ``-B`` does not reach)."""
    return proc.child_env({"PYTHONDONTWRITEBYTECODE": "1", **(overrides or {})},
                          drop=("PYTHONPYCACHEPREFIX",))  # fmt: skip


@dataclass(frozen=True)
class ParseResult:
    ok: bool | None  # None: the parser could not be loaded at all
    error: str | None = None
    #: what the parsed command names to load: model, tokenizer, hf_config_path, revision
    reference: dict[str, str | None] | None = None
    cached: bool = False  # the verdict was recorded before (see :func:`check_command`)


def _parse_result(answer: Mapping[str, Any], *, cached: bool = False) -> ParseResult:
    ok, error, reference = answer.get("ok"), answer.get("error"), answer.get("reference")
    if ok not in (True, False, None) or not isinstance(error, str | None):
        raise TypeError(f"not a parse answer: {answer!r}")
    if reference is not None and not (
        isinstance(reference, dict) and all(isinstance(v, str | None) for v in reference.values())
    ):
        raise TypeError(f"not a model reference: {reference!r}")
    return ParseResult(ok, error, reference, cached)


def serve_args(argv: Sequence[str]) -> list[str]:
    """The arguments after ``vllm serve`` of a unit's command."""
    if len(argv) < 2 or Path(argv[0]).name != "vllm" or argv[1] != "serve":
        raise EnvironmentFailure(f"the unit's command is not `vllm serve …`: {list(argv)[:3]}")
    return list(argv[2:])


def parse_commands(python: Path, commands: Sequence[Sequence[str]]) -> list[ParseResult]:
    """Parse each command (the arguments after ``vllm serve``) with the vLLM of ``python``."""
    done = proc.run(
        [str(python), *PYTHON_FLAGS, str(PROBE), "parse"],
        tool="vllm's argument parser",
        input=json.dumps([list(c) for c in commands]),
        env=probe_env(),
        timeout=TIMEOUT,
    )
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise EnvironmentFailure(
            f"vLLM's argument parser ({python}) answered no result: {done.stdout[-200:]!r}"
        ) from exc
    if isinstance(answer, dict):
        return [ParseResult(None, str(answer.get("error")))] * len(commands)
    try:
        return [_parse_result(a) for a in answer]
    except (TypeError, AttributeError) as exc:
        raise EnvironmentFailure(f"vLLM's argument parser ({python}) answered {exc}") from exc


# -- what the unit's model argument resolves to, after the fetch -----------------------------


@dataclass(frozen=True)
class ModelCheck:
    """What the engine would load the unit's model from (``ok`` None: not checked)."""

    ok: bool | None
    error: str | None = None
    kind: str = "hf"  # "gguf": a general plugin (vllm-gguf-plugin) takes the reference
    weights: str | None = None
    shards: tuple[str, ...] = ()
    config: str | None = None
    cached: bool = False


def resolve_models(
    python: Path, references: Sequence[Mapping[str, str | None]], hf_home: Path
) -> list[ModelCheck]:
    """Run the locked vLLM's and its plugins' own model-reference recognition on each of
    ``references`` (what parsed commands name), offline in ``hf_home`` as the unit is."""
    done = proc.run(
        [str(python), *PYTHON_FLAGS, str(PROBE), "model"],
        tool="vllm's model loader",
        input=json.dumps([dict(r) for r in references]),
        env=probe_env({"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"}),
        timeout=TIMEOUT,
    )
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        if isinstance(answer, dict):  # vLLM could not be imported
            return [_model_check(answer)] * len(references)
        return [_model_check(a) for a in answer]
    except (ValueError, IndexError, TypeError, ValidationError) as exc:
        raise EnvironmentFailure(
            f"vLLM's model loader ({python}) answered no result: {done.stdout[-200:]!r}"
        ) from exc


class _ModelAnswer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    ok: bool | None
    error: str | None = None
    kind: str = "hf"
    weights: str | None = None
    shards: list[str] = Field(default_factory=list)
    config: str | None = None


def _model_check(answer: object, *, cached: bool = False) -> ModelCheck:
    a = _ModelAnswer.model_validate(answer)
    return ModelCheck(a.ok, a.error, a.kind, a.weights, tuple(a.shards), a.config, cached)


# -- verdicts kept in the store ------------------------------------------------------------

#: The store's record of a probe's answer: keyed by what decides it (every wheel the venv was
#: installed from, the interpreter, this probe's own source, the exact input; for the model,
#: the fetched snapshots' listings too), so a generation sharing them is checked in
#: milliseconds and a changed wheel or argument is checked again. Machine-local records (the
#: input holds this machine's paths): never published to a remote cache.
VERDICT = "vllm-verdict"


def environment(gen: Generation) -> dict[str, Any]:
    """What decides a probe's answer besides its input: the sha256 of every wheel the
    generation's install lock names (vLLM's, its plugins', and what they import), its
    interpreter, and this probe."""
    try:
        data = tomllib.loads((gen.path / INSTALL_LOCK).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EnvironmentFailure(f"{gen.path / INSTALL_LOCK}: cannot read: {exc}") from exc
    wheels = sorted(
        [
            str(p.get("name", "")),
            str(p.get("version", "")),
            sorted(str((w.get("hashes") or {}).get("sha256", "")) for w in p.get("wheels") or []),
        ]
        for p in data.get("packages") or []
    )
    interpreter = gen.meta.interpreter.sha256 if gen.meta.interpreter else gen.meta.python
    return {"wheels": wheels, "interpreter": interpreter, "probe": sha256_file(PROBE)}


def _recall(store: Store | None, inputs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The answer recorded for ``inputs``, or None. A record that is unreadable, of another
    key or kind, or whose answer is not one the probe gives is ignored (and checked again):
    never trusted."""
    if store is None:
        return None
    key = derivation_key(VERDICT, inputs)
    drv = store.lookup(key)
    if drv is None:
        return None
    answer = drv.meta.get("answer")
    expected = json.loads(compact_json(dict(inputs)))
    if drv.key != key or drv.kind != VERDICT or drv.inputs != expected or not isinstance(
        answer, dict
    ) or not isinstance(answer.get("ok"), bool):  # fmt: skip
        log.warning("ignoring a damaged vLLM verdict record %s: checking again", key[:12])
        return None
    return answer


def _remember(store: Store | None, inputs: Mapping[str, Any], answer: Mapping[str, Any]) -> None:
    if store is None or not isinstance(answer.get("ok"), bool):  # "not checked" is no verdict
        return
    try:
        store.record(VERDICT, inputs, {}, {"answer": dict(answer)})
    except (OSError, EnvbuildError) as exc:  # a cache: the check stands without it
        log.warning("the vLLM verdict was not recorded: %s", exc)


def check_command(gen: Generation, argv: Sequence[str], store: Store | None) -> ParseResult:
    """:func:`parse_commands` of the unit's serve arguments in ``gen``, its verdict kept in
    ``store`` (None: not kept)."""
    if store is None:
        return parse_commands(gen.venv / "bin" / "python", [list(argv)])[0]
    inputs = {"check": "parse", "environment": environment(gen), "argv": list(argv)}
    if (answer := _recall(store, inputs)) is not None:
        try:
            return _parse_result(answer, cached=True)
        except (ValidationError, TypeError):
            log.warning("ignoring a damaged vLLM verdict record: checking again")
    [result] = parse_commands(gen.venv / "bin" / "python", [list(argv)])
    _remember(store, inputs, {"ok": result.ok, "error": result.error,
                              "reference": result.reference})  # fmt: skip
    return result


def check_model(
    gen: Generation,
    reference: Mapping[str, str | None],
    hf_home: Path,
    snapshots: Sequence[Path],
    store: Store | None,
) -> ModelCheck:
    """:func:`resolve_models` in ``gen``, its verdict kept in ``store`` keyed also by what the
    fetched ``snapshots`` hold (their files and the blobs they name)."""
    if store is None:
        return resolve_models(gen.venv / "bin" / "python", [reference], hf_home)[0]
    inputs = {
        "check": "model",
        "environment": environment(gen),
        "reference": dict(reference),
        "hf_home": str(hf_home),
        "snapshots": {str(s): _listing(s) for s in snapshots},
    }
    if (answer := _recall(store, inputs)) is not None:
        try:
            return _model_check(answer, cached=True)
        except (ValidationError, TypeError):
            log.warning("ignoring a damaged vLLM verdict record: checking again")
    [result] = resolve_models(gen.venv / "bin" / "python", [reference], hf_home)
    _remember(store, inputs, {"ok": result.ok, "error": result.error, "kind": result.kind,
                              "weights": result.weights, "shards": list(result.shards),
                              "config": result.config})  # fmt: skip
    return result


def _listing(snapshot: Path) -> dict[str, str]:
    """A snapshot folder's files -> the blob each names (huggingface_hub's links)."""
    out = {}
    for top, _dirs, names in os.walk(snapshot):
        for name in names:
            path = os.path.join(top, name)
            rel = os.path.relpath(path, snapshot)
            out[rel] = (
                os.readlink(path) if os.path.islink(path) else f"size:{os.lstat(path).st_size}"
            )
    return dict(sorted(out.items()))
