"""The import graph of the installed packages, read from the source's AST (nothing is imported).

Modules are named as they install: zgtool/ -> zgtool.*, engine/ -> zgtool.engine.*, probes/ ->
zgtool.probes.*, k6/ -> zgtool.k6.* (pyproject's package-dir mapping).

An edge a -> b means module a imports module b at load time: every `import` / `from ... import`
statement that runs when a is imported, i.e. in the module body, in module-level `if` (including
`if TYPE_CHECKING:`), `try` and `with` blocks, and in class bodies. Imports inside functions and
methods are NOT edges: they run on call, after both modules finished loading, and are the usual way to
defer a heavy or optional import (import_graph(inside_functions=True) draws them too). `from pkg import name` is an edge to pkg.name when that is a module
of ours, else to pkg. Importing a module also runs its parent packages' __init__; those implicit edges
are not drawn (the package-imports-its-submodules pattern would otherwise read as a cycle).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# folder in the checkout -> dotted name it installs as
PACKAGE_DIRS = {"zgtool": "zgtool", "engine": "zgtool.engine", "probes": "zgtool.probes", "k6": "zgtool.k6"}
ENGINE = "zgtool.engine"


def module_files() -> dict[str, Path]:
    """Every module of ours: dotted name -> file."""
    out: dict[str, Path] = {}
    for folder, dotted in PACKAGE_DIRS.items():
        base = ROOT / folder
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if any(not p.isidentifier() for p in parts):
                continue
            out[".".join([dotted, *parts])] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level(body: list[ast.stmt], type_checking: bool = True) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        elif isinstance(node, ast.ClassDef):
            yield from _module_level(node.body, type_checking)
        elif isinstance(node, ast.If):
            if type_checking or not _is_type_checking(node.test):
                yield from _module_level(node.body, type_checking)
            yield from _module_level(node.orelse, type_checking)
        elif isinstance(node, ast.For | ast.While | ast.With):
            yield from _module_level(node.body, type_checking)
            yield from _module_level(getattr(node, "orelse", []), type_checking)
        elif isinstance(node, ast.Try):
            yield from _module_level(node.body, type_checking)
            for handler in node.handlers:
                yield from _module_level(handler.body, type_checking)
            yield from _module_level(node.orelse, type_checking)
            yield from _module_level(node.finalbody, type_checking)


def _absolute(name: str, node: ast.ImportFrom, importer: str, is_package: bool) -> str:
    if not node.level:
        return name
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, name] if name else base)


def _everywhere(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(ast.Module(body=body, type_ignores=[])):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def imports_of(name: str, path: Path, known: set[str], *, inside_functions: bool = False,
               type_checking: bool = True) -> dict[str, int]:
    """Our modules that `name` imports at module level (or anywhere) -> line of the first such import."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: dict[str, int] = {}
    is_package = path.name == "__init__.py"
    nodes = sorted(_everywhere(tree.body) if inside_functions else _module_level(tree.body, type_checking),
                   key=lambda n: n.lineno)
    for node in nodes:
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            mod = _absolute(node.module or "", node, name, is_package)
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                targets.append(sub if sub in known else mod)
        for t in targets:
            # `import zgtool.a.b` names zgtool.a.b; a name that is not a module of ours is dropped
            while t and t not in known:
                t = t.rpartition(".")[0] if t.startswith(("zgtool.", "engine.", "probes.")) else ""
            if t and t != name and t != "zgtool":
                found.setdefault(t, node.lineno)
    return found


def import_graph(*, inside_functions: bool = False, type_checking: bool = True) -> dict[str, dict[str, int]]:
    """module -> {module it imports: line}: load-time imports (with `if TYPE_CHECKING:` ones unless
    type_checking is False), or every import when inside_functions."""
    files = module_files()
    known = set(files)
    return {name: imports_of(name, path, known, inside_functions=inside_functions, type_checking=type_checking)
            for name, path in files.items()}


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        work = [(v, iter(sorted(graph.get(v, {}))))]
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, it = work[-1]
            advanced = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, {})))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def one_cycle(graph: dict[str, dict[str, int]], component: list[str]) -> list[str]:
    """One concrete loop through a strongly connected component: a -> b -> ... -> a."""
    members = set(component)
    start = component[0]
    # breadth-first from start's successors back to start, inside the component
    prev: dict[str, str] = {}
    frontier = [start]
    seen = {start}
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, {})):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if w not in seen:
                    seen.add(w)
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return component


def transitive(graph: dict[str, dict[str, int]], start: str) -> set[str]:
    """Every module `start` loads at import time, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        v = todo.pop()
        for w in graph.get(v, {}):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen
