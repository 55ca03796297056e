"""A function over a large request body, run in a process of its own so the server's GIL stays free.

A C JSON decoder holds the GIL for a whole body (load_json on 7 MB: ~20 ms on a quiet 2-core box,
40+ under load), and while it does no other thread of the server runs: /health and every stream
wait (issue 37: four 7 MB prompts pushed /health past 100 ms). ``call(fn, args, body)`` sends the
body to one worker process over a pipe instead: the parent's share is the pipe writes, which
release the GIL, and the unpickling of a small answer. The worker is started on first use (never a
fork of a threaded server), ignores SIGINT (the server shuts down, then it ends), and exits when
its pipe closes, so a killed server leaves no orphan.

``fn`` must be a module-level function (it crosses by name). Whatever it raises crosses as class,
args and attributes (``exc_state``/``rebuild``): an error class whose ``__init__`` takes other
arguments than its ``args`` (most of the server's do) cannot be pickled the usual way, and the
answer must carry the same status, message and param as in-process. ``call`` returns ``None``
when the worker cannot be started or dies on the body; the caller then does the work itself.
Not thread-safe: one caller at a time (intake's single large-body thread).
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

# Below the server's threads: where cores are short, its streams and /health get the CPU first and
# a large body waits (bench/isolation.py --checks freeze).
WORKER_NICE = 10
ExcState = tuple[type[BaseException], tuple[Any, ...], dict[str, Any]]


def exc_state(exc: BaseException) -> ExcState:
    return type(exc), exc.args, dict(exc.__dict__)


def rebuild(state: ExcState) -> BaseException:
    """The exception ``exc_state`` described, without calling its ``__init__``."""
    cls, args, attrs = state
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(attrs)
    return exc


def _serve(conn: Connection) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.nice(WORKER_NICE)
    while True:
        try:
            fn, args = pickle.loads(conn.recv_bytes())
            body = conn.recv_bytes()
        except (EOFError, OSError):
            return                        # the server closed the pipe or died
        try:
            out: tuple[str, Any] = ("ok", fn(body, *args))
        except Exception as exc:  # noqa: BLE001 - every error crosses to the caller, who raises it
            out = ("raise", exc_state(exc))
        try:
            conn.send(out)
        except Exception as exc:  # noqa: BLE001 - an answer that cannot be pickled is the caller's error
            conn.send(("raise", exc_state(RuntimeError(f"body worker: answer not sendable: {exc!r}"))))


class _Worker:
    """``python -m zgtool.engine.server.body_worker FD``: a fresh interpreter (no fork of a threaded
    server, and unlike multiprocessing's spawn it never re-imports the server's ``__main__``)."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", __name__, str(theirs.fileno())],
                                         pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        self.conn.close()                 # the worker reads EOF and exits
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


_worker: _Worker | None = None


def call(fn: Callable[..., Any], args: tuple[Any, ...], body: bytes) -> tuple[bool, Any] | None:
    """(True, fn(body, *args)) computed in the worker, (False, exception) for what it raised, or
    None where the worker could not run it (not started, died): the caller decodes itself."""
    global _worker
    try:
        job = pickle.dumps((fn, args))
    except (pickle.PicklingError, AttributeError, TypeError):
        return None                        # a function with no importable name (a test's stand-in)
    try:
        if _worker is None or not _worker.alive():
            if _worker is not None:
                _worker.close()
            _worker = _Worker()
        _worker.conn.send_bytes(job)
        _worker.conn.send_bytes(body)      # written from a memoryview: no copy, the GIL released per write
        tag, value = _worker.conn.recv()
    except (EOFError, OSError):
        if _worker is not None:
            _worker.close()
            _worker = None
        return None
    return (True, value) if tag == "ok" else (False, rebuild(value))


def shutdown() -> None:
    """End the worker (tests; the server's exit ends it through multiprocessing's own hook)."""
    global _worker
    if _worker is not None:
        _worker.close()
        _worker = None


def worker_pid() -> int | None:
    return _worker.proc.pid if _worker is not None else None


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1])))
