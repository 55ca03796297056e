"""At the fd limit new clients are still served (issue 22: they were reset until idle keep-alive
connections expired): `zgtool serve` under a lowered RLIMIT_NOFILE closes its oldest idle
keep-alive connections to make room, and caps idle connections per client address."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from zgtool.engine.server.idle import IdlePool
from zgtool.http.net import free_port

FD_SOFT = 256


def _limit_fds() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_SOFT, hard))


def _get_health(sock: socket.socket) -> bytes:
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            return buf
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
    while len(rest) < length:
        rest += sock.recv(4096)
    return head.split(b"\r\n")[0]


def test_new_clients_are_served_past_the_fd_limit_by_closing_the_oldest_idle_connections(tmp_path: Path):
    port = free_port()
    log = tmp_path / "serve.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "zgtool", "serve", "--model", "null", "--port", str(port),
                                 "--keep-alive-s", "120"], stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=_limit_fds)
    socks: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        # more idle keep-alive connections than the server has descriptors for
        for i in range(FD_SOFT + 60):
            s = socket.create_connection(("127.0.0.1", port), timeout=15)
            socks.append(s)
            assert _get_health(s) == b"HTTP/1.1 200 OK", f"connection {i} not served:\n{log.read_text()[-2000:]}"
        # the oldest idle ones were closed by the server (EOF), the newest are still open
        socks[0].settimeout(5)
        assert socks[0].recv(1) == b""
        assert _get_health(socks[-1]) == b"HTTP/1.1 200 OK"
    finally:
        for s in socks:
            s.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class _Transport:
    def __init__(self) -> None:
        self.closed = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


class _Conn:
    def __init__(self) -> None:
        self.transport = _Transport()


def test_one_client_address_holds_at_most_its_share_of_idle_connections_oldest_closed_first():
    pool = IdlePool(max_per_client=3, threshold=10_000)
    a = [_Conn() for _ in range(5)]
    b = _Conn()
    pool.add(b, "10.0.0.2")
    for c in a:
        pool.add(c, "10.0.0.1")
    assert [c.transport.closed for c in a] == [True, True, False, False, False]
    assert not b.transport.closed and len(pool) == 4
    pool.discard(a[2])                      # its next request arrived: no longer idle
    pool.make_room(10_000)                  # at the threshold: the oldest idle (b) goes first
    assert b.transport.closed and not a[3].transport.closed
