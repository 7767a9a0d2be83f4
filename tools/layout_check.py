"""The package's shape, checked: modules at the root, module sizes, import cycles.

    python tools/layout_check.py [--lazy] [--json]
    python tools/layout_check.py --packages [--lazy] [--json] [--layers tools/layers.toml]

Import cycles are found among module-level imports (``--lazy`` counts imports inside functions
too; ``if TYPE_CHECKING:`` blocks never count). A package's ``__init__`` importing its own
submodules is not a cycle of design, so edges from a package to its own children are left out.
Exit 1 when the package breaks a rule: more than ``MAX_ROOT`` modules at the root, a module over
``MAX_LINES`` lines, or a cycle.

``--packages`` looks one level up: each subpackage (and each root module) of ``envbuild`` is one
node, and ``tools/layers.toml`` lists the layers bottom first. An import may go to the same or a
lower layer only; every upward one is printed with its file and line. Exit 1 on an upward import
not in the file's ``allowed`` list, a package in no layer, a stale ``allowed`` entry, or a cycle
among packages.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import tomllib
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "envbuild"
MAX_ROOT = 10
MAX_LINES = 500
LAYERS = ROOT / "tools" / "layers.toml"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def import_sites(
    path: Path, modules: set[str], lazy: bool, root: Path = ROOT
) -> list[tuple[str, int, bool]]:
    """Each package module ``path`` imports, with the line and whether it is inside a function.

    Module-level imports always count; ``lazy``: imports in functions too."""
    tree = ast.parse(path.read_text(), str(path))
    me = module_name(path, root)
    is_pkg = path.name == "__init__.py"
    found: list[tuple[str, int, bool]] = []

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
                    site = (r, child.lineno, not top)
                    own = r == me or (is_pkg and r is not None and r.startswith(me + "."))
                    if r and not own and site not in found:
                        found.append(site)
            visit(child, inner)

    visit(tree, True)
    return found


def imports(path: Path, modules: set[str], lazy: bool, root: Path = ROOT) -> set[str]:
    """The package modules ``path`` imports (at module level; ``lazy``: in functions too)."""
    return {target for target, _, _ in import_sites(path, modules, lazy, root)}


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


def package_of(module: str) -> str:
    """``envbuild.lock.model`` → ``lock``; a root module is its own package; the root is
    ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def load_layers(path: Path = LAYERS) -> tuple[dict[str, int], set[tuple[str, str]]]:
    """Each package's layer (0 is the bottom) and the allowed exceptions (``tools/layers.toml``)."""
    data = tomllib.loads(path.read_text())
    rank: dict[str, int] = {}
    for n, layer in enumerate(data["layers"]):
        for name in layer:
            if name in rank:
                raise SystemExit(f"{path}: {name} is in two layers")
            rank[name] = n
    allowed = set()
    for edge in data.get("allowed", []):
        a, _, b = edge.partition(" -> ")
        allowed.add((a.strip(), b.strip()))
    return rank, allowed


class Edge(NamedTuple):
    source: str
    target: str
    file: str
    line: int
    lazy: bool


def package_edges(pkg: Path, lazy: bool, root: Path = ROOT) -> list[Edge]:
    """Every import from one package (or root module) into another, with its file and line."""
    files = sorted(pkg.rglob("*.py"))
    modules = {module_name(f, root) for f in files}
    out = []
    for f in files:
        me = package_of(module_name(f, root))
        for target, line, inner in import_sites(f, modules, lazy, root):
            other = package_of(target)
            if other != me and Edge(me, other, str(f.relative_to(root)), line, inner) not in out:
                out.append(Edge(me, other, str(f.relative_to(root)), line, inner))
    return out


def upward(
    edges: list[Edge], rank: dict[str, int], allowed: set[tuple[str, str]] = frozenset()
) -> tuple[list[Edge], list[str]]:
    """The imports that go to a higher layer (not in ``allowed``), and packages missing a layer."""
    missing = sorted({p for e in edges for p in (e.source, e.target) if p not in rank})
    bad = [
        e
        for e in edges
        if e.source in rank
        and e.target in rank
        and rank[e.target] > rank[e.source]
        and (e.source, e.target) not in allowed
    ]
    return bad, missing


def packages_main(args: argparse.Namespace) -> int:
    rank, allowed = load_layers(Path(args.layers))
    edges = package_edges(PKG, args.lazy)
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
    # a cycle through an allowed edge is that edge's problem, already listed
    knots = cycles({a: {b for b in bs if (a, b) not in allowed} for a, bs in graph.items()})
    mutual = sorted(
        {tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph.get(b, ())}
    )
    bad, missing = upward(edges, rank, allowed)
    stale = sorted(
        f"{a} -> {b}" for a, b in allowed if not any(e.source == a and e.target == b for e in edges)
    )
    report = {
        "upward": [e._asdict() for e in bad],
        "upward_module_level": sum(not e.lazy for e in bad),
        "upward_in_functions": sum(e.lazy for e in bad),
        "package_cycles": knots,
        "mutual": [list(m) for m in mutual],
        "missing_layer": missing,
        "allowed": sorted(f"{a} -> {b}" for a, b in allowed),
        "stale_allowed": stale,
    }
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        kind = "with" if args.lazy else "without"
        for e in bad:
            where = "in a function" if e.lazy else "module level"
            print(
                f"{e.file}:{e.line}: {e.source} (layer {rank[e.source]}) imports {e.target} "
                f"(layer {rank[e.target]}), {where}"
            )
        print(
            f"upward imports ({kind} imports in functions): {len(bad)} "
            f"({report['upward_module_level']} module level, "
            f"{report['upward_in_functions']} in functions)"
        )
        print("package cycles: " + ("; ".join(" <-> ".join(c) for c in knots) or "none"))
        print("mutual pairs: " + (", ".join(f"{a}<->{b}" for a, b in mutual) or "none"))
        if allowed:
            print("allowed upward imports (must shrink to none): " + ", ".join(report["allowed"]))
        if missing:
            print(f"packages without a layer in {args.layers}: {' '.join(missing)}")
        if stale:
            print("allowed but no longer imported (remove them): " + ", ".join(stale))
    return 1 if bad or missing or stale or knots else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lazy", action="store_true", help="count imports inside functions too")
    ap.add_argument("--json", action="store_true")
    ap.add_argument(
        "--packages", action="store_true", help="check the package import order in --layers"
    )
    ap.add_argument("--layers", default=str(LAYERS), help="the layer order (default: %(default)s)")
    args = ap.parse_args()
    if args.packages:
        return packages_main(args)
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
