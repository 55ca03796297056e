"""Fixtures for load tests: a real uvicorn server on a free port, the CLI in a subprocess."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from zgtest import run_zgtool

from zgtool.http import net

HERE = Path(__file__).resolve().parent


def _serve(sock: socket.socket) -> subprocess.Popen[bytes]:
    # uvicorn adopts the already-bound socket (--fd): no race for the port
    return subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "asgi_app:app", "--app-dir", str(HERE), "--fd", str(sock.fileno()),
         "--log-level", "warning", "--no-access-log"],
        pass_fds=(sock.fileno(),), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture(scope="session")
def asgi_url():
    """Base URL of tests/loadtest/asgi_app.py served by a real uvicorn process."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    proc = _serve(sock)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode() if proc.stderr else ""
                pytest.fail(f"uvicorn did not come up: {err}")
            time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        sock.close()


@pytest.fixture
def free_port() -> int:
    """A port with nothing listening (bound then released)."""
    return net.free_port()


def run_cli(*args: str | Path, env: dict[str, str] | None = None, python: str = sys.executable,
            timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_zgtool(*args, env=env, python=python, timeout_s=timeout, cwd=cwd)


@pytest.fixture
def cli():
    """cli(*args, env=None, python=sys.executable, cwd=None) -> CompletedProcess of `zgtool ARGS`."""
    return run_cli
