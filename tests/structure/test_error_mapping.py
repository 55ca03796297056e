"""One documented mapping from every engine error to an HTTP status and from every CLI error to an exit
code, checked both ways (issue 34): each class of each error tree has exactly one row in docs/errors.md,
each row names a class of that tree, and the row's figures are what the code does with an instance."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from zgtool.commands.engine_errors import ENGINE_EXIT, cli_error, engine_exit_code
from zgtool.engine.errors import EngineError
from zgtool.engine.server.errors import ENGINE_HTTP, ModelLoadFailed, ServeStartupError, to_http_error
from zgtool.errors import ExitCode, ZgError, exit_code_for
from zgtool.http.errors import KitError

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "errors.md"
FOLDERS = {"zgtool": "zgtool", "engine": "zgtool.engine", "probes": "zgtool.probes"}
ROOTS = (EngineError, ZgError, ServeStartupError, KitError)


def _import_every_error_module() -> None:
    """Import each module defining a class that descends, by its bases' names, from one of ROOTS (so
    every subclass of the trees is loaded, wherever it lives)."""
    defined: dict[str, list[tuple[str, list[str]]]] = {}
    for folder, pkg in FOLDERS.items():
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            module = ".".join([pkg, *rel.parts]).removesuffix(".__init__")
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef):
                    bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                    defined.setdefault(node.name, []).append((module, bases))
    family = {r.__name__ for r in ROOTS}
    while True:
        more = {name for name, defs in defined.items() for _, bases in defs if set(bases) & family} - family
        if not more:
            break
        family |= more
    for name in family:
        for module, _ in defined.get(name, []):
            importlib.import_module(module)


def _tree(root: type) -> Iterator[type]:
    yield root
    for sub in root.__subclasses__():
        yield from _tree(sub)


def _classes(root: type) -> dict[str, type]:
    _import_every_error_module()
    out = {c.__name__: c for c in _tree(root) if c.__module__.startswith("zgtool")}
    assert len(out) == len(set(_tree(root)) & set(out.values())), "two classes of one tree share a name"
    return out


def _rows(title: str) -> dict[str, list[str]]:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    rows: dict[str, list[str]] = {}
    for line in text[start:end if end > 0 else None].splitlines():
        m = re.match(r"\|\s*`(\w+)`\s*\|(.*)\|\s*$", line)
        if m:
            assert m.group(1) not in rows, f"{title}: {m.group(1)} has two rows"
            rows[m.group(1)] = [c.strip() for c in m.group(2).split("|")]
    assert rows, title
    return rows


def _instance(cls: type) -> Any:
    for args in ((), ("a message",), ([0], "a message"), (1, 2, 3), ("a message", True), (1, 2, 3, 4, 5)):
        try:
            return cls(*args)
        except TypeError:
            continue
    raise AssertionError(f"cannot build a {cls.__name__} for the test")


def test_every_engine_error_has_exactly_one_http_row_and_the_server_answers_with_it() -> None:
    classes = _classes(EngineError)
    rows = _rows("Engine errors -> HTTP status")
    assert set(rows) == set(classes), f"doc rows vs classes: {set(rows) ^ set(classes)}"
    assert set(ENGINE_HTTP) <= set(classes.values()), "ENGINE_HTTP lists a class that is not an engine error"
    for name, cls in classes.items():
        # its own row in ENGINE_HTTP, or its nearest listed base's (a subclass raised beside its base)
        status, kind = next(ENGINE_HTTP[c] for c in cls.__mro__ if c in ENGINE_HTTP)
        assert rows[name] == [str(status), kind], name
        answer = to_http_error(_instance(cls))
        assert (answer.status, answer.error_type) == (status, kind), name


def test_every_cli_error_has_exactly_one_exit_code_row_and_exits_with_it() -> None:
    classes = {**_classes(ZgError), **_classes(KitError)}
    rows = _rows("CLI errors -> exit code")
    assert set(rows) == set(classes), f"doc rows vs classes: {set(rows) ^ set(classes)}"
    for name, cls in classes.items():
        code = exit_code_for(_instance(cls))
        assert rows[name] == [str(int(code))], name
        if issubclass(cls, ZgError):
            assert code == cls.exit_code


@pytest.mark.parametrize("root", [EngineError, ServeStartupError])
def test_every_engine_error_met_at_the_cli_has_one_exit_code(root: type) -> None:
    rows = _rows("Engine errors at the command line -> exit code")
    for name, cls in _classes(root).items():
        exc = _instance(cls)
        code = engine_exit_code(exc)
        assert code in (ExitCode.USAGE, ExitCode.MISSING_CAPABILITY), name
        assert exit_code_for(cli_error(exc)) == code, name
        listed = next(c for c in cls.__mro__ if c in ENGINE_EXIT)
        assert rows[listed.__name__] == [str(int(ENGINE_EXIT[listed]))], name
    assert set(rows) == {c.__name__ for c in ENGINE_EXIT}


def test_a_missing_model_at_start_up_is_a_missing_capability() -> None:
    assert engine_exit_code(ModelLoadFailed("no such package", missing=True)) == ExitCode.MISSING_CAPABILITY
    assert engine_exit_code(ModelLoadFailed("bad --model", missing=False)) == ExitCode.USAGE
