"""Real local servers for the workload tests: `zgtool serve --model dummy:small` (a prefix cache, real
token counts) and a bare TCP listener that counts every connection (to show nothing was sent)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator

import pytest
from workload_helpers import Listener
from zgtest import wait_until


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    log = tmp_path_factory.mktemp("engine") / "serve.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "zgtool", "serve", "--model", "dummy:small", "--host",
                                 "127.0.0.1", "--port", str(port)], stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is not None or _healthy(url), 120, "zgtool serve --model dummy:small")
        if proc.poll() is not None:
            raise RuntimeError(f"zgtool serve exited {proc.returncode}:\n{log.read_text()}")
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


@pytest.fixture
def listener() -> Iterator[Listener]:
    lst = Listener()
    yield lst
    lst.close()
