"""The server raises its own start-up errors; the serve command alone maps them to the CLI's
exit codes and prints the banner (issue 26: run.py printed the banner and raised CLI errors)."""

from __future__ import annotations

import ast
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import zgtool.engine.server.run as run_module
from zgtool.commands.serve import startup_error
from zgtool.engine.server.errors import ListenFailed, ModelLoadFailed, ServerNotStarted
from zgtool.engine.server.run import bind
from zgtool.errors import ExitCode


def test_the_server_module_imports_neither_the_cli_error_tree_nor_a_renderer():
    tree = ast.parse(Path(run_module.__file__).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "zgtool.errors" not in imported and not any(m and m.startswith("rich") for m in imported)


def test_a_taken_port_is_the_servers_own_listen_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(ListenFailed, match="pick another --port"):
            bind("127.0.0.1", taken.getsockname()[1])


@pytest.mark.parametrize(("exc", "code"), [
    (ListenFailed("cannot listen"), ExitCode.USAGE),
    (ModelLoadFailed("bad model", missing=False), ExitCode.USAGE),
    (ModelLoadFailed("no such model here", missing=True), ExitCode.MISSING_CAPABILITY),
    (ServerNotStarted("did not start"), ExitCode.MISSING_CAPABILITY),
])
def test_the_serve_command_maps_each_startup_error_once(exc: Exception, code: ExitCode):
    mapped = startup_error(exc)
    assert mapped.exit_code == code and str(exc) in str(mapped)   # type: ignore[attr-defined]


def test_an_unknown_model_exits_2_with_one_line_and_no_banner():
    r = subprocess.run([sys.executable, "-m", "zgtool", "serve", "--model", "/nonexistent/model-dir", "--port", "0"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "cannot load model" in r.stderr and "Traceback" not in r.stderr
    assert "zgtool serve —" not in r.stdout
