#!/usr/bin/env python3
"""One name per idea (issue #27): the rename table and the rewriter that applies it.

Run ``python tools/renames.py`` from the repository root to apply every rename (``git mv`` of
modules, identifiers, doc mentions); ``--check`` changes nothing and exits 1 while any old name
remains in its scope (``tests/test_renames.py`` runs it). The table is data, so the same renames
can be applied again after other branches are merged: the rewriter is idempotent.

The names chosen, and why:

* **realize**, US spelling, in code and prose (the code already said ``realize``, ``Realized``,
  ``RealizedWheel`` ~130 times against ~70 ``realise``). To *realize* something is the store's
  one idea: have it, reused when its inputs were seen before, else made (Nix's word). So
  ``Store.build`` is :meth:`Store.realize` (it already returned a ``Realized``), and the callback it
  runs when nothing is stored is a *produce* function, not a ``builder`` (a
  :class:`~envbuild.sourcebuild.builder.Builder` is the thing that compiles sdists).
* **build** is the ``envbuild.build`` package and the ``envbuild build`` command, and
  ``Builder`` compiles source builds. ``apply/builder.py`` built no Builder: it realizes a
  generation (reuse a verified one, or build one), so it is ``apply/realize.py``: its ``realize``
  returns a ``RealizedGeneration``, and its ``build`` is ``build_generation``.
  ``sourcebuild/realise.py`` is ``sourcebuild/realize.py`` (its function was ``realize`` already).
* **target**: ``VenvTarget`` (where an install goes) stays. The lock's ``Target`` (what a spec is
  resolved *for*: Python, platform tag, cutoff, indexes) is ``ResolveTarget`` in
  ``lock/resolvetarget.py``, made by ``resolve_target_of``. ``TargetGpu`` (a ``[host]`` GPU entry
  with the knowledge base's values) is ``SpecGpu`` / ``spec_gpus``; the planner's ``target_of``
  (a ``VenvTarget``) is ``venv_target_of``. A symlink's target and the
  generation a switch goes to are plain local words and stay.
* **layout**: an OCI image layout stays *layout* (``oci.layout``, ``open_layout``, ``LayoutImage``).
  The facts an install tree is keyed by (Python, installer, relocatable rules) are the install
  *recipe*: ``assemble.layout()`` → ``install_recipe()``, ``Assembler.layout`` → ``recipe``.
  ``TreeMeta.layout`` (and so ``store/trees.py``'s ``layout`` parameters) and the derivation
  inputs keep the key ``"layout"``: it is on disk, and renaming it would change every tree key,
  so nothing on disk changes and no reader needs an alias.
* **lock** is the PEP 751 lock (``pylock.<name>.toml``) and ``envbuild lock``. An ``flock`` held
  around something is a *guard*: ``Flock`` → ``FileGuard``, ``Store.lock(key)`` →
  ``Store.guard(key)``, ``gc_lock`` → ``gc_guard``, ``lock_output`` → ``guard_output``,
  ``state_lock`` → ``state_guard`` in ``apply/stateguard.py``, ``Paths.lock`` →
  ``Paths.guard_file``, ``BlobStore.locks`` → ``guards``, ``scratch.locked_folder`` →
  ``guarded_folder``. The files on disk keep their names (``locks/``, ``gc.lock``,
  ``.envbuild.lock``, the state dir's ``lock``): old stores and state dirs keep working.

Scopes: a :class:`Module` moves a file and rewrites its dotted path (imports, ``mock.patch`` /
``monkeypatch`` strings, ``:mod:`` references, ``a/b.py`` mentions); a :class:`Name` renames NAME
tokens (never a substring of another name) in the files it covers, and with ``text`` whole words
in comments, strings and Markdown too; an :class:`Attr` renames ``.old`` only after one of the
given receivers (a method of one class: a call through a receiver not listed, say new code's
``cache.build``, is not seen, so list it), and ``def old`` in the given files; a :class:`Text`
replaces words in comments, strings and Markdown only. ``bench/RESULTS.md`` is left as it is: it
records what was measured, by the names of that day. The rewritten files are then sorted and
formatted by ``ruff`` (on PATH: the project's venv).
"""

from __future__ import annotations

import argparse
import difflib
import io
import re
import shutil
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What the renames cover: Python sources and the Markdown docs (not the measured history).
PY_GLOBS = ("envbuild/*", "tests/*", "bench/*", "tools/*", "scripts/*")
MD_SKIP = ("bench/RESULTS.md",)
SELF = "tools/renames.py"
KEEP = "renames: keep"
#: The test of this tool quotes old names on purpose.
SKIP = (SELF, "tests/test_renames.py")


@dataclass(frozen=True)
class Module:
    old: str  # a path from the root: envbuild/apply/builder.py
    new: str

    @staticmethod
    def dotted(path: str) -> str:
        return path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


@dataclass(frozen=True)
class Name:
    old: str
    new: str
    files: tuple[str, ...] = ("*",)  # fnmatch globs of the files it applies in
    text: bool = False  # also whole words in comments, strings and Markdown
    keywords: bool = True  # also as a keyword argument (old=...) in a call


@dataclass(frozen=True)
class Attr:
    old: str
    new: str
    receivers: tuple[str, ...]  # the name before the dot: store in store.build(...)
    files: tuple[str, ...] = ("*",)
    defs: tuple[str, ...] = ()  # files where `def old` (or `old` at class level) is renamed


@dataclass(frozen=True)
class Text:
    old: str  # a regular expression, matched in comments, strings and Markdown
    new: str
    files: tuple[str, ...] = ("*",)


Rule = Module | Name | Attr | Text

_PRODUCERS = (
    "envbuild/build/layerbuild.py",
    "envbuild/build/links.py",
    "envbuild/build/basestage.py",
    "envbuild/build/overlaps.py",
    "envbuild/build/base/rootfs.py",
    "envbuild/build/base/debian.py",
    "envbuild/build/base/registry.py",
    "envbuild/store/core.py",
    "envbuild/store/remote.py",
    "tests/store/test_core.py",
)
_STORES = ("store", "first", "second", "victim", "cache", "local")

RULES: tuple[Rule, ...] = (
    # realize
    Module("envbuild/sourcebuild/realise.py", "envbuild/sourcebuild/realize.py"),
    Module("envbuild/apply/builder.py", "envbuild/apply/realize.py"),
    Name("Realised", "RealizedGeneration", text=True),
    Name("realise", "realize", ("envbuild/apply/*", "bench/apply.py", "tests/*")),
    Name("build", "build_generation", ("envbuild/apply/realize.py",)),
    Name("realised", "realized", ("envbuild/apply/core.py",)),
    # bench/apply.py --before runs this in another checkout, maybe one from before the renames
    Text(
        r"from envbuild\.apply\.realize import realise\n",
        "try:\n    from envbuild.apply.realize import realize\n"
        "except ImportError:  # a checkout from before issue #27's renames\n"
        "    from envbuild.apply.builder import realise as realize  # renames: keep\n",
        ("bench/apply.py",),
    ),
    Text(r"`realise`", "`realize`", ("README.md", "docs/*")),
    Text(r"\b([Rr])ealis(e|ed|es|ing)\b", r"\1ealiz\2"),
    # build: Store.build realizes a derivation; what it runs is a produce function
    Attr("build", "realize", _STORES, defs=("envbuild/store/core.py", "envbuild/store/remote.py")),
    Text(r"\bStore\.build\b", "Store.realize"),
    Text(r"\bstore\.build\(", "store.realize("),
    Text(r"inputs, builder\)", "inputs, produce)", ("envbuild/store/core.py",)),
    Text(r":meth:`build`", ":meth:`realize`", ("envbuild/store/*",)),
    Name("builder", "produce", _PRODUCERS),
    Text(r"``builder``", "``produce``", ("envbuild/store/*",)),
    Text(r"\bits builder\b", "its producer", ("envbuild/store/*",)),
    Text(r"\ba builder (returns|and)\b", r"a producer \1", ("envbuild/store/*",)),
    Text(r"\bpull\.builder\b", "pull.produce", ("tests/test_argv_audit.py",)),
    Text(r"builder\(\) -> Output", "produce() -> Output", ("envbuild/store/core.py",)),
    # target
    Module("envbuild/lock/target.py", "envbuild/lock/resolvetarget.py"),
    Name("Target", "ResolveTarget", ("envbuild/lock/*", "tests/*", "bench/*")),
    Name("target_of", "resolve_target_of", ("envbuild/lock/*", "tests/test_argv_audit.py")),
    Name("target_of", "venv_target_of", ("envbuild/pipeline/planner.py",)),
    Name("TargetGpu", "SpecGpu", text=True),
    Name("target_gpus", "spec_gpus", text=True),
    # layout: the install recipe (OCI layouts keep the word)
    # (TreeMeta.layout and the derivation inputs' "layout" are on disk: they stay)
    Attr("layout", "recipe", ("self",), ("envbuild/apply/assemble.py",)),
    Name("layout", "install_recipe", ("envbuild/apply/assemble.py",), keywords=False),
    # lock: the PEP 751 file; an flock is a guard
    Module("envbuild/apply/statelock.py", "envbuild/apply/stateguard.py"),
    Name("Flock", "FileGuard", text=True),
    Name("state_lock", "state_guard", text=True),
    Name("gc_lock", "gc_guard", text=True),
    Name("lock_output", "guard_output", text=True),
    Name("LOCK_FILE", "GUARD_FILE", ("envbuild/build/outputs.py",)),
    Name("_session_lock", "_session_guard", ("envbuild/store/*",)),
    Name("lock", "guard", ("envbuild/store/blobs.py",)),
    Name("locked_folder", "guarded_folder", text=True),
    Name("_locked", "_guarded", ("envbuild/scratch.py",)),
    Attr("lock", "guard", ("self",), ("envbuild/store/*",), ("envbuild/store/core.py",)),
    Text(r":meth:`lock`", ":meth:`guard`", ("envbuild/store/*",)),
    Attr("locks", "guards", ("self", "store"), ("envbuild/store/*", "tests/store/*")),
    Attr(
        "lock",
        "guard_file",
        ("paths",),
        ("envbuild/apply/stateguard.py", "tests/apply/*"),
        ("envbuild/apply/paths.py",),
    ),
    Text(r"\bpaths\.lock\b", "paths.guard_file", ("envbuild/apply/stateguard.py", "tests/apply/*")),
    # the README's map names the renamed modules
    Text(
        r"\| generations \(`assemble`:",
        "| generations (`realize`: reuse a verified one or build one; `assemble`:",
        ("README.md",),
    ),
    Text(
        r"PEP 751 lock \(`resolve`, ",
        "PEP 751 lock (`resolvetarget`: what it is resolved for, `resolve`, ",
        ("README.md",),
    ),
)


def _covers(globs: tuple[str, ...], rel: str) -> bool:
    return any(fnmatch(rel, g) for g in globs)


def _moved(rel: str) -> str:
    """Where ``rel`` is once the modules have moved (scopes name the new paths)."""
    for rule in RULES:
        if isinstance(rule, Module) and rel == rule.old:
            return rule.new
    return rel


def _module_patterns() -> list[tuple[re.Pattern[str], str]]:
    out = []
    for m in (r for r in RULES if isinstance(r, Module)):
        old, new = Module.dotted(m.old), Module.dotted(m.new)
        out.append((re.compile(rf"(?<![\w.]){re.escape(old)}(?!\w)"), new))
        rel_old, rel_new = m.old.removeprefix("envbuild/"), m.new.removeprefix("envbuild/")
        out.append((re.compile(rf"(?<![\w.]){re.escape(rel_old)}(?!\w)"), rel_new))
        # the leaf in a README table or a `:mod:`-less mention: `realise` is covered by Text rules
    return out


def rewrite_text(text: str, rel: str) -> str:
    """Comments, strings and Markdown: module paths, whole words of text rules. A line marked
    ``renames: keep`` keeps its old names (a fallback for an old checkout, an alias)."""
    steps: list[tuple[str, str]] = [(p.pattern, new) for p, new in _module_patterns()]
    for rule in RULES:
        if isinstance(rule, Text) and _covers(rule.files, rel):
            steps.append((rule.old, rule.new))
        elif isinstance(rule, Name) and rule.text and _covers(rule.files, rel):
            steps.append((rf"(?<!\w){re.escape(rule.old)}(?!\w)", rule.new))
    for pattern, new in steps:  # each step sees what the one before wrote, keep marks included
        text = "".join(
            line if KEEP in line else re.sub(pattern, new, line) for line in _lines(text)
        )
    return text


def _lines(text: str) -> list[str]:
    return text.splitlines(keepends=True) or [text]


def _rewrite_fields(text: str, rel: str) -> str:
    """The code in an f-string's replacement fields (one STRING token before Python 3.12)."""

    def field(m: re.Match[str]) -> str:
        code = m.group(0)
        for rule in sorted(RULES, key=lambda r: not isinstance(r, Attr)):
            if isinstance(rule, Attr) and _covers(rule.files, rel):
                who = "|".join(map(re.escape, rule.receivers))
                code = re.sub(rf"\b({who})\.{re.escape(rule.old)}(?!\w)", rf"\1.{rule.new}", code)
            elif isinstance(rule, Name) and _covers(rule.files, rel):
                code = re.sub(rf"(?<![\w.]){re.escape(rule.old)}(?!\w)", rule.new, code)
        return code

    return re.sub(r"(?<!\{)\{(?!\{)[^{}]*\}", field, text)


def _dotted_runs(toks: list[tokenize.TokenInfo]) -> list[tuple[int, int]]:
    """Index ranges [i, j] of NAME ( . NAME )* runs."""
    runs, i = [], 0
    while i < len(toks):
        if toks[i].type == tokenize.NAME and (i == 0 or toks[i - 1].string != "."):
            j = i
            while (
                j + 2 < len(toks)
                and toks[j + 1].string == "."
                and toks[j + 2].type == tokenize.NAME
            ):
                j += 2
            runs.append((i, j))
            i = j + 1
        else:
            i += 1
    return runs


def rewrite_python(source: str, rel: str) -> str:
    """The source with every rule applied that covers ``rel``; tokens only, so the rest stays."""
    toks = [
        t
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
        or t.string
    ]
    code = [t for t in toks if t.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE)]
    edits: dict[tuple[tuple[int, int], tuple[int, int]], str] = {}
    modules = {Module.dotted(m.old): Module.dotted(m.new) for m in RULES if isinstance(m, Module)}
    # dotted module paths: envbuild.apply.builder(.x) and `from envbuild.apply import builder`
    local: dict[str, str] = {}
    for i, j in _dotted_runs(code):
        names = [code[k].string for k in range(i, j + 1, 2)]
        for n in range(len(names), 0, -1):
            full = ".".join(names[:n])
            if full in modules:
                last = code[i + 2 * (n - 1)]
                edits[(code[i].start, last.end)] = modules[full]
                break
        if (
            i >= 1
            and code[i - 1].string == "from"
            and j + 1 < len(code)
            and code[j + 1].string == "import"
        ):
            k = j + 2
            while k < len(code) and code[k].type in (tokenize.NAME, tokenize.OP):
                tok = code[k]
                if tok.type == tokenize.OP and tok.string not in ",()":
                    break
                full = ".".join(names) + "." + tok.string
                if tok.type == tokenize.NAME and full in modules:
                    new_leaf = modules[full].rsplit(".", 1)[1]
                    edits[(tok.start, tok.end)] = new_leaf
                    if not (k + 1 < len(code) and code[k + 1].string == "as"):
                        local[tok.string] = new_leaf
                k += 1
    for idx, tok in enumerate(code):
        prev = code[idx - 1].string if idx else ""
        before = code[idx - 2] if idx >= 2 else None
        if tok.type != tokenize.NAME:
            continue
        where = (tok.start, tok.end)
        if tok.string in local and prev != "." and where not in edits:
            edits[where] = local[tok.string]
        # an Attr (one class's method) wins over a Name of the same word
        for rule in sorted(RULES, key=lambda r: not isinstance(r, Attr)):
            if not isinstance(rule, (Name, Attr)) or rule.old != tok.string or where in edits:
                continue
            if isinstance(rule, Attr):
                after = prev == "." and before is not None and before.string in rule.receivers
                if (after and _covers(rule.files, rel)) or (
                    prev == "def" and _covers(rule.defs, rel)
                ):
                    edits[where] = rule.new
            elif _covers(rule.files, rel):
                nxt = code[idx + 1].string if idx + 1 < len(code) else ""
                if not rule.keywords and nxt == "=" and prev in ("(", ","):
                    continue
                edits[where] = rule.new
    for tok in toks:
        if tok.type in (tokenize.STRING, tokenize.COMMENT):
            new = rewrite_text(tok.string, rel)
            prefix = re.match(r"[A-Za-z]*", tok.string)
            if tok.type == tokenize.STRING and prefix and "f" in prefix.group(0).lower():
                new = "".join(
                    line if KEEP in line else _rewrite_fields(line, rel) for line in _lines(new)
                )
            if new != tok.string:
                edits[(tok.start, tok.end)] = new
    kept = {n for n, line in enumerate(source.splitlines(), 1) if KEEP in line}
    return _apply(source, {k: v for k, v in edits.items() if k[0][0] not in kept})


def _apply(source: str, edits: dict[tuple[tuple[int, int], tuple[int, int]], str]) -> str:
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(pos: tuple[int, int]) -> int:
        return starts[pos[0] - 1] + pos[1]

    out, last = [], 0
    for (start, end), new in sorted(edits.items()):
        a, b = offset(start), offset(end)
        if a < last:  # nested in an edit already made (a module path inside a string)
            continue
        out += [source[last:a], new]
        last = b
    out.append(source[last:])
    return "".join(out)


def tracked() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "*.py", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return sorted(p for p in listed if (ROOT / p).exists())


def rewrite_file(rel: str) -> tuple[str, str] | None:
    """(old, new) text of ``rel`` (its path after the moves) when a rule changes it."""
    if rel in SKIP or rel in MD_SKIP:
        return None
    text = (ROOT / rel).read_text()
    if rel.endswith(".py"):
        if not _covers(PY_GLOBS, rel):
            return None
        new = rewrite_python(text, _moved(rel))
    else:
        new = rewrite_text(text, rel)
    return (text, new) if new != text else None


def _changed_lines(old: str, new: str) -> list[tuple[int, str]]:
    """The lines of ``old`` that a rewrite changes (numbered from 1)."""
    a = old.splitlines()
    ops = difflib.SequenceMatcher(None, a, new.splitlines(), autojunk=False).get_opcodes()
    return [(n + 1, a[n]) for tag, i, j, _k, _l in ops if tag != "equal" for n in range(i, j)]


def _format(paths: list[str]) -> None:
    """Names change length: imports are sorted again and lines wrapped as ``ruff`` does."""
    if paths:
        ruff = shutil.which("ruff") or "ruff"  # the project's pinned one (on PATH in the venv)
        fix = [ruff, "check", "--select", "I", "--fix", "-q", *paths]
        subprocess.run(fix, cwd=ROOT, check=False)  # other findings are not this tool's
        subprocess.run([ruff, "format", "-q", *paths], cwd=ROOT, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if old names remain"
    )
    args = parser.parse_args(argv)
    remaining, changed = 0, []
    for rule in RULES:
        if isinstance(rule, Module) and (ROOT / rule.old).exists():
            if args.check:
                print(f"{rule.old}: still there (move it to {rule.new})")
                remaining += 1
            else:
                subprocess.run(["git", "mv", rule.old, rule.new], cwd=ROOT, check=True)
    for rel in tracked():
        got = rewrite_file(rel)
        if got is None:
            continue
        if args.check:
            for n, line in _changed_lines(*got):
                print(f"{rel}:{n}: old name: {line.strip()[:100]}")
                remaining += 1
        else:
            (ROOT / rel).write_text(got[1])
            changed.append(rel)
            print(f"rewrote {rel}")
    if changed:
        _format([rel for rel in changed if rel.endswith(".py")])
    if args.check and remaining:
        print(f"{remaining} old names remain: run python tools/renames.py", file=sys.stderr)
    return 1 if remaining else 0


if __name__ == "__main__":
    sys.exit(main())
