"""Every command's --help reads like click's: plain metavars (`INT`, `TARGETS...`), none after
flags, no Python type names or braces, and it fits 80 columns."""

from __future__ import annotations

import re

import pytest

from zgtool.app import _register_all, app
from zgtool.plainhelp import plain_help, plain_metavar

PY_TYPES = re.compile(r"<(bool|str|int|float|path|file|list\[[^\]]*\]|[a-z]+ range)>")


def _paths(command, prefix=()):  # type: ignore[no-untyped-def]
    yield prefix
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from _paths(sub, (*prefix, name))


@pytest.fixture(scope="module")
def root():  # type: ignore[no-untyped-def]
    import typer

    _register_all()
    return plain_help(typer.main.get_command(app))


def _help(capsys, args):  # type: ignore[no-untyped-def]
    from zgtool.app import _run

    assert _run([*args, "--help"]) == 0
    return capsys.readouterr().out


def test_every_command_help_has_plain_metavars_and_fits_80_columns(root, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    paths = list(_paths(root))
    assert len(paths) > 15
    for path in paths:
        out = _help(capsys, list(path))
        assert not PY_TYPES.search(out), (path, PY_TYPES.search(out))
        usage = next(ln for ln in out.splitlines() if "Usage:" in ln)
        assert "{" not in usage and "<" not in usage, usage
        flags = [ln for ln in out.splitlines() if re.match(r"^│\s*--(help|json)\b", ln)]
        assert flags and all(not re.search(r"--(help|json)\s+(<|[A-Z]{2,}\s)", ln) for ln in flags), flags
        assert max(len(ln) for ln in out.splitlines()) <= 80, path


def test_usage_line_names_arguments_like_click(root, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert "Usage: zgtool latency-split [OPTIONS] TARGETS..." in _help(capsys, ["latency-split"])
    requests = next(ln for ln in _help(capsys, ["latency-split"]).splitlines() if "--requests" in ln)
    assert re.search(r"--requests\s+-n\s+INT\s+Measured", requests), requests


@pytest.mark.parametrize("typer_label, plain", [
    ("<int>", "INT"), ("<str>", "TEXT"), ("<float>", "FLOAT"), ("<path>", "PATH"),
    ("<list[str]>", "TEXT"), ("<nginx|pygw|stack>", "nginx|pygw|stack"), ("<int>...", "INT..."),
    (None, None),
])
def test_plain_metavar_maps_typer_labels_to_click_style(typer_label, plain):
    assert plain_metavar(typer_label) == plain
