"""The serving unit as spec tables: ``[serve]``, ``[model]`` and ``[vllm]``'s flags.

Input: the unit's ``ExecStart`` (``… vllm serve MODEL FLAG…``) and ``Environment``, the flag
table of the vLLM that serves it, and the Hugging Face cache. Output: the tables as data, and
notes. The arguments are read with vLLM's own flags: :func:`flag_table` asks the adopted
environment's vLLM for them (:mod:`envbuild.apply.vllm_probe` ``dump``, parse only), and uses
the table envbuild keeps for that release (``envbuild/spec/vllm_serve/``) when that vLLM cannot
be imported. Which spec key each flag comes from is that table's ``owned_by``: a flag a key
owns becomes the key, every other one stays in ``serve.extra_args``.

A model served from the cache's snapshot folder (``…/models--org--name/snapshots/<commit>``)
gives ``[model]``'s repo and revision; a GGUF one (``<snapshot>/<folder>:<quant>``, the
vllm-gguf-plugin form) gives ``[model.gguf]`` too. A secret flag's value (``--api-key``),
redacted in the snapshot, becomes the ``${VAR}`` the knowledge base names; a secret-looking
environment value becomes ``${NAME}``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.apply.servecheck import PROBE, TIMEOUT
from envbuild.errors import EnvironmentFailure
from envbuild.proc import core as proc
from envbuild.snapshot.model.core import REDACTED
from envbuild.snapshot.model.services import HfCacheSection
from envbuild.spec import knowledge, serveflags
from envbuild.spec.serveflags import FlagTable, ServeFlag

_SNAPSHOT = re.compile(
    r"models--(?P<repo>[^/]+?)/snapshots/(?P<rev>[0-9a-f]{40})(?:/(?P<sub>.*))?$"
)
#: a GGUF file's quant: ``GLM-5-UD-IQ2_XXS-00001-of-00006.gguf`` -> ``UD-IQ2_XXS``
_GGUF_FILE = re.compile(r"-(?P<quant>(?:UD-)?[A-Za-z0-9_]+)(?:-\d{5}-of-\d{5})?\.gguf$")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([kKmMgG]?)$")
#: What the unit apply renders sets itself (docs/apply.md, The unit).
UNIT_ENV = frozenset({"HF_HOME", "HF_HUB_OFFLINE", "PYTHONUNBUFFERED"})
_INT_KEYS = {"tensor_parallel_size", "pipeline_parallel_size", "port"}


@dataclass(frozen=True)
class Served:
    serve: dict[str, Any]
    model: dict[str, Any] | None
    flags_from: str  # where the flag table came from


def flag_table(python: Path | None, version: str, notes: list[str]) -> tuple[FlagTable, str]:
    """The serve flags of the vLLM in ``python``'s environment, else envbuild's table for
    ``version``, else its newest table (noted)."""
    kept = serveflags.table(version)
    if python is not None:
        try:
            done = proc.run(
                # -B: reading the environment adopt adopts writes nothing into it
                [str(python), "-I", "-B", str(PROBE), "dump"],
                tool="vllm's argument parser",
                env=proc.child_env({"PYTHONDONTWRITEBYTECODE": "1"}),
                timeout=TIMEOUT,
            )
            dumped = json.loads(done.stdout.strip().splitlines()[-1])
            owned = {f.dest: f.owned_by for f in (kept or _newest()).flags if f.owned_by}
            flags = [
                ServeFlag(
                    names=list(f["names"]),
                    dest=str(f["dest"]),
                    takes_value=bool(f["takes_value"]),
                    nargs=f.get("nargs"),
                    choices=f.get("choices"),
                    owned_by=owned.get(str(f["dest"])),
                    source=f"vllm {dumped['vllm']}'s parser in the environment",
                )
                for f in dumped["flags"]
            ]
            table = FlagTable(vllm=str(dumped["vllm"]), source="the environment", flags=flags)
            return table, f"the parser of vLLM {dumped['vllm']} in the environment"
        except (EnvironmentFailure, ValueError, KeyError, IndexError, TypeError) as exc:
            notes.append(
                f"vLLM's parser could not be asked ({str(exc)[:160]}): using envbuild's table"
            )
    if kept is not None:
        return kept, f"envbuild's table of vLLM {version}"
    newest = _newest()
    notes.append(f"envbuild has no flag table of vLLM {version}: read with vLLM {newest.vllm}'s")
    return newest, f"envbuild's table of vLLM {newest.vllm}"


def _newest() -> FlagTable:
    table = serveflags.table(serveflags.known_versions()[-1])
    assert table is not None
    return table


def cache_of(argv: list[str], environment: dict[str, str]) -> str | None:
    """The Hugging Face cache the unit reads: the one holding the snapshot folder it serves,
    else its ``HF_HOME``'s ``hub``; None: neither (the hub's default then)."""
    for arg in argv:
        if m := _SNAPSHOT.search(arg.partition(":")[0] if "/snapshots/" in arg else ""):
            return arg[: m.start()].rstrip("/") or "/"
    home = environment.get("HF_HOME")
    return f"{home.rstrip('/')}/hub" if home and home != REDACTED else None


def _number(text: str) -> int | None:
    m = _SIZE.match(text)
    if not m:
        return None
    scale = {"": 1, "k": 1000, "m": 10**6, "g": 10**9, "K": 1024, "M": 1 << 20, "G": 1 << 30}
    return int(float(m.group(1)) * scale[m.group(2)])


def _split(
    flags: FlagTable, args: list[str]
) -> tuple[list[str], list[tuple[ServeFlag, str | None, list[str]]]]:
    """Positionals, and each flag with its value and the tokens it was written as."""
    positionals: list[str] = []
    found: list[tuple[ServeFlag, str | None, list[str]]] = []
    i = 0
    while i < len(args):
        token = args[i]
        i += 1
        if not token.startswith("-") or token == "-":
            positionals.append(token)
            continue
        raw, eq, inline = token.partition("=")
        name = "--" + raw[2:].replace("_", "-") if raw.startswith("--") else raw
        flag = flags.by_name.get(name.partition(".")[0])
        if flag is None:  # unknown here: kept as written, with a value that follows
            words = [token]
            if not eq and i < len(args) and not args[i].startswith("-"):
                words.append(args[i])
                i += 1
            found.append(
                (ServeFlag(names=[raw], dest="", takes_value=True, source="?"), None, words)
            )
            continue
        words, value = [token], inline if eq else None
        if flag.takes_value and not eq:
            take = 1 if flag.nargs in (None, "?", "1") else len(args)
            while take and i < len(args) and not args[i].startswith("-"):
                words.append(args[i])
                value = args[i] if value is None else value
                i += 1
                take -= 1
        found.append((flag, value, words))
    return positionals, found


def model_of(
    value: str, revision: str | None, cache: HfCacheSection | None, notes: list[str]
) -> dict[str, Any] | None:
    """``[model]`` from what the unit serves: a cache snapshot path, or a repo id with a
    ``--revision`` commit."""
    path, _, quant = (
        value.rpartition(":") if ":" in value and "/snapshots/" in value else (value, "", "")
    )
    m = _SNAPSHOT.search(path.rstrip("/"))
    if m:
        repo, rev, sub = m.group("repo").replace("--", "/"), m.group("rev"), m.group("sub") or ""
    elif (
        re.fullmatch(r"[\w.-]+/[\w.-]+", value)
        and revision
        and re.fullmatch(r"[0-9a-f]{40}", revision)
    ):
        repo, rev, sub = value, revision, ""
    else:
        notes.append(
            f"no [model]: the unit serves {value!r}, neither a Hugging Face cache snapshot nor a "
            "repo id with a --revision commit"
        )
        return None
    model: dict[str, Any] = {
        "repo": repo,
        "revision": rev,
        "size_gb": _size_gb(repo, rev, cache, notes),
    }
    if not quant and sub.endswith(".gguf"):  # the quant's first file, as envbuild's unit names it
        sub, _, file = sub.rpartition("/")
        if found := _GGUF_FILE.search(file):
            quant = found.group("quant")
        model["gguf"] = {"quant": quant, "folder": sub, "file": file}
    elif quant:  # vllm-gguf-plugin's <dir>:<quant> form: its first file from the snapshot
        model["gguf"] = {"quant": quant, "folder": sub, "file": _first_gguf(Path(path), quant)}
        if not model["gguf"]["file"]:
            notes.append(
                f"[model.gguf] file: no .gguf file of {quant} in {path} (not on this machine): "
                "write the quant's first file name by hand"
            )
    elif sub:
        notes.append(
            f"[model]: the unit serves the folder {sub!r} of the snapshot; the spec fetches "
            "the whole repo"
        )
    if "gguf" in model and sub:
        model["files"] = [f"{sub}/*"]
    if "gguf" in model and not model["gguf"]["folder"]:
        del model["gguf"]["folder"]
    return model


def _first_gguf(folder: Path, quant: str) -> str:
    """The first ``.gguf`` file of ``quant`` in the snapshot folder (shards sort by number)."""
    try:
        names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".gguf"))
    except OSError:
        return ""
    return next((n for n in names if f"-{quant}." in n or f"-{quant}-" in n), "")


def _size_gb(repo: str, rev: str, cache: HfCacheSection | None, notes: list[str]) -> float:
    for found in cache.repos if cache is not None else []:
        if found.repo_id == repo:
            for revision in found.revisions:
                if revision.commit == rev and revision.size_bytes > 0:
                    return round(max(revision.size_bytes / 1e9, 0.001), 3)
    notes.append(
        f"[model] {repo}@{rev[:12]} is not in the Hugging Face cache: size_gb is a guess (1)"
    )
    return 1.0


def served(
    argv: list[str], environment: dict[str, str], flags: FlagTable, source: str,
    cache: HfCacheSection | None, notes: list[str],
) -> Served:  # fmt: skip
    """``[serve]`` and ``[model]`` from a ``vllm serve`` command line and its environment."""
    if len(argv) < 2 or Path(argv[0]).name != "vllm" or argv[1] != "serve":
        raise EnvironmentFailure(
            f"the unit's ExecStart is not `vllm serve …`: {' '.join(argv[:3])}",
            hint="name the unit that runs vllm serve (--unit)",
        )
    args = list(argv[2:])
    for secret in knowledge.secret_args(args):
        if secret.value is None:
            continue
        ref = "${" + secret.flag.env + "}"
        written = args[secret.index].partition("=")[0]
        args[secret.index] = f"{written}={ref}" if secret.inline else ref
    positionals, found = _split(flags, args)
    serve: dict[str, Any] = {}
    extra: list[str] = []
    model_value = positionals[0] if positionals else None
    revision: str | None = None
    for flag, value, words in found:
        owner = flag.owned_by or ""
        key = owner.removeprefix("serve.")
        if flag.dest == "model" and value:
            model_value = value
        elif flag.dest == "revision":
            revision = value
        elif owner.startswith("model."):
            notes.append(f"{words[0]} (from {owner}) is left out: set {owner} in the spec")
        elif owner.startswith("serve.") and value is not None:
            serve[key] = _typed(key, value, words, extra, notes)
        else:
            extra.extend(words)
    for p in positionals[1:]:
        notes.append(f"the unit's extra positional argument {p!r} is left out")
    if extra:
        serve["extra_args"] = extra
    env = {
        k: ("${" + k + "}" if v == REDACTED else v)
        for k, v in sorted(environment.items())
        if k not in UNIT_ENV
    }
    if env:
        serve["env"] = env
    serve = {k: v for k, v in serve.items() if v is not None}
    model = model_of(model_value, revision, cache, notes) if model_value else None
    return Served(serve, model, source)


def _typed(key: str, value: str, words: list[str], extra: list[str], notes: list[str]) -> Any:
    if key in _INT_KEYS or key == "max_model_len":
        number = (
            _number(value) if key == "max_model_len" else (int(value) if value.isdigit() else None)
        )
        if number is None:
            notes.append(f"{words[0]} {value!r} is not a number: kept in serve.extra_args")
            extra.extend(words)
        return number
    if key == "gpu_memory_utilization":
        try:
            return float(value)
        except ValueError:
            extra.extend(words)
            return None
    if key == "served_model_name" and len(words) > 2:
        notes.append(f"--served-model-name has several names; the spec keeps {value!r}")
    return value
