"""No import circle between our modules (issue 34).

The graph is read from the source's AST by tests/structure/importgraph.py (nothing is imported), with
modules named as they install (engine/ -> zgtool.engine, probes/ -> zgtool.probes, k6/ -> zgtool.k6).
Three strengths of edge:

- runtime load-time imports: what runs when a module is imported (module body, module-level if/try/with
  blocks, class bodies), without `if TYPE_CHECKING:` blocks. No circle at all, anywhere;
- plus `if TYPE_CHECKING:` imports: a type-only dependency is still a dependency a reader follows;
- plus imports inside functions (deferred imports): they run on call, after both modules have loaded,
  so Python's loader never sees their circle, but a reader does (app.py <-> cli.py and
  gate/evaluate.py <-> paired.py were such circles).

zgtool/, engine/ and probes/ have no circle at any strength (the last three engine ones were cut with
leaf modules and a Protocol: engine/server/context.py and routes.py, engine/model_runner.py, and
cpu_forward.StepModel).

A circle is cut by moving what both sides need (a record, a constant) into a leaf module both import;
a failure names one concrete loop with the line of each import in it.
"""

from __future__ import annotations

import importgraph as ig


def _describe(graph: dict[str, dict[str, int]], component: list[str]) -> str:
    loop = ig.one_cycle(graph, component)
    steps = [f"{a} (line {graph[a][b]})" for a, b in zip(loop, loop[1:], strict=False)]
    return " -> ".join([*steps, loop[-1]]) + f"  [{len(component)} modules in the circle]"


def _circles(graph: dict[str, dict[str, int]]) -> dict[frozenset[str], str]:
    return {frozenset(comp): _describe(graph, comp) for comp in ig.cycles(graph)}


def _fmt(found: dict[frozenset[str], str]) -> str:
    return "\n  " + "\n  ".join(sorted(found.values()))


def test_no_runtime_import_circle_anywhere() -> None:
    graph = ig.import_graph(type_checking=False)
    assert len(graph) > 100, "the module walk found too few modules"
    found = _circles(graph)
    assert not found, "import circles at runtime:" + _fmt(found)


def test_no_type_only_or_deferred_import_circle_anywhere() -> None:
    found = _circles(ig.import_graph(inside_functions=True))
    assert not found, "import circles (TYPE_CHECKING and in-function imports counted):" + _fmt(found)


def test_the_graph_sees_a_circle_and_names_it() -> None:
    """The checker itself: a made-up circle a -> b -> c -> a is found and printed as a loop."""
    graph = {"a": {"b": 3}, "b": {"c": 5}, "c": {"a": 7}, "d": {"a": 1}}
    comps = ig.cycles(graph)
    assert comps == [["a", "b", "c"]]
    assert _describe(graph, comps[0]) == "a (line 3) -> b (line 5) -> c (line 7) -> a  [3 modules in the circle]"


def test_the_graph_tells_runtime_type_only_and_deferred_imports_apart() -> None:
    runtime = ig.import_graph(type_checking=False)
    typed = ig.import_graph()
    full = ig.import_graph(inside_functions=True)
    # zgtool/latency/schedule/openloop.py imports the wire client under TYPE_CHECKING only
    edge = ("zgtool.latency.schedule.openloop", "zgtool.latency.wire.client")
    assert edge[1] not in runtime[edge[0]] and edge[1] in typed[edge[0]]
    # zgtool/cli.py imports zgtool.app inside main() only
    assert "zgtool.app" not in typed["zgtool.cli"] and "zgtool.app" in full["zgtool.cli"]
