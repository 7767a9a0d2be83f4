"""``vllm serve``'s flags as data, and the check of a spec's ``serve.extra_args`` against them.

The table for each vLLM release lives in ``vllm_serve/<version>.toml`` next to this module,
extracted from the release's wheel by ``tools/vllm_serve_flags.py`` (vLLM's own parser, built
the way ``vllm serve`` builds it). :func:`check_args` reads a list of arguments the way vLLM's
``FlexibleArgumentParser`` does (``--a_b`` is ``--a-b``, ``--flag=value``, ``--json-flag.key
value``) and returns every problem: unknown flags, abbreviations, wrong choices, a missing
value, a flag given twice, and flags that repeat what the spec already says.
"""

from __future__ import annotations

import difflib
import functools
import tomllib
from dataclasses import dataclass
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

from envbuild.errors import UserError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class ServeFlag(_Strict):
    names: list[str] = Field(min_length=1)
    dest: str
    takes_value: bool
    nargs: str | None = None
    choices: list[str] | None = None
    owned_by: str | None = Field(None, description="the spec key the unit passes it from")
    source: str = Field(min_length=1)


class ValueCheck(_Strict):
    """Values vLLM checks after parsing (registered tool-call and reasoning parsers)."""

    dest: str
    choices: list[str]
    unless: str | None = Field(None, description="a flag that registers more (a plugin)")
    source: str = Field(min_length=1)


class Plugin(_Strict):
    name: str
    serve_flags: list[str] = Field(default_factory=list)
    source: str = Field(min_length=1)


class FlagTable(_Strict):
    vllm: str
    source: str = Field(min_length=1)
    flags: list[ServeFlag]
    value_checks: list[ValueCheck] = Field(default_factory=list)
    plugins: list[Plugin] = Field(default_factory=list)

    @functools.cached_property
    def by_name(self) -> dict[str, ServeFlag]:
        return {name: flag for flag in self.flags for name in flag.names}


def known_versions() -> list[str]:
    folder = resources.files("envbuild.spec").joinpath("vllm_serve")
    return sorted(
        p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml")
    )


@functools.cache
def table(vllm: str) -> FlagTable | None:
    """The serve flags of vLLM ``vllm``, or None when envbuild has no table for it."""
    path = resources.files("envbuild.spec").joinpath("vllm_serve", f"{vllm}.toml")
    if not path.is_file():
        return None
    try:
        return FlagTable.model_validate(tomllib.loads(path.read_text("utf-8")))
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise UserError(f"the serve-flag table of vLLM {vllm} is broken: {exc}") from exc


@dataclass(frozen=True)
class ArgProblem:
    index: int  # which argument
    message: str
    fix: str


def _is_flag(token: str) -> bool:
    if not token.startswith("-") or token == "-":
        return False
    try:
        float(token)
    except ValueError:
        return True
    return False  # a negative number is a value


def _normalize(name: str) -> str:
    # FlexibleArgumentParser turns underscores of a long option's name into dashes.
    return "--" + name[2:].replace("_", "-") if name.startswith("--") else name


def _suggest(name: str, names: list[str]) -> str | None:
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    return close[0] if close else None


def check_args(flags: FlagTable, args: list[str]) -> list[ArgProblem]:
    """Every problem of ``args`` as extra arguments of ``vllm serve`` after what the unit
    passes itself."""
    problems: list[ArgProblem] = []
    seen: dict[str, int] = {}
    given: dict[str, str | None] = {}  # dest -> value
    names = sorted(flags.by_name)
    i = 0
    while i < len(args):
        token = args[i]
        at = i
        i += 1
        if token == "--":
            problems.append(
                ArgProblem(at, "'--' ends vLLM's options", "drop it; extra_args are options")
            )
            break
        if not _is_flag(token):
            problems.append(
                ArgProblem(
                    at,
                    f"{token!r} is not a flag (vllm serve takes one positional argument, the "
                    "model, which the unit passes from [model])",
                    "drop it, or put the flag it belongs to before it",
                )
            )
            continue
        if token.startswith("-O") and token != "-O":
            # FlexibleArgumentParser: -O3, -O=3 and -Odecode are --optimization-level VALUE
            token = "--optimization-level=" + (token[3:] if token[2:3] == "=" else token[2:])
        elif token == "-O" and i < len(args) and args[i] in {"0", "1", "2", "3"}:
            token = "--optimization-level"
        raw, has_inline, inline = token.partition("=")
        name = _normalize(raw)
        dotted = ""
        if name.startswith("--") and "." in name:
            name, _, dotted = name.partition(".")
        flag = flags.by_name.get(name)
        if flag is None and not name.startswith("--"):
            # a short option with its value attached (-O3)
            for short in (n for n in names if not n.startswith("--") and name.startswith(n)):
                if flags.by_name[short].takes_value:
                    flag, has_inline, inline = flags.by_name[short], "=", name[len(short) :]
                    break
        if flag is None:
            longer = [n for n in names if n.startswith(name) and name.startswith("--")]
            if len(longer) == 1:
                problems.append(
                    ArgProblem(
                        at,
                        f"{raw} abbreviates {longer[0]}; vLLM {flags.vllm} takes it, a later "
                        "release may not",
                        f"write {longer[0]} in full",
                    )
                )
                flag = flags.by_name[longer[0]]
            else:
                close = _suggest(name, names)
                problems.append(
                    ArgProblem(
                        at,
                        f"vLLM {flags.vllm}'s `vllm serve` has no flag {raw}",
                        f"did you mean {close}?"
                        if close
                        else "see `vllm serve --help=all` for the flags",
                    )
                )
                # skip its value, if it looks like it has one
                if not has_inline and i < len(args) and not _is_flag(args[i]):
                    i += 1
                continue
        if flag.owned_by:
            problems.append(
                ArgProblem(
                    at,
                    f"{raw} is set from {flag.owned_by}: the unit passes it already, and a "
                    "second one here would silently win over what the spec says",
                    f"set {flag.owned_by} instead and drop {raw} from serve.extra_args",
                )
            )
        if flag.dest in seen and not dotted:
            problems.append(
                ArgProblem(
                    at,
                    f"{raw} is given twice in serve.extra_args (the last one wins)",
                    "keep one",
                )
            )
        seen.setdefault(flag.dest, at)
        value: str | None = None
        if not flag.takes_value:
            if has_inline:
                problems.append(ArgProblem(at, f"{raw} takes no value", f"write {raw} alone"))
        elif has_inline:
            value = inline
        elif flag.nargs in ("*", "?"):
            if i < len(args) and not _is_flag(args[i]):
                value = args[i]
                i += 1
        elif i < len(args) and not _is_flag(args[i]):
            value = args[i]
            i += 1
            if flag.nargs == "+":
                while i < len(args) and not _is_flag(args[i]):
                    i += 1
        else:
            problems.append(
                ArgProblem(at, f"{raw} needs a value", f"put its value after it: {raw} VALUE")
            )
        given[flag.dest] = value
        choices = flag.choices
        if value is not None and choices is not None and not dotted and value not in choices:
            problems.append(_choice(at, raw, value, choices, flags.vllm))
    for check in flags.value_checks:
        value = given.get(check.dest)
        if value is None or (check.unless and check.unless in given):
            continue
        if value not in check.choices and value.lower() != "none":
            problems.append(_choice(seen[check.dest], check.dest, value, check.choices, flags.vllm))
    return problems


def _choice(at: int, raw: str, value: str, choices: list[str], vllm: str) -> ArgProblem:
    close = _suggest(value, choices)
    shown = ", ".join(choices[:12]) + (" …" if len(choices) > 12 else "")
    flag = raw if raw.startswith("-") else "--" + raw.replace("_", "-")
    return ArgProblem(
        at,
        f"vLLM {vllm} has no {value!r} for {flag} (it takes {shown})",
        f"did you mean {close!r}?" if close else f"use one of the values vLLM {vllm} lists",
    )
