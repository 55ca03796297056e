"""Live servers for the serve tests: the real app on uvicorn, on 127.0.0.1 with a free port.

In-process servers run uvicorn in a thread (its own uvloop loop) around a real Engine
(``null`` backend: real scheduler and KV bookkeeping, zero compute), so a test can read
engine state directly; the lifecycle tests start `zgtool serve` as a subprocess. Tests
reach the helpers through fixtures (``start_server``, ``serve_proc``), since test modules
cannot import this file under --import-mode=importlib.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_live import child, serving  # the one live-engine fixture (tests/support)

from zgtool.engine.server.config import ServeConfig
from zgtool.engine.server.run import Built

ADMIN_KEY = "sk-test-admin"
FREE_KEY = "sk-test-free"
PRO_KEY = "sk-test-pro"

KEYS_TOML = f"""
[tiers.free]
max_concurrent = 1
requests_per_min = 1000

[tiers.tiny]
requests_per_min = 2

[tiers.pro]
max_concurrent = 64

[[keys]]
name = "free-user"
tier = "free"
key = "{FREE_KEY}"

[[keys]]
name = "tiny-user"
tier = "tiny"
key = "sk-test-tiny"

[[keys]]
name = "pro-user"
tier = "pro"
key = "{PRO_KEY}"

[admin]
keys = ["{ADMIN_KEY}"]
"""

POLICY_TOML = """
message = "blocked by test policy"
[input]
deny_phrases = ["forbidden input"]
deny_regexes = ['secret-\\d+']
[output]
deny_phrases = ["from the zgtool"]
"""


@dataclass
class LiveServer:
    url: str
    built: Built
    server: Any
    thread: threading.Thread

    @property
    def engine(self) -> Any:
        return self.built.engine

    @property
    def port(self) -> int:
        return self.built.port

    def metrics_text(self) -> str:
        return httpx.get(self.url + "/metrics", verify=False).text

    def metric(self, name: str, default: float | None = None, **labels: str) -> float:
        """The value of the first /metrics sample called ``name`` whose labels include ``labels``."""
        for line in self.metrics_text().splitlines():
            m = re.match(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})? (\S+)$", line)
            if m is None or m.group(1) != name:
                continue
            have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
            if all(have.get(k) == v for k, v in labels.items()):
                return float(m.group(3))
        assert default is not None, f"{name}{labels or ''} not in /metrics"
        return default

    def wait_metric(self, name: str, value: float, timeout_s: float = 5.0, **labels: str) -> float:
        """Poll until the sample reaches value (handlers record after the engine finishes)."""
        deadline = time.monotonic() + timeout_s
        while (got := self.metric(name, -1.0, **labels)) < value and time.monotonic() < deadline:
            time.sleep(0.02)
        return got

    def wait_idle(self, timeout_s: float = 5.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            s = self.engine.stats()
            if (s["running"] == 0 and s["waiting"] == 0) or time.monotonic() > deadline:
                return s
            time.sleep(0.01)


@contextlib.contextmanager
def live_server(**overrides: Any) -> Iterator[LiveServer]:
    cfg = ServeConfig(**{"model": "null", "host": "127.0.0.1", "port": 0, "grace_s": 2.0, **overrides})
    with serving(cfg) as (built, server, thread):
        yield LiveServer(built.url, built, server, thread)


@contextlib.contextmanager
def serve_process(*args: str, log: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """`zgtool serve --model null` as a child process (tests/support/engine_live.py's); always stopped and reaped."""
    with child(log.parent, *args, keyed=False, log=log) as live:
        assert live.proc is not None
        yield live.proc, live.url


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    """An open server (no keys) on the null model."""
    with live_server() as s:
        yield s


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("keys") / "keys.toml"
    p.write_text(KEYS_TOML)
    return p


@pytest.fixture(scope="module")
def policy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("policy") / "policy.toml"
    p.write_text(POLICY_TOML)
    return p


@pytest.fixture(scope="session")
def start_server() -> Any:
    """live_server(**ServeConfig overrides) as a context manager."""
    return live_server


@pytest.fixture(scope="session")
def serve_proc() -> Any:
    """serve_process(*flags, log=path) -> (Popen, url), as a context manager."""
    return serve_process


@pytest.fixture(scope="session")
def api_keys() -> dict[str, str]:
    return {"admin": ADMIN_KEY, "free": FREE_KEY, "pro": PRO_KEY, "tiny": "sk-test-tiny"}
