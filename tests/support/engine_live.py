"""The one live-engine fixture of the tests and the benchmarks: `zgtool serve` in-process (uvicorn in a
thread, real sockets) or as a child process, plus the probes every case asserts with: exact status and
error shape, KV blocks back to zero (GET /admin/kv), process survival.
(Tests import it by name: tests/conftest.py puts every test folder on sys.path. Benchmarks put
tests/support on sys.path themselves: see bench/client_overhead.py.)
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from zgtool.engine.server.config import ServeConfig
from zgtool.engine.server.run import Built, bind, build, make_server
from zgtool.http.net import free_port

ADMIN_KEY = "sk-rel-admin"
USER_KEY = "sk-rel-user"
MSGS = [{"role": "user", "content": "hi"}]


def keys_toml(keys: dict[str, str], admin: tuple[str, ...], tier: str = "default") -> str:
    """A key file: each name -> key in one tier without limits, and the admin keys."""
    users = "".join(f'[[keys]]\nname = "{name}"\ntier = "{tier}"\nkey = "{key}"\n' for name, key in keys.items())
    admins = ", ".join(f'"{k}"' for k in admin)
    return f"[tiers.{tier}]\n{users}[admin]\nkeys = [{admins}]\n"


KEYS_TOML = keys_toml({"user": USER_KEY}, (ADMIN_KEY,))


def write_keys(tmp: Path, extra: str = "", text: str = KEYS_TOML) -> Path:
    p = tmp / "keys.toml"
    p.write_text(text + extra)
    return p


@dataclass
class Live:
    url: str
    built: Built | None = None
    proc: subprocess.Popen[bytes] | None = None
    admin_key: str | None = None

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def headers(self, key: str | None = None) -> dict[str, str]:
        key = key or self.admin_key
        return {"x-api-key": key} if key else {}

    def kv_used(self) -> int:
        r = httpx.get(self.url + "/admin/kv", headers=self.headers(), verify=False, timeout=10)
        assert r.status_code == 200, r.text
        return int(r.json()["kv_blocks_used"])

    def wait_kv_free(self, timeout_s: float = 10.0) -> int:
        """Poll /admin/kv until no block is used (or the deadline); the last count."""
        deadline = time.monotonic() + timeout_s
        while (used := self.kv_used()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return used

    def alive(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            return False
        try:
            return httpx.get(self.url + "/health", verify=False, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(self.url + "/metrics", headers=self.headers(), verify=False, timeout=10).text
        for line in text.splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            if head.split("{")[0] != name:
                continue
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                return float(value)
        return 0.0

    def rss_kb(self) -> int:
        pid = self.proc.pid if self.proc is not None else os.getpid()
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")


class EngineFailed(RuntimeError):
    """An engine that did not start: a child that exited or never answered /health (its log in the message)."""


@contextlib.contextmanager
def serving(cfg: ServeConfig) -> Iterator[tuple[Built, Any, threading.Thread]]:
    """`cfg`'s app on uvicorn in a thread (its own uvloop) on a bound socket: (built, server, thread) once it
    has started; stopped and joined after."""
    sock = bind("127.0.0.1", 0)
    built = build(cfg, sock)
    server = make_server(built)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise EngineFailed("in-process server did not start")
        time.sleep(0.01)
    try:
        yield built, server, thread
    finally:
        server.should_exit = True
        thread.join(20)
        sock.close()
        assert not thread.is_alive(), "server thread did not stop"


@contextlib.contextmanager
def in_process(tmp: Path, **overrides: Any) -> Iterator[Live]:
    """The real app on uvicorn in a thread (its own uvloop), keyed so /admin/kv works."""
    if "keys" not in overrides:
        overrides["keys"] = write_keys(tmp)
    cfg = ServeConfig(**{"model": "null", "host": "127.0.0.1", "port": 0, "grace_s": 2.0, **overrides})
    with serving(cfg) as (built, _server, _thread):
        yield Live(built.url, built=built, admin_key=ADMIN_KEY)


@contextlib.contextmanager
def child(tmp: Path, *args: str, keyed: bool = True, model: str = "null", prefix: tuple[str, ...] = (),
          health_timeout_s: float = 60.0, log: Path | None = None, python: str = sys.executable,
          cwd: Path | None = None, poll_s: float = 0.1) -> Iterator[Live]:
    """`zgtool serve --model MODEL ARGS` as a child process (after `prefix`, e.g. a taskset pin; `python`
    another install's interpreter, run in `cwd`), logging to `log` (default TMP/serve.log: one engine per
    folder); yields once /health answers (asked every `poll_s`), always stopped (SIGTERM, then SIGKILL)
    and reaped."""
    port = free_port()
    log = log or tmp / "serve.log"
    cmd = [*prefix, python, "-m", "zgtool", "serve", "--model", model, "--port", str(port), *args]
    if keyed:
        cmd += ["--keys", str(write_keys(tmp))]
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    scheme = "https" if "--tls" in args else "http"
    live = Live(f"{scheme}://127.0.0.1:{port}", proc=proc, admin_key=ADMIN_KEY if keyed else None)
    try:
        deadline = time.monotonic() + health_timeout_s
        while not live.alive():
            if proc.poll() is not None:
                raise EngineFailed(f"zgtool serve --model {model} exited {proc.returncode}:\n{log.read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise EngineFailed(f"zgtool serve --model {model} not healthy after {health_timeout_s:g} s:\n"
                                   f"{log.read_text()[-2000:]}")
            time.sleep(poll_s)
        yield live
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def raw_request(port: int, path: str, body: dict[str, Any] | bytes, *, headers: dict[str, str] | None = None,
                version: str = "1.1") -> bytes:
    """The exact bytes of one HTTP request."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    hdrs = {"host": f"127.0.0.1:{port}", "content-type": "application/json",
            "content-length": str(len(data)), **(headers or {})}
    head = f"POST {path} HTTP/{version}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
    return head.encode() + data


def connect(port: int, rcvbuf: int | None = None, timeout_s: float = 10.0) -> socket.socket:
    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(timeout_s)
    s.connect(("127.0.0.1", port))
    return s


def read_all(s: socket.socket) -> bytes:
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    return out


def anthropic_error(r: httpx.Response, status: int, etype: str) -> dict[str, Any]:
    """Assert the exact Anthropic error shape; the body."""
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == etype, body
    assert body["request_id"] == r.headers["request-id"], body
    return body


def openai_error(r: httpx.Response, status: int, etype: str, code: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "param", "code"} and err["type"] == etype, err
    if code is not None:
        assert err["code"] == code, err
    return err
