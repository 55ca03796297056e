"""Real loopback HTTP servers for the dcgm tests (a recorded-exposition server and a tiny
engine-admin server) and a helper that runs the real CLI in a subprocess.

A uniquely named module (not conftest) so tests import it without a tests package."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from zgtest import run_zgtool

from zgtool.http.net import free_port as _free_port

DATA = Path(__file__).parent / "data"


def data(name: str) -> str:
    return (DATA / name).read_text()


class _Quiet(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:  # keep pytest output clean
        pass


@dataclass
class Served:
    """A running loopback server; `body` is what GET /metrics returns right now."""

    server: ThreadingHTTPServer
    body: str = ""
    status: int = 200
    hits: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"


def _serve(make_handler: Callable[[Served], type[BaseHTTPRequestHandler]]) -> Iterator[Served]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    served = Served(server)
    server.RequestHandlerClass = make_handler(served)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _exporter_handler(served: Served) -> type[BaseHTTPRequestHandler]:
    class Handler(_Quiet):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            served.hits += 1
            if self.path.split("?")[0] != "/metrics":
                self._send(404, "404 page not found\n")
                return
            self._send(served.status, served.body)

        def _send(self, status: int, text: str) -> None:
            raw = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

    return Handler


@pytest.fixture
def exporter() -> Iterator[Served]:
    """A dcgm-exporter stand-in serving recorded expositions on 127.0.0.1:<free port>/metrics."""
    yield from _serve(_exporter_handler)


@pytest.fixture
def free_port() -> int:
    return _free_port()


@dataclass
class AdminBehaviour:
    admin_key: str | None = "adm-secret"
    kv: dict[str, Any] = field(default_factory=lambda: {
        "total_blocks": 64, "used_blocks": 10, "free_blocks": 54, "cached_blocks": 4,
        "largest_free_run": 30, "fragmentation": 0.444, "device": "cpu"})


def _admin_handler_factory(behaviour: AdminBehaviour) -> Callable[[Served], type[BaseHTTPRequestHandler]]:
    """Follows docs/CONTRACTS.md: GET /admin/kv, POST /admin/defrag, x-api-key admin key,
    errors in the engine's Anthropic-style error shape."""

    def make(served: Served) -> type[BaseHTTPRequestHandler]:
        class Handler(_Quiet):
            def _auth_ok(self) -> bool:
                if behaviour.admin_key is None:
                    return True
                if self.headers.get("x-api-key") == behaviour.admin_key:
                    return True
                self._json(401, {"type": "error", "error": {"type": "authentication_error",
                                                            "message": "invalid x-api-key"},
                                 "request_id": "req_test"})
                return False

            def do_GET(self) -> None:  # noqa: N802
                served.requests.append({"method": "GET", "path": self.path})
                if self.path != "/admin/kv":
                    self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": "no"}})
                elif self._auth_ok():
                    self._json(200, behaviour.kv)

            def do_POST(self) -> None:  # noqa: N802
                n = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                served.requests.append({"method": "POST", "path": self.path, "body": body})
                if self.path != "/admin/defrag":
                    self._json(404, {"type": "error", "error": {"type": "not_found_error", "message": "no"}})
                    return
                if not self._auth_ok():
                    return
                before = dict(behaviour.kv)
                after = dict(before)
                actions: list[str] = []
                if not body.get("dry_run"):
                    after.update(largest_free_run=after["free_blocks"], fragmentation=0.0)
                    actions.append("compacted 10 live blocks to the low end of the pool")
                    if body.get("drop_prefix_cache"):
                        after.update(cached_blocks=0, used_blocks=after["used_blocks"] - before["cached_blocks"],
                                     free_blocks=after["free_blocks"] + before["cached_blocks"])
                        actions.append("dropped 4 evictable prefix-cache blocks")
                    behaviour.kv = after
                self._json(200, {"before": before, "after": after, "actions": actions,
                                 "dry_run": bool(body.get("dry_run"))})

            def _json(self, status: int, obj: Any) -> None:
                raw = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        return Handler

    return make


@pytest.fixture
def admin_engine() -> Iterator[tuple[Served, AdminBehaviour]]:
    behaviour = AdminBehaviour()
    for served in _serve(_admin_handler_factory(behaviour)):
        yield served, behaviour


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess (exit codes and stderr exactly as a user sees them)."""
    return run_zgtool(*args, env=env, timeout_s=timeout)
