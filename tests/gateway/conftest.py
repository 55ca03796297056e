"""Fixtures for the gateway tests: a fake Anthropic upstream (thread), pygw and
redis-server processes on free loopback ports, each stopped after use."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from zgtool.gateway.procs import Child, free_port, http_ok, wait_ready

# pytest runs with --import-mode=importlib (no test folder on sys.path): make the fake
# upstream module next to this file importable here and by the test modules
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gw_fake_upstream import FakeUpstream  # noqa: E402


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    up = FakeUpstream().start()
    yield up
    up.stop()


def _start(children: list[Child], name: str, argv: list[str], ready: Callable[[], bool], log: Path) -> Child:
    child = Child(name, argv, log)
    children.append(child)
    child.start()
    why = wait_ready(child, ready, timeout_s=30)
    if why is not None:
        raise RuntimeError(f"{name} {why}: {child.log_tail(20)}")
    return child


def _pygw_starter(log_dir: Path, children: list[Child]) -> Callable[..., str]:
    def start(upstream_url: str, *flags: str) -> str:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        argv = [sys.executable, "-m", "zgtool.gateway.pygw_main", "--upstream", upstream_url, "--port", str(port), *flags]
        _start(children, "pygw", argv, http_ok(url + "/health"), log_dir / f"pygw-{port}.log")
        return url

    return start


@pytest.fixture
def start_pygw(tmp_path: Path) -> Iterator[Callable[..., str]]:
    """start_pygw(upstream_url, *flags) -> base URL of a running pygw process."""
    children: list[Child] = []
    yield _pygw_starter(tmp_path, children)
    for c in children:
        c.stop()


@pytest.fixture(scope="module")
def pygw(upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One open pygw (default policy, memory state) in front of the fake upstream."""
    children: list[Child] = []
    yield _pygw_starter(tmp_path_factory.mktemp("pygw"), children)(upstream.url, "--max-retries", "2")
    for c in children:
        c.stop()


@pytest.fixture
def redis_url(tmp_path: Path) -> Iterator[str]:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    port = free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(tmp_path)]

    def ping() -> bool:
        import redis

        return bool(redis.Redis(port=port, socket_connect_timeout=1).ping())

    child = Child("redis", argv, tmp_path / "redis.log")
    child.start()
    why = wait_ready(child, ping, timeout_s=15)
    if why is not None:
        child.stop()
        raise RuntimeError(f"redis-server {why}: {child.log_tail()}")
    yield f"redis://127.0.0.1:{port}/0"
    child.stop()
