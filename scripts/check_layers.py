"""Checks that hotspan's imports point down its layers, form no cycle and reach no other
module's private names: ``python scripts/check_layers.py [--graph]``.

Layers, lowest first (a module may import its own layer's package and any layer below):

====  ==========================================================================
0     ``hotspan.model``, ``hotspan._speedups``: data types and the C extensions
1     ``hotspan.formats``: wire and file formats
2     ``hotspan.store``: storage backends
3     ``hotspan.query``: the query engines
4     ``hotspan.metrics``, ``hotspan.alerts``, ``hotspan.ui``: services over the query
      engines, each used by the server (and the UI's standalone page by the CLI); none
      imports another
5     ``hotspan.server``
5.5   ``hotspan.agent``: imported by the CLI (``hotspan run``/``record``) and the public
      facades only, and itself importing nothing but ``model``, ``_speedups`` and
      ``hotspan.__version__``, so that a profiled program loads none of the server's code
6     ``hotspan.cli``
7     the public facades and entry points: ``hotspan``, ``hotspan.control``,
      ``hotspan.debug_pprof``, ``hotspan.__main__``
====  ==========================================================================

``from hotspan import __version__`` is allowed everywhere: the version is a constant, not
the facade's code.  Every import counts, also the ones inside functions and under
``TYPE_CHECKING``: a lazy import that goes up is still a dependency that goes up.

Standard library only.  Exit status 1 and one line per problem when there are any.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

ROOT = "hotspan"
SRC = Path(__file__).resolve().parent.parent / "src"

# The first one or two name parts of a module, its package, to its layer.
LAYERS: Dict[str, float] = {
    "hotspan.model": 0,
    "hotspan._speedups": 0,
    "hotspan.formats": 1,
    "hotspan.store": 2,
    "hotspan.query": 3,
    "hotspan.metrics": 4,
    "hotspan.alerts": 4,
    "hotspan.ui": 4,
    "hotspan.server": 5,
    "hotspan.agent": 5.5,
    "hotspan.cli": 6,
    "hotspan": 7,
    "hotspan.control": 7,
    "hotspan.debug_pprof": 7,
    "hotspan.__main__": 7,
}
AGENT = "hotspan.agent"
AGENT_MAY_IMPORT = ("hotspan.agent", "hotspan.model", "hotspan._speedups")
# Names of the root package any module may import.
ROOT_CONSTANTS = ("__version__",)


class Edge(NamedTuple):
    """One import: ``importer`` reads ``name`` (or the whole module when it is empty) of
    ``module`` at ``line``."""

    importer: str
    module: str
    name: str
    line: int


def modules(src: Path) -> Dict[str, Path]:
    """Every module under ``src/hotspan`` by dotted name (a package by its own name)."""
    out: Dict[str, Path] = {}
    for path in sorted((src / ROOT).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _base(importer: str, is_package: bool, level: int, module: Optional[str]) -> str:
    if not level:
        return module or ""
    parts = importer.split(".")
    if not is_package:
        parts.pop()
    parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([module] if module else []))


class Source(NamedTuple):
    """A module's file, parsed once: whether it is a package, and its syntax tree's nodes."""

    is_package: bool
    nodes: List[ast.AST]


def parse(src: Path) -> Dict[str, Source]:
    """Every module under ``src/hotspan`` (see :func:`modules`), parsed."""
    out: Dict[str, Source] = {}
    for name, path in modules(src).items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        out[name] = Source(path.name == "__init__.py", list(ast.walk(tree)))
    return out


def edges(src: Path, parsed: Optional[Dict[str, Source]] = None) -> List[Edge]:
    """Every import of a ``hotspan`` module by a ``hotspan`` module.  ``from pkg import
    sub`` where ``sub`` is a module counts as an import of ``pkg.sub``."""
    mods = parse(src) if parsed is None else parsed
    out: List[Edge] = []
    for importer, source in mods.items():
        for node in source.nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == ROOT or alias.name.startswith(ROOT + "."):
                        out.append(Edge(importer, alias.name, "", node.lineno))
            elif isinstance(node, ast.ImportFrom):
                base = _base(importer, source.is_package, node.level, node.module)
                if base != ROOT and not base.startswith(ROOT + "."):
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in mods:
                        out.append(Edge(importer, sub, "", node.lineno))
                    else:
                        out.append(Edge(importer, base, alias.name, node.lineno))
    return out


def layer_of(module: str) -> Tuple[str, float]:
    """The package that places ``module`` and its layer: the longest name in LAYERS that
    ``module`` is or lies in."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in LAYERS:
            return key, LAYERS[key]
    raise KeyError(f"{module} is in no layer: add its package to LAYERS")


def _private_attributes(mods: Dict[str, Source], importer: str) -> List[Tuple[int, str, str]]:
    """``alias._name`` uses where ``alias`` is a hotspan module the file imported."""
    source = mods[importer]
    aliases: Dict[str, str] = {}
    for node in source.nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in mods:
                    aliases[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            base = _base(importer, source.is_package, node.level, node.module)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in mods:
                    aliases[alias.asname or alias.name] = sub
    out = []
    for node in source.nodes:
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and _is_private(node.attr)
            and aliases[node.value.id] != importer
        ):
            out.append((node.lineno, aliases[node.value.id], node.attr))
    return out


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def violations(src: Path = SRC) -> List[str]:
    """One line per import that goes up or sideways, reaches a private name, or closes a
    cycle, as ``kind importer -> module[:name]``."""
    mods = parse(src)
    problems: Set[str] = set()
    graph: Dict[str, Set[str]] = {m: set() for m in mods}
    for e in edges(src, mods):
        if e.module == ROOT and e.name in ROOT_CONSTANTS:
            continue
        target = f"{e.module}:{e.name}" if e.name else e.module
        if e.name and _is_private(e.name) and e.module != e.importer:
            problems.add(f"private {e.importer} -> {target}")
        if e.module in mods and e.module != e.importer:
            graph[e.importer].add(e.module)
        src_pkg, src_layer = layer_of(e.importer)
        dst_pkg, dst_layer = layer_of(e.module)
        if src_pkg == AGENT or e.importer.startswith(AGENT + "."):
            if not any(e.module == p or e.module.startswith(p + ".") for p in AGENT_MAY_IMPORT):
                problems.add(f"agent {e.importer} -> {target}")
            continue
        if dst_layer > src_layer:
            problems.add(f"upward {e.importer} -> {target}")
        elif dst_layer == src_layer and dst_pkg != src_pkg and src_layer != 7:
            problems.add(f"sideways {e.importer} -> {target}")
    for module in mods:
        for _, other, attr in _private_attributes(mods, module):
            problems.add(f"private {module} -> {other}:{attr}")
    for cycle in cycles(graph):
        problems.add("cycle " + " -> ".join(cycle + [cycle[0]]))
    return sorted(problems)


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The import graph's cycles, one per strongly connected component of more than one
    module, each as the shortest cycle through the component's first module."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    components: List[List[str]] = []
    counter = [0]

    def visit(root: str) -> None:
        # Tarjan's algorithm, iterative: the package tree is deep enough for recursion limits
        # to matter in a checker that must never be the thing that fails.
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [_shortest_cycle(graph, set(c), c[0]) for c in sorted(components)]


def _shortest_cycle(graph: Dict[str, Set[str]], members: Set[str], start: str) -> List[str]:
    previous: Dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & members):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return path[::-1]
                if child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    return [start]


def main(argv: List[str]) -> int:
    if "--graph" in argv:
        by_importer: Dict[str, Set[str]] = {}
        for e in edges(SRC):
            by_importer.setdefault(e.importer, set()).add(e.module)
        for importer in sorted(by_importer):
            print(f"{importer} -> {' '.join(sorted(by_importer[importer]))}")
        return 0
    problems = violations(SRC)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
