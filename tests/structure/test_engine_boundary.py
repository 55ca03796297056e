"""engine/ is a part of its own (issue 34): besides itself it imports only a small shared layer of zgtool
(the HTTP kit zgtool.http, the error tree zgtool.errors, target types zgtool.targets and the package's
__version__), and that layer imports nothing of the CLI, the commands, the instruments or the engine.
Every import counts here, those inside functions too (tests/structure/importgraph.py)."""

from __future__ import annotations

import importgraph as ig

SHARED = ("zgtool.http", "zgtool.errors", "zgtool.targets")
FORBIDDEN = ("zgtool.commands", "zgtool.latency", "zgtool.cli", "zgtool.app")


def _is(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _engine_imports(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    return {m: {d: ln for d, ln in deps.items() if not _is(d, (ig.ENGINE,))}
            for m, deps in graph.items() if _is(m, (ig.ENGINE,))}


def test_engine_imports_nothing_of_the_commands_latency_cli_or_app() -> None:
    graph = ig.import_graph(inside_functions=True)
    bad = [f"{m} line {ln}: {d}" for m, deps in _engine_imports(graph).items() for d, ln in deps.items()
           if _is(d, FORBIDDEN)]
    assert not bad, bad


def test_engine_imports_only_the_shared_layer_of_zgtool() -> None:
    graph = ig.import_graph(inside_functions=True)
    outside = [f"{m} line {ln}: {d}" for m, deps in _engine_imports(graph).items() for d, ln in deps.items()
               if not _is(d, SHARED)]
    assert not outside, "engine/ imports zgtool modules outside the shared layer " + f"{SHARED}: {outside}"
    used = {d for deps in _engine_imports(graph).values() for d in deps}
    assert any(_is(d, ("zgtool.http",)) for d in used), "the check sees no engine import of zgtool.http"


def test_the_shared_layer_pulls_in_nothing_else() -> None:
    graph = ig.import_graph(inside_functions=True)
    for module in [m for m in graph if _is(m, SHARED)]:
        reached = ig.transitive(graph, module)
        assert not [r for r in reached if _is(r, FORBIDDEN)], module
        strays = sorted(r for r in reached if not _is(r, SHARED))
        assert not strays, f"{module} reaches {strays}: the shared layer must stay apart from the rest"


def test_the_package_root_the_engine_reads_its_version_from_imports_nothing() -> None:
    text = (ig.ROOT / "zgtool" / "__init__.py").read_text(encoding="utf-8")
    assert "import" not in text, "zgtool/__init__.py must stay import-free (engine/ reads __version__ from it)"
