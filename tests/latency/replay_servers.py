"""Start/stop engine_replay.py servers (subprocesses on free loopback ports) for the adapter and detection tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SCRIPT = Path(__file__).parent / "engine_replay.py"
SSE_SCRIPT = Path(__file__).parent / "sse_script_server.py"
FIXTURES = Path(__file__).parent / "fixtures" / "engines"


@contextmanager
def running(*args: str) -> Iterator[str]:
    """http://127.0.0.1:PORT of a started engine_replay.py server, stopped on exit."""
    proc = subprocess.Popen([sys.executable, str(SCRIPT), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("PORT "):
            raise RuntimeError(f"engine_replay {args} did not start: {line!r} "
                               f"{proc.stderr.read() if proc.stderr else ''}")
        yield f"http://127.0.0.1:{int(line.split()[1])}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def sse_script_server(gap_ms: float) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """(http://127.0.0.1:PORT, the process) of a started sse_script_server.py, its pieces GAP_MS apart; the
    process's stdout carries its SENT/DROPPED lines. Stopped on exit."""
    proc = subprocess.Popen([sys.executable, str(SSE_SCRIPT), f"{gap_ms:g}"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("PORT "), proc.stderr.read() if proc.stderr else line
        yield f"http://127.0.0.1:{int(line.split()[1])}", proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)
