"""Real local servers for the probe tests: an SSE origin (uvicorn, in a thread), nginx in
front of it (streaming and buffered, config generated in tmp), a TLS server with a
self-signed certificate made with `cryptography`, and a TCP port that is not HTTP."""

from __future__ import annotations

import asyncio
import datetime as dt
import http.server
import ipaddress
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
import zgtest

from zgtool.http.net import free_port

ORIGIN_TEXT = "token "


wait_port = zgtest.wait_port


@dataclass
class OriginConfig:
    tokens: int = 12
    token_delay_ms: float = 15.0
    emit_times: bool = True          # carry the emission times in a final timing event
    extra_headers: tuple[tuple[str, str], ...] = ()
    # "paced": one event per token_delay_ms. Two shapes that fooled the buffering verdict:
    # "padded_hold": an SSE comment every token_delay_ms (bytes keep flowing) while the data
    #   events are held, then all of them in one write (a hop that pads but buffers);
    # "late_burst": nothing for late_start_ms, then the events one write each, burst_delay_ms
    #   apart (an origin with a slow start and a fast run: nothing held them).
    shape: str = "paced"
    late_start_ms: float = 300.0
    burst_delay_ms: float = 3.0


class FakeOrigin:
    """An ASGI LLM origin speaking Anthropic and OpenAI SSE, with paced tokens."""

    def __init__(self, cfg: OriginConfig) -> None:
        self.cfg = cfg

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        path = scope["path"]
        if path == "/health":
            await self._json(send, 200, {"status": "ok"})
            return
        if path not in ("/v1/messages", "/v1/chat/completions"):
            await self._json(send, 404, {"type": "error", "error": {"type": "not_found_error", "message": path}})
            return
        req = json.loads(body or b"{}")
        if not req.get("stream"):
            await self._json(send, 200, {"type": "message", "content": [{"type": "text", "text": "hi"}]})
            return
        await self._stream(send, openai=path.endswith("completions"))

    def _headers(self, ctype: bytes) -> list[tuple[bytes, bytes]]:
        h = [(b"content-type", ctype), (b"request-id", b"inference-fake1"), (b"x-request-id", b"inference-fake1"),
             (b"server-timing", b"queue;dur=0.1, prefill;dur=1.0, decode;dur=5.0, total;dur=6.5"),
             (b"x-gpu-load-hint", b'{"kv_util": 0.1, "running": 1, "waiting": 0}')]
        return h + [(k.encode(), v.encode()) for k, v in self.cfg.extra_headers]

    async def _json(self, send: Any, status: int, obj: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": self._headers(b"application/json")})
        await send({"type": "http.response.body", "body": json.dumps(obj).encode()})

    async def _stream(self, send: Any, openai: bool) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": self._headers(b"text/event-stream") + [(b"cache-control", b"no-cache")]})

        async def ev(name: str | None, obj: Any) -> None:
            line = (f"event: {name}\n" if name else "") + f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n"
            await send({"type": "http.response.body", "body": line.encode(), "more_body": True})

        if not openai:
            await ev("message_start", {"type": "message_start", "message": {"id": "msg_fake"}})
            await ev("content_block_start", {"type": "content_block_start", "index": 0})
        times = []
        token = (f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': ORIGIN_TEXT}}]})}\n\n" if openai
                 else "event: content_block_delta\ndata: " + json.dumps(
                     {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": ORIGIN_TEXT}})
                 + "\n\n")
        if self.cfg.shape == "padded_hold":
            for _ in range(self.cfg.tokens):
                await asyncio.sleep(self.cfg.token_delay_ms / 1e3)
                await send({"type": "http.response.body", "body": b": padding\n\n", "more_body": True})
            await send({"type": "http.response.body", "body": (token * self.cfg.tokens).encode(), "more_body": True})
        elif self.cfg.shape == "late_burst":
            await asyncio.sleep(self.cfg.late_start_ms / 1e3)
            for i in range(self.cfg.tokens):
                if i:
                    await asyncio.sleep(self.cfg.burst_delay_ms / 1e3)
                await send({"type": "http.response.body", "body": token.encode(), "more_body": True})
        for i in range(self.cfg.tokens if self.cfg.shape == "paced" else 0):
            if i:
                await asyncio.sleep(self.cfg.token_delay_ms / 1e3)
            times.append(round(time.perf_counter() * 1e3, 3))
            await send({"type": "http.response.body", "body": token.encode(), "more_body": True})
        if self.cfg.emit_times:
            await ev(None if openai else "zgtool_timing", {"type": "zgtool_timing", "token_times_ms": times})
        if openai:
            await ev(None, "[DONE]")
        else:
            await ev("message_stop", {"type": "message_stop"})
        await send({"type": "http.response.body", "body": b""})


class ThreadedUvicorn:
    """uvicorn serving an ASGI app from a thread on a free loopback port."""

    def __init__(self, app: Any) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        cfg = uvicorn.Config(app, log_level="error", lifespan="off", loop="asyncio")
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ThreadedUvicorn:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        zgtest.stop_uvicorn_thread(self.server, self.thread)
        self.sock.close()


NGINX_CONF = """
{user}worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {d}/cb; proxy_temp_path {d}/pt; fastcgi_temp_path {d}/ft;
    uwsgi_temp_path {d}/ut; scgi_temp_path {d}/st;
    upstream origin {{ server 127.0.0.1:{origin}; keepalive 4; }}
    server {{
        listen 127.0.0.1:{streaming};
        location / {{ proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection "";
                     proxy_buffering off; }}
    }}
    server {{
        listen 127.0.0.1:{buffered};
        location / {{ proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection "";
                     proxy_buffering on; proxy_ignore_headers X-Accel-Buffering;
                     gzip on; gzip_proxied any; gzip_types application/json text/event-stream; }}
    }}
}}
"""


class Nginx:
    """Real nginx with a streaming front and a buffered front for one origin port."""

    def __init__(self, origin_port: int, run_dir: Path) -> None:
        self.dir = run_dir
        self.streaming, self.buffered = free_port(), free_port()
        user = "user root;\n" if os.geteuid() == 0 else ""
        (run_dir / "nginx.conf").write_text(NGINX_CONF.format(
            user=user, d=run_dir, origin=origin_port, streaming=self.streaming, buffered=self.buffered))
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Nginx:
        binary = shutil.which("nginx") or "/usr/sbin/nginx"
        self.proc = subprocess.Popen([binary, "-p", str(self.dir), "-c", str(self.dir / "nginx.conf")],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            wait_port(self.streaming)
            wait_port(self.buffered)
        except RuntimeError:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def self_signed(cn: str, sans: list[str], ips: list[str]) -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    now = dt.datetime.now(dt.UTC)
    alt = [x509.DNSName(s) for s in sans] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False).sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        body = b"hello over tls\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET  # noqa: N815

    def log_message(self, *args: Any) -> None:
        pass


class TLSServer:
    """A threaded HTTPS server with a generated certificate and a chosen ALPN list."""

    def __init__(self, run_dir: Path, *, cn: str = "probe.test", sans: tuple[str, ...] = ("probe.test", "localhost"),
                 alpn: tuple[str, ...] = ("http/1.1",)) -> None:
        cert, key = self_signed(cn, list(sans), ["127.0.0.1"])
        (run_dir / "cert.pem").write_bytes(cert)
        (run_dir / "key.pem").write_bytes(key)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(run_dir / "cert.pem", run_dir / "key.pem")
        ctx.set_alpn_protocols(list(alpn))
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = int(self.httpd.server_address[1])
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def __enter__(self) -> TLSServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


class NotHTTPServer:
    """Accepts connections and answers with an SSH banner: a port that does not speak HTTP."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = int(self.sock.getsockname()[1])
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        self.sock.settimeout(0.05)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
                time.sleep(0.05)

    def __enter__(self) -> NotHTTPServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()
