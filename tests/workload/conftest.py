"""Real local servers for the workload tests: `zgtool serve --model dummy:small` (a prefix cache, real
token counts) and a bare TCP listener that counts every connection (to show nothing was sent)."""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from workload_helpers import Listener
from zgtest import stop_process, wait_until

from zgtool.http.net import free_port


def _healthy(url: str) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url + "/health", timeout=1, context=ctx) as r:
            return r.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def _serve(log: Path, *args: str) -> Iterator[str]:
    port = free_port()
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "zgtool", "serve", "--host", "127.0.0.1", "--port", str(port),
                                 *args], stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"{'https' if '--tls' in args else 'http'}://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is not None or _healthy(url), 120, f"zgtool serve {' '.join(args)}")
        if proc.poll() is not None:
            raise RuntimeError(f"zgtool serve exited {proc.returncode}:\n{log.read_text()}")
        yield url
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """zgtool serve --model dummy:small: a prefix cache and real token counts."""
    with _serve(tmp_path_factory.mktemp("engine") / "serve.log", "--model", "dummy:small") as url:
        yield url


@pytest.fixture(scope="module")
def tls_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """zgtool serve --model null --tls self-signed."""
    with _serve(tmp_path_factory.mktemp("tls") / "serve.log", "--model", "null", "--tls", "self-signed") as url:
        yield url


@pytest.fixture
def listener() -> Iterator[Listener]:
    lst = Listener()
    yield lst
    lst.close()
