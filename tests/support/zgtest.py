"""The helpers every test folder shares: run the real CLI, and wait on state (never a sleep).

tests/conftest.py puts this folder on sys.path, so tests import it as `zgtest`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ZGTOOL = [sys.executable, "-m", "zgtool"]


def run_zgtool(*args: str | Path, env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
               timeout_s: float = 120, columns: int = 200, python: str = sys.executable,
               prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """`zgtool ARGS` in a fresh interpreter: real exit codes, stdout and stderr as a user sees them.

    A wide terminal (rows are asserted on one line), no colour, and no inherited ZGTOOL_DEBUG (it
    would add tracebacks to the one-line errors tests assert on); `env` adds to or overrides that."""
    full_env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1"}
    full_env.pop("ZGTOOL_DEBUG", None)
    full_env.update(env or {})
    return subprocess.run([*prefix, python, "-m", "zgtool", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout_s, env=full_env, cwd=cwd)


def poll(cond: Callable[[], object], timeout_s: float, interval_s: float = 0.05) -> bool:
    """True as soon as cond() is truthy, False once timeout_s has passed without it."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval_s)
    return True


def wait_until(cond: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    """Like poll, but a timeout fails the test naming what it waited for."""
    if not poll(cond, timeout_s, interval_s):
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        socket.create_connection((host, port), timeout=0.2).close()
        return True
    except OSError:
        return False


def wait_port(port: int, timeout_s: float = 10.0, host: str = "127.0.0.1") -> None:
    """Returns once something accepts connections on host:port."""
    if not poll(lambda: port_open(port, host), timeout_s, 0.02):
        raise RuntimeError(f"nothing listens on {host}:{port} after {timeout_s} s")


def stop_process(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM (a server drains), SIGKILL what is left after grace_s; always reaped."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def stop_uvicorn_thread(server: Any, thread: threading.Thread, grace_s: float = 1.0) -> None:
    """Stop a stand-in uvicorn server run in a thread: a graceful exit, then after ``grace_s`` a forced
    one (uvicorn otherwise waits on every open connection and task, e.g. a stream a test left hanging)."""
    server.should_exit = True
    thread.join(grace_s)
    if thread.is_alive():
        server.force_exit = True
        thread.join(10)


@contextmanager
def silent_listener(backlog: int = 16) -> Iterator[int]:
    """A listening socket on 127.0.0.1 that accepts every connection and never sends a byte; its
    port. Accepted connections are held open until the block ends, then all closed."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(backlog)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for c in held:
            c.close()
        srv.close()
