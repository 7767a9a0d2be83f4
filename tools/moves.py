"""Module moves as data, and the rewriter that applies them (issue #27).

    python tools/moves.py [--dry-run]

``MOVES`` maps an old dotted module to its new one. For each row the rewriter ``git mv``s the file
(a package's ``__init__.py`` moves to the new module and a new ``__init__.py`` keeps only the old
docstring), creates missing package ``__init__.py``s, then rewrites every reference across
``envbuild/``, ``tests/``, ``tools/``, ``bench/`` and ``scripts/`` (all but this file): ``from
envbuild.x import y`` (per name, so a name that was re-exported by a package's ``__init__`` goes
to the module that defines it), ``from envbuild.x import moved_module``, ``import envbuild.x.y``,
relative imports, dotted names in strings and comments (``mock.patch("envbuild.x.y.name")``) and
file paths (``"x/y.py"``).
It ends with ``ruff check --select I --fix`` and ``ruff format`` on the files it changed. A row
whose old module is already moved (its new module exists) is not moved again but its references
are still rewritten, so running it twice changes nothing the second time, and a merged tree can
be rewritten again.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("envbuild", "tests", "tools", "bench", "scripts")

# old module -> new module. A package (its __init__) moving to a child keeps the package.
MOVES: dict[str, str] = {
    "envbuild.lock": "envbuild.lock.core",
    "envbuild.registry": "envbuild.registry.core",
    "envbuild.linkcheck": "envbuild.linkcheck.core",
    "envbuild.proc": "envbuild.proc.core",
    "envbuild.snapshot": "envbuild.snapshot.core",
    "envbuild.templates": "envbuild.templates.core",
    "envbuild.build.pipeline": "envbuild.pipeline.core",
    # the plan of a whole build lists its source builds, and a Dockerfile export renders that
    # plan: both sit above sourcebuild, beside the pipeline
    "envbuild.build.planner": "envbuild.pipeline.planner",
    "envbuild.build.dockerfile": "envbuild.pipeline.dockerfile",
    "envbuild.snapshot.hashing": "envbuild.installed.hashing",
    "envbuild.build.wheelpaths": "envbuild.installed.wheelpaths",
    "envbuild.build.wheels": "envbuild.lock.wheels",
    "envbuild.sourcebuild.closure": "envbuild.lock.closure",
    # the last package __init__s that held code (the CLI's entry point, models, checks)
    "envbuild.cli": "envbuild.cli.main",
    "envbuild.snapshot.model": "envbuild.snapshot.model.core",
    "envbuild.spec.checks": "envbuild.spec.checks.core",
    "envbuild.oci": "envbuild.oci.core",
    "envbuild.build.base": "envbuild.build.base.core",
}


def path_of(module: str, root: Path = ROOT) -> Path:
    """The file of ``module``: ``x/y.py``, or ``x/y/__init__.py`` for a package."""
    base = root.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _docstring(text: str) -> str:
    doc = ast.get_docstring(ast.parse(text), clean=False)
    return f'"""{doc}"""\n' if doc else ""


def _reexports(text: str) -> dict[str, str]:
    """The names a module imports at its top level from other envbuild modules: name → module."""
    out: dict[str, str] = {}
    for node in ast.parse(text).body:
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").startswith("envbuild.")
        ):
            for a in node.names:
                out[a.asname or a.name] = node.module or ""
    return out


class Move:
    def __init__(self, old: str, new: str, root: Path) -> None:
        self.old, self.new = old, new
        self.package = new.startswith(old + ".")  # a package __init__ moving into the package
        self.reexports: dict[str, str] = {}
        self.root = root
        self.moved_now = False  # moved by this run (else moved before: references still rewritten)

    def child_module(self, name: str) -> bool:
        """Whether ``old.name`` is a module or package of its own (after the move)."""
        base = self.root.joinpath(*self.old.split("."), name)
        return base.is_dir() or base.with_suffix(".py").exists()

    def target_of(self, name: str) -> str:
        """Where ``from old import name`` must now import ``name`` from."""
        if self.package and self.child_module(name):
            return self.old
        return self.reexports.get(name, self.new)


def do_moves(moves: dict[str, str], root: Path, dry: bool) -> list[Move]:
    done = []
    for old, new in moves.items():
        m = Move(old, new, root)
        src = path_of(old, root)
        dest = root.joinpath(*new.split(".")).with_suffix(".py")
        if dest.exists():  # moved before: rewrite what still names the old module
            if m.package:
                m.reexports = _reexports(dest.read_text())
            done.append(m)
            continue
        if not src.exists():
            print(f"skip {old}: neither it nor {new} exists")
            continue
        text = src.read_text()
        if m.package:
            m.reexports = _reexports(text)
        print(f"move {old} -> {new}")
        m.moved_now = True
        done.append(m)
        if dry:
            continue
        for parent in list(dest.parents)[::-1]:
            if root in parent.parents and parent != root and not parent.exists():
                parent.mkdir()
                init = parent / "__init__.py"
                name = ".".join(parent.relative_to(root).parts)
                init.write_text(f'"""{name}: see the modules."""\n')
                subprocess.run(["git", "add", str(init)], cwd=root, check=True)
        subprocess.run(["git", "mv", str(src), str(dest)], cwd=root, check=True)
        if m.package:
            src.write_text(_docstring(text))
            subprocess.run(["git", "add", str(src)], cwd=root, check=True)
    return done


def _absolute(node: ast.ImportFrom, me: str, is_pkg: bool) -> str:
    base = node.module or ""
    if not node.level:
        return base
    pkg = me if is_pkg else me.rpartition(".")[0]
    for _ in range(node.level - 1):
        pkg = pkg.rpartition(".")[0]
    return f"{pkg}.{base}" if base else pkg


def _render(module: str, names: list[tuple[str, str | None]], indent: str) -> str:
    parts = ", ".join(n if a is None or a == n else f"{n} as {a}" for n, a in names)
    return f"{indent}from {module} import {parts}"


def rewrite_file(path: Path, moves: list[Move], root: Path, old_name: str) -> str:
    """The text of ``path`` with every reference to a moved module rewritten. ``old_name`` is
    the module's name before the moves (relative imports resolve against it)."""
    text = path.read_text()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    by_old = {m.old: m for m in moves}
    lines = text.splitlines(keepends=True)
    # relative imports resolve against where the file was: a moved package __init__ is a package
    was_pkg = path.name == "__init__.py" or any(m.package and m.old == old_name for m in moves)
    moved = old_name in by_old and by_old[old_name].moved_now
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = _absolute(node, old_name, was_pkg)
        if not base.startswith("envbuild"):
            continue
        groups: dict[str, list[tuple[str, str | None]]] = {}
        changed = node.level > 0 and moved  # made absolute: the file moved
        for a in node.names:
            full = f"{base}.{a.name}"
            if full in by_old and not by_old[full].package:  # a moved module, by name
                new = by_old[full].new
                parent, _, leaf = new.rpartition(".")
                groups.setdefault(parent, []).append((leaf, a.asname or a.name))
                changed = True
            elif base in by_old:
                target = by_old[base].target_of(a.name)
                if target in by_old and not by_old[target].package:  # re-exported from a move
                    target = by_old[target].new
                changed |= target != base
                groups.setdefault(target, []).append((a.name, a.asname))
            elif full in by_old:  # a package whose __init__ moved, imported by name
                new = by_old[full].new
                parent, _, leaf = new.rpartition(".")
                groups.setdefault(parent, []).append((leaf, a.asname or a.name))
                changed = True
            else:
                groups.setdefault(base, []).append((a.name, a.asname))
        if not changed:
            continue
        first = lines[node.lineno - 1]
        indent = first[: len(first) - len(first.lstrip())]
        last = lines[(node.end_lineno or node.lineno) - 1]
        tail = last[node.end_col_offset :].rstrip("\n")  # a trailing comment (noqa) stays
        new_text = "\n".join(_render(mod, names, indent) + tail for mod, names in groups.items())
        edits.append((node.lineno, node.end_lineno or node.lineno, new_text + "\n"))
    for start, end, new_text in sorted(edits, reverse=True):
        lines[start - 1 : end] = [new_text]
    text = "".join(lines)
    return _rename_paths(_rename_dotted(_rename_in_strings(text, moves), moves), moves)


def _rename_in_strings(text: str, moves: list[Move]) -> str:
    """``from envbuild.x import y`` left in the text after the real imports were rewritten: code
    in strings (a ``python -c`` script a test runs), one name per import (a list that names a
    moved module is left for a hand edit)."""
    plain = {m.old: m.new for m in moves if not m.package}
    for m in sorted(moves, key=lambda m: m.package):  # module moves first: a package's child
        parent, _, leaf = m.old.rpartition(".")
        if not m.package:
            new_parent, _, new_leaf = m.new.rpartition(".")
            alias = "" if new_leaf == leaf else f" as {leaf}"
            text = re.sub(
                rf"\bfrom {re.escape(parent)} import {leaf}\b(?! as)(?!,)(?!\s*,)",
                f"from {new_parent} import {new_leaf}{alias}",
                text,
            )
        else:

            def sub(match: re.Match[str], m: Move = m) -> str:
                name = match.group(1)
                return (
                    match.group(0)
                    if m.child_module(name)
                    else f"from {plain.get(t := m.target_of(name), t)} import {name}"
                )

            text = re.sub(rf"\bfrom {re.escape(m.old)} import (\w+)\b(?!,)", sub, text)
    return text


def _rename_paths(text: str, moves: list[Move]) -> str:
    """File paths of moved modules written in the text (``"linkcheck/__init__.py:demangle"`` in
    an inventory a test keeps), with or without the leading ``envbuild/``."""
    for m in moves:
        old = "/".join(m.old.split(".")[1:]) + ("/__init__.py" if m.package else ".py")
        new = "/".join(m.new.split(".")[1:]) + ".py"
        text = re.sub(
            rf"(?<![\w/.])((?:envbuild/)?){re.escape(old)}(?![\w/])", rf"\g<1>{new}", text
        )
    return text


def _rename_dotted(text: str, moves: list[Move]) -> str:
    """``envbuild.old`` and ``envbuild.old.name`` in the rest of the text (``import`` lines,
    attribute chains, mock.patch strings, comments)."""
    for m in sorted(moves, key=lambda m: -len(m.old)):
        pattern = re.compile(rf"(?<![\w.]){re.escape(m.old)}(?:\.(\w+))?(?![\w])")

        def sub(match: re.Match[str], m: Move = m) -> str:
            name = match.group(1)
            if m.package:
                if name is None or m.child_module(name):
                    return match.group(0)
                return f"{m.new}.{name}"
            return m.new + (f".{name}" if name else "")

        text = pattern.sub(sub, text)
    return text


def _module_of(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def main(
    argv: list[str] | None = None, root: Path = ROOT, table: dict[str, str] | None = None
) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="list the moves, change nothing")
    args = ap.parse_args(argv)
    before = {p: _module_of(p, root) for tree in TREES for p in sorted((root / tree).rglob("*.py"))}
    moves = do_moves(MOVES if table is None else table, root, args.dry_run)
    if args.dry_run or not moves:
        return 0
    changed = []
    for tree in TREES:
        for p in sorted((root / tree).rglob("*.py")):
            if p.resolve() == Path(__file__).resolve():
                continue  # its own table names the old modules
            old_name = before.get(p, _module_of(p, root))
            for m in moves:
                dest = root.joinpath(*m.new.split(".")).with_suffix(".py")
                if p == dest and m.moved_now:
                    old_name = m.old
            text = p.read_text()
            out = rewrite_file(p, moves, root, old_name)
            if out != text:
                p.write_text(out)
                changed.append(str(p.relative_to(root)))
    if changed:
        ruff = str(Path(sys.executable).with_name("ruff"))
        fix = [ruff, "check", "--select", "I", "--fix", "--exit-zero", "-q"]
        subprocess.run([*fix, *changed], cwd=root, check=True)
        subprocess.run([ruff, "format", "-q", *changed], cwd=root, check=True)
    print(f"rewrote {len(changed)} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
