"""The package's shape, checked: modules at the root, module sizes, import cycles.

    python tools/layout_check.py [--lazy] [--json]

Import cycles are found among module-level imports (``--lazy`` counts imports inside functions
too; ``if TYPE_CHECKING:`` blocks never count). A package's ``__init__`` importing its own
submodules is not a cycle of design, so edges from a package to its own children are left out.
Exit 1 when the package breaks a rule: more than ``MAX_ROOT`` modules at the root, a module over
``MAX_LINES`` lines, or a cycle.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "envbuild"
MAX_ROOT = 10
MAX_LINES = 500


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def imports(path: Path, modules: set[str], lazy: bool, root: Path = ROOT) -> set[str]:
    """The package modules ``path`` imports (at module level; ``lazy``: in functions too)."""
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path, root)
    is_pkg = path.name == "__init__.py"
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                continue
            inner = top and not isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
            )
            if isinstance(child, ast.Import | ast.ImportFrom) and (top or lazy):
                names: list[str] = []
                if isinstance(child, ast.Import):
                    names = [a.name for a in child.names]
                else:
                    base = child.module or ""
                    if child.level:
                        pkg = me if is_pkg else me.rpartition(".")[0]
                        for _ in range(child.level - 1):
                            pkg = pkg.rpartition(".")[0]
                        base = f"{pkg}.{base}" if base else pkg
                    names = [f"{base}.{a.name}" for a in child.names] + [base]
                for n in names:
                    r = resolve(n)
                    if r and r != me and not (is_pkg and r.startswith(me + ".")):
                        found.add(r)
            visit(child, inner)

    visit(tree, True)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10000)

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lazy", action="store_true", help="count imports inside functions too")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    files = sorted(PKG.rglob("*.py"))
    modules = {module_name(f) for f in files}
    graph = {module_name(f): imports(f, modules, args.lazy) for f in files}
    root = sorted(f.name for f in PKG.glob("*.py"))
    sizes = sorted(
        ((len(f.read_text().splitlines()), str(f.relative_to(ROOT))) for f in files), reverse=True
    )
    big = [(n, f) for n, f in sizes if n > MAX_LINES]
    found = cycles(graph)
    report = {
        "root_modules": root,
        "largest": sizes[:10],
        "over_limit": big,
        "cycles": found,
    }
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(f"root modules ({len(root)}, at most {MAX_ROOT}): {' '.join(root)}")
        print("largest: " + ", ".join(f"{f} {n}" for n, f in sizes[:8]))
        print(f"over {MAX_LINES} lines: " + (", ".join(f"{f} {n}" for n, f in big) or "none"))
        print(
            f"import cycles ({'with' if args.lazy else 'without'} imports in functions): "
            + ("; ".join(" <-> ".join(c) for c in found) or "none")
        )
    return 1 if len(root) > MAX_ROOT or big or found else 0


if __name__ == "__main__":
    raise SystemExit(main())
