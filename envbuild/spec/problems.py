"""pydantic's validation errors about a spec, as located problems: each at the file and line of
its key, its dotted key written as the spec writes it (pydantic's union and tag markers dropped),
and a hint: the key to add, the close match of an unknown key (or the keys allowed there), how to
write a value of the right type.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from envbuild.errors import Problem
from envbuild.spec.locate import KeyPath, dotted
from envbuild.spec.model import Spec


def validation_problems(
    exc: ValidationError,
    raw: dict[str, Any],
    where: Callable[[KeyPath], tuple[str, int | None]],
    *,
    skip_missing: bool = False,
) -> list[Problem]:
    """Each of pydantic's errors about ``raw`` (the merged spec) as a problem at the file and
    line ``where`` gives for its key, with a hint; ``skip_missing`` leaves out "is required"."""
    out = []
    for err in exc.errors(include_url=False):
        if skip_missing and err["type"] == "missing":
            continue
        loc = _clean_loc(err["loc"])
        file, line = where(loc)
        message, hint = _describe(err, loc, raw)
        out.append(Problem(file, line, dotted(loc), message, hint))
    return out


def _clean_loc(loc: tuple[Any, ...]) -> KeyPath:
    """Drop pydantic's union/tag markers (``base.debian.packages`` → ``base.packages``)."""
    out: list[str | int] = []
    for i, part in enumerate(loc):
        if (
            i > 0
            and loc[0] == "base"
            and i == 1
            and part in {"debian", "image", "oci-layout", "rootfs"}
        ):
            continue
        if isinstance(part, str) and (
            part.startswith(("function-", "tagged-union")) or part == "[key]"
        ):
            continue  # "[key]": the error is about the dict key just before it
        out.append(part)
    return tuple(out)


def _describe(err: Any, loc: KeyPath, raw: dict[str, Any]) -> tuple[str, str | None]:
    kind = err["type"]
    msg = str(err["msg"]).removeprefix("Value error, ")
    table = dotted(loc[:-1])
    if kind == "missing":
        where = f"[{table}]" if table else "the top level"
        return "is required", f"add `{loc[-1]} = …` to {where}"
    if kind == "extra_forbidden":
        allowed = _allowed_keys(loc[:-1], raw)
        close = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        if close:
            return "unknown key", f"did you mean `{close[0]}`?"
        return "unknown key", f"remove it; allowed here: {', '.join(sorted(allowed))}"
    if kind in {"union_tag_invalid", "union_tag_not_found"}:
        return msg, "set kind to one of debian, image, oci-layout, rootfs"
    value = err.get("input")
    if kind.endswith("_type") or kind.endswith("_parsing"):
        return f"{msg}, got {_short(value)}", _TYPE_HINTS.get(kind.split("_")[0])
    return msg, None


_TYPE_HINTS = {
    "string": 'quote it: key = "value"',
    "int": "write a whole number without quotes: key = 8",
    "float": "write a number without quotes: key = 0.9",
    "bool": "write true or false, without quotes",
    "list": 'write a list: key = ["a", "b"]',
    "dict": "write a table: [name] with key = value lines",
    "model": "write a table: [name] with key = value lines",
    "datetime": "write a TOML date-time without quotes: 2026-11-01T00:00:00Z",
}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _allowed_keys(loc: KeyPath, raw: dict[str, Any]) -> list[str]:
    model: Any = Spec
    data: Any = raw
    for part in loc:
        data = data.get(part) if isinstance(data, dict) else None
        model = _field_type(model, part, data)
        if model is None:
            return []
    if isinstance(model, type) and issubclass(model, BaseModel):
        return list(model.model_fields)
    return []


def _field_type(model: Any, part: str | int, data: Any) -> Any:
    if isinstance(model, type) and issubclass(model, BaseModel):
        info = model.model_fields.get(str(part))
        if info is None:
            return None
        return _unwrap(info.annotation, data)
    return None


def _unwrap(annotation: Any, data: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0], data)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        kind = data.get("kind") if isinstance(data, dict) else None
        for option in options:
            inner = _unwrap(option, data)
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                tag = inner.model_fields.get("kind")
                if tag is None or kind is None or kind in typing.get_args(tag.annotation):
                    return inner
        return None
    return annotation
