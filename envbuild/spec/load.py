"""Reading a spec file: TOML, ``extends`` and merging, the model's validation, and the files it
names. Everything wrong with the files is collected and raised at once as a SpecError (pydantic's
errors turned into located problems by :mod:`envbuild.spec.problems`)."""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from envbuild.errors import InputFileError, Problem, SpecError
from envbuild.fsio import compact_json, sha256_bytes, sha256_file
from envbuild.spec.locate import KeyPath, dotted, line_of, locate_keys
from envbuild.spec.model import Spec
from envbuild.spec.problems import validation_problems

_TOML_POS = re.compile(r"\(at line (\d+), column (\d+)\)")

#: How deep a spec's tables and arrays may nest (the deepest real one is 4: builds.X.env.KEY),
#: and how long a chain of ``extends`` and how many files in all it may name. Beyond these a
#: spec is refused, located, before anything recurses into it.
MAX_DEPTH = 64
MAX_EXTENDS = 32
MAX_FILES = 256


def shown_path(path: Path, given: Mapping[Path, str] | None = None) -> str:
    """How a spec file is named in every message about it (one rule for every command): as the
    user typed it when they named it (``given``, by resolved path); else relative to the current
    folder when it lies under it; else absolute. Each is a path the user can open from where
    they ran envbuild."""
    if given and path in given:
        return given[path]
    try:
        return str(path.relative_to(Path.cwd()))
    except (ValueError, OSError):  # not under the current folder, or that folder is gone
        return str(path)


@dataclass
class LoadedSpec:
    """A validated spec with where each of its values came from."""

    spec: Spec
    path: Path
    root: Path
    files: list[Path]
    raw: dict[str, Any]
    origins: dict[KeyPath, tuple[Path, int | None]] = field(default_factory=dict)
    #: the path the user typed for the spec file (None: shown by the rule for the others)
    given: str | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    def display(self, path: Path) -> str:
        """``path`` as messages name it (:func:`shown_path`)."""
        return shown_path(path, {self.path: self.given} if self.given is not None else None)

    def repo_path(self, path: Path) -> str:
        """``path`` relative to the repository, for what envbuild writes (the lock names its
        spec so): the same wherever envbuild runs from."""
        try:
            return path.relative_to(self.root).as_posix()
        except ValueError:
            return str(path)

    def where(self, key: KeyPath) -> tuple[str, int | None]:
        """The file (as :meth:`display` names it) and line that gave ``key`` its value."""
        for end in range(len(key), 0, -1):
            found = self.origins.get(tuple(key[:end]))
            if found is not None:
                return self.display(found[0]), found[1]
        return self.display(self.path), None

    def problem(self, key: KeyPath, message: str, hint: str | None = None, **kw: Any) -> Problem:
        file, line = self.where(key)
        return Problem(file, line, dotted(key), message, hint, **kw)

    def resolve(self, relative: str) -> Path:
        """A path the spec names, relative to the spec file that named it, made absolute."""
        return (self.path.parent / relative).resolve()

    def patch_files(self) -> dict[str, list[Path]]:
        return {
            dist: [self._origin_dir(("patches", dist, i)) / p for i, p in enumerate(files)]
            for dist, files in self.spec.patches.items()
        }

    def _origin_dir(self, key: KeyPath) -> Path:
        origin = self.origins.get(key) or self.origins.get(key[:-1])
        return (origin[0] if origin else self.path).parent

    def spec_hash(self) -> str:
        """sha256 of the merged spec and the content of every file it names."""
        spec = self.spec.model_dump(mode="json")
        if not spec["image"]["link_findings"]:  # added later: a spec without any keeps its hash
            del spec["image"]["link_findings"]
        payload = {
            "spec": spec,
            "patches": {
                dist: [sha256_file(p) for p in paths] for dist, paths in self.patch_files().items()
            },
        }
        return sha256_bytes(compact_json(payload))


def find_root(path: Path) -> Path:
    """The repository a spec belongs to: the nearest ancestor holding ``.git``; else the parent
    of the ``specs/`` folder the spec is in; else the spec's own folder."""
    path = path.resolve()
    for parent in path.parents:
        if (parent / ".git").exists():
            return parent
    for parent in path.parents:
        if parent.name == "specs":
            return parent.parent
    return path.parent


def read_toml(path: Path, shown: str) -> tuple[dict[str, Any], str]:
    """Parse one TOML file, named ``shown`` in messages. Problems with the file itself are raised
    as located errors."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise InputFileError(shown, "no such file", hint="check the path") from None
    except IsADirectoryError:
        raise InputFileError(shown, "is a directory, not a spec file") from None
    except OSError as exc:
        raise InputFileError(shown, f"cannot be read: {exc.strerror}") from None
    if not data.strip():
        raise SpecError([Problem(shown, None, "", "the file is empty", "write a spec; see README")])
    if b"\x00" in data:
        raise SpecError([Problem(shown, None, "", "this is a binary file, not a TOML spec")])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        at = data[: exc.start].count(b"\n") + 1
        raise SpecError([Problem(shown, at, "", "the file is not UTF-8 text")]) from None
    deep = _nesting_line(text)
    if deep is not None:
        raise SpecError([_too_deep(shown, deep, "")])
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        pos = _TOML_POS.search(message)
        where: int | None = int(pos.group(1)) if pos else None
        detail = _TOML_POS.sub("", message).strip()
        if pos:
            detail += f" (column {pos.group(2)})"
        raise SpecError(
            [Problem(shown, where, "", f"malformed TOML: {detail}", "fix the TOML syntax")]
        ) from None
    key = _deeper_than(doc, MAX_DEPTH)
    if key is not None:
        lines = locate_keys(text)
        # the first line that writes under it (a table header names the whole path at once)
        line = min((n for k, n in lines.items() if k[: len(key)] == key), default=None)
        if line is None:  # [[a.a]] headers are located without their indices
            names = tuple(p for p in key if isinstance(p, str))
            line = min((n for k, n in lines.items() if k[: len(names)] == names), default=None)
        raise SpecError([_too_deep(shown, line, dotted(key))])
    return doc, text


def _too_deep(shown: str, line: int | None, key: str) -> Problem:
    return Problem(
        shown,
        line,
        key,
        f"tables and arrays nest more than {MAX_DEPTH} deep",
        "a spec's tables are a few levels deep (docs/spec.md); flatten this one",
    )


def _nesting_line(text: str) -> int | None:
    """The line where the brackets of inline arrays and tables first nest deeper than
    :data:`MAX_DEPTH` (strings and comments skipped), before tomllib recurses into them; None
    when they do not."""
    depth, line, i, n = 0, 1, 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\n":
            line += 1
        elif ch == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif ch in "\"'":
            delim = text[i : i + 3] if text[i : i + 3] in ('"""', "'''") else ch
            j = i + len(delim)
            while j < n and not text.startswith(delim, j):
                if text[j] == "\\" and ch == '"':
                    j += 1
                elif text[j] == "\n" and len(delim) == 1:
                    break  # an unclosed one-line string: tomllib reports it
                j += 1
            line += text.count("\n", i, min(j, n))
            i = j + len(delim)
            continue
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return line
        elif ch in "]}":
            depth = max(depth - 1, 0)
        i += 1
    return None


def _deeper_than(data: dict[str, Any], limit: int) -> KeyPath | None:
    """The key path of a value nested deeper than ``limit`` (dotted keys and table headers
    nest too), found without recursion; None when there is none."""
    stack: list[tuple[Any, KeyPath]] = [(data, ())]
    while stack:
        value, key = stack.pop()
        if len(key) > limit:
            return key
        if isinstance(value, dict):
            stack.extend((v, (*key, k)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, (*key, i)) for i, v in enumerate(value))
    return None


def _merge(
    into: dict[str, Any],
    new: dict[str, Any],
    origins: dict[KeyPath, tuple[Path, int | None]],
    lines: dict[Any, int],
    path: Path,
    prefix: KeyPath = (),
) -> None:
    for key, value in new.items():
        here = (*prefix, key)
        origins[here] = (path, line_of(lines, here))
        if _mergeable(into.get(key), value):
            _merge(into[key], value, origins, lines, path, here)
        else:
            into[key] = _copy(value)
            for sub in _leaves(value, here):
                origins[sub] = (path, line_of(lines, sub))


def _mergeable(old: Any, new: Any) -> bool:
    """Tables merge, unless the newer one switches ``kind`` (``[base] kind = "image"`` over a
    Debian base): then it replaces the older one, whose keys mean nothing for the new kind."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return False
    return "kind" not in new or old.get("kind") == new["kind"]


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _leaves(value: Any, prefix: KeyPath) -> list[KeyPath]:
    out: list[KeyPath] = []
    if isinstance(value, dict):
        for k, v in value.items():
            out.append((*prefix, k))
            out.extend(_leaves(v, (*prefix, k)))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.append((*prefix, i))
            out.extend(_leaves(v, (*prefix, i)))
    return out


class _Loader:
    def __init__(self, root: Path, given: dict[Path, str] | None = None) -> None:
        self.root = root
        #: the path the user typed, by file: that file is named so in every message
        self.given = given or {}
        self.files: list[Path] = []
        self.origins: dict[KeyPath, tuple[Path, int | None]] = {}
        self.problems: list[Problem] = []

    def shown(self, path: Path) -> str:
        return shown_path(path, self.given)

    def where(self, key: KeyPath, top: Path) -> tuple[str, int | None]:
        """The file and line that gave ``key`` its value (``top``, no line, when none did)."""
        for end in range(len(key), 0, -1):
            found = self.origins.get(tuple(key[:end]))
            if found is not None:
                return self.shown(found[0]), found[1]
        return self.shown(top), None

    def load(self, path: Path, stack: tuple[Path, ...]) -> dict[str, Any]:
        data, text = read_toml(path, self.shown(path))
        self.files.append(path)
        lines = locate_keys(text)
        merged: dict[str, Any] = {}
        extends = data.pop("extends", [])
        if isinstance(extends, str):
            extends = [extends]
        if not isinstance(extends, list) or not all(isinstance(e, str) for e in extends):
            self.problems.append(
                Problem(
                    self.shown(path),
                    line_of(lines, ("extends",)),
                    "extends",
                    "must be a path or a list of paths",
                    'extends = "base/host.toml"',
                )
            )
            extends = []
        for rel in extends:
            line = line_of(lines, ("extends",))
            if "\0" in rel or not rel.strip():
                self.problems.append(
                    Problem(
                        self.shown(path),
                        line,
                        "extends",
                        f"{rel!r} is not a file name",
                        'name a spec file relative to this one: extends = "base/host.toml"',
                    )
                )
                continue
            target = (path.parent / rel).resolve()
            if not target.is_relative_to(self.root):
                self.problems.append(
                    Problem(
                        self.shown(path),
                        line,
                        "extends",
                        f"{rel!r} is outside the repository",
                        "keep shared bases under specs/base/",
                    )
                )
                continue
            if target in stack or target == path:
                chain = " -> ".join(self.shown(p) for p in (*stack, path, target))
                self.problems.append(
                    Problem(
                        self.shown(path),
                        line,
                        "extends",
                        f"extends cycle: {chain}",
                        "remove one of the extends",
                    )
                )
                continue
            if not target.is_file():
                self.problems.append(
                    Problem(
                        self.shown(path),
                        line,
                        "extends",
                        f"{rel!r} does not exist (looked for {self.shown(target)})",
                        "fix the path; it is relative to this file",
                    )
                )
                continue
            if len(stack) + 1 >= MAX_EXTENDS or len(self.files) >= MAX_FILES:
                self.problems.append(
                    Problem(
                        self.shown(path),
                        line,
                        "extends",
                        f"extends chains more than {MAX_EXTENDS} files deep"
                        if len(stack) + 1 >= MAX_EXTENDS
                        else f"extends names more than {MAX_FILES} files in all",
                        "extend a shared base directly instead of through a long chain",
                    )
                )
                break
            base = self.load(target, (*stack, path))
            _merge_plain(merged, base)
        _merge(merged, data, self.origins, lines, path)
        return merged


def _merge_plain(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if _mergeable(into.get(key), value):
            _merge_plain(into[key], value)
        else:
            into[key] = _copy(value)


def load_spec(path: Path | str, *, root: Path | None = None) -> LoadedSpec:
    """Read, merge and type-check a spec. Raises :class:`SpecError` with every problem found."""
    given = str(path)
    path = Path(path).absolute()
    root = (root or find_root(path)).resolve()
    path = path.resolve() if path.exists() else path
    loader = _Loader(root, {path: given})
    raw = loader.load(path, ())
    raw.setdefault("name", path.stem)
    if ("name",) not in loader.origins:
        loader.origins[("name",)] = (path, None)
    # A missing or refused extends leaves required keys unset: report the extends, not them.
    extends_failed = bool(loader.problems)
    spec: Spec | None = None
    try:
        spec = Spec.model_validate(raw)
    except ValidationError as exc:
        where = functools.partial(loader.where, top=path)
        loader.problems.extend(validation_problems(exc, raw, where, skip_missing=extends_failed))
    if spec is None:
        raise SpecError(loader.problems)
    loaded = LoadedSpec(spec, path, root, loader.files, raw, loader.origins, given)
    problems = loader.problems + _check_paths(loaded)
    if problems:
        raise SpecError(problems)
    return loaded


def _check_paths(loaded: LoadedSpec) -> list[Problem]:
    problems = []
    named: list[tuple[KeyPath, str, Path]] = []
    for dist, paths in loaded.patch_files().items():
        written = loaded.spec.patches[dist]
        named.extend((("patches", dist, i), written[i], p) for i, p in enumerate(paths))
    base = loaded.spec.base
    if base.kind in ("oci-layout", "rootfs"):
        where = loaded._origin_dir(("base", "path")) / base.path
        named.append((("base", "path"), base.path, where))
    for key, written_as, p in named:
        resolved = p.resolve()
        if not resolved.is_relative_to(loaded.root):
            problems.append(
                loaded.problem(
                    key,
                    f"{written_as!r} is outside the repository",
                    "keep files the spec names inside the repository",
                )
            )
        elif not resolved.exists():
            problems.append(
                loaded.problem(
                    key,
                    f"{loaded.display(resolved)} does not exist",
                    "fix the path; it is relative to the spec file",
                )
            )
    return problems
