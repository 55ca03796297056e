"""`zgtool defrag` pointed at a gateway instead of the engine says it is a gateway, shows the `Via`
evidence and names the engine behind it (exit 3), instead of asking for an admin key that cannot help.
A real null engine and a real pygw in front of it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from zgtest import run_zgtool, stop_process, wait_port

from zgtool.errors import ExitCode
from zgtool.http.net import free_port


def _start(log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as fh:
        return subprocess.Popen([sys.executable, "-m", "zgtool", *args], stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)


@pytest.fixture(scope="module")
def engine_behind_pygw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("defrag_gw")
    engine_port, gw_port = free_port(), free_port()
    engine = _start(tmp / "engine.log", "serve", "--model", "null", "--host", "127.0.0.1", "--port", str(engine_port))
    gw = None
    try:
        wait_port(engine_port, timeout_s=60)
        gw = _start(tmp / "pygw.log", "gateway", "--kind", "pygw", "--upstream", f"http://127.0.0.1:{engine_port}",
                    "--port", str(gw_port))
        wait_port(gw_port, timeout_s=60)
        yield f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{gw_port}"
    finally:
        if gw is not None:
            stop_process(gw)
        stop_process(engine)


def test_defrag_on_a_gateway_names_it_with_the_via_evidence_and_the_engine_port(engine_behind_pygw) -> None:  # noqa: ANN001
    engine, gateway = engine_behind_pygw
    r = run_zgtool("defrag", "--engine", gateway, "--dry-run")
    assert r.returncode == ExitCode.UNREACHABLE, r.stdout + r.stderr
    assert r.stderr.count("\n") == 1
    assert f"{gateway} is a gateway, not the engine (Via: 1.1 pygw" in r.stderr
    assert f"run zgtool defrag --engine {engine}" in r.stderr
    assert "--admin-key" not in r.stderr


def test_defrag_on_the_engine_itself_still_works(engine_behind_pygw) -> None:  # noqa: ANN001
    engine, _ = engine_behind_pygw
    r = run_zgtool("defrag", "--engine", engine, "--dry-run", "--json")
    assert r.returncode == 0, r.stderr
