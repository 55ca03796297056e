"""No function over 100 lines outside tests/ and bench/ (the project's style rule, issue 34).

A function's length is from its `def` line to its last line (decorators, docstring, comments and nested
functions included), read from the AST. Folders checked: zgtool/, engine/, probes/, k6/ and scripts/.
ENGINE_KNOWN may list an engine function still over the limit whose file the engine's own issues are
reworking (empty now); an entry that is no longer over the limit fails the test.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("zgtool", "engine", "probes", "k6", "scripts")
LIMIT = 100
ENGINE_KNOWN: set[str] = set()


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    out = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.ClassDef):
            out += _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            out.append((prefix + node.name, node))
            out += _functions(node, f"{prefix}{node.name}.")
        else:
            out += _functions(node, prefix)
    return out


def long_functions(limit: int = LIMIT) -> dict[str, int]:
    """'path:Qualified.name' -> lines, for every function longer than limit."""
    found = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for name, fn in _functions(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
                length = (fn.end_lineno or fn.lineno) - fn.lineno + 1
                if length > limit:
                    found[f"{rel}:{name}"] = length
    return found


def test_no_function_over_100_lines_outside_tests_and_bench() -> None:
    found = long_functions()
    new = {k: v for k, v in found.items() if k not in ENGINE_KNOWN}
    assert not new, "functions over 100 lines (split them): " + ", ".join(f"{k} ({v})" for k, v in sorted(new.items()))
    gone = sorted(ENGINE_KNOWN - set(found))
    assert not gone, f"no longer over the limit: delete from ENGINE_KNOWN: {gone}"


def test_the_length_counts_from_def_to_the_last_line() -> None:
    src = "class A:\n    def f(self):\n" + "        x = 1\n" * 100 + "\ndef g():\n    pass\n"
    funcs = dict(_functions(ast.parse(src)))
    assert set(funcs) == {"A.f", "g"}
    assert funcs["A.f"].end_lineno - funcs["A.f"].lineno + 1 == 101
