"""httpcore network pieces for the instrumented client: a backend that connects to the already
resolved address, and a stream that marks the request's first byte out and the response's
first byte in. Plugged in through httpcore's own `network_backend` seam.
"""

from __future__ import annotations

import socket
import ssl
import threading
from time import perf_counter_ns
from typing import Any

import httpcore
import httpcore._backends.sync


class _Marks(threading.local):
    """Socket-level marks of the request in flight on this thread (a Session is used by one thread
    at a time): the instant the request's first byte goes to the kernel and the instant the first
    response bytes come back, without h11 serialising/parsing time on either side."""

    connect_start_ns: int | None = None
    connect_end_ns: int | None = None
    first_write_ns: int | None = None
    first_read_ns: int | None = None
    armed: bool = False
    hold_headers: bool = False   # the request has a body: send headers and body in one write
    held: bytes | None = None

    def reset(self, *, has_body: bool) -> None:
        self.connect_start_ns = self.connect_end_ns = self.first_write_ns = self.first_read_ns = None
        self.hold_headers, self.held = has_body, None


MARKS = _Marks()


class _TimedStream(httpcore._backends.sync.SyncStream):
    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        m = MARKS
        if not buffer:
            return
        if m.armed:
            # httpcore writes headers and body separately; one write (as curl does for a small
            # POST) spares a syscall and a server wake-up that would be billed to the client
            if m.hold_headers:
                m.hold_headers, m.held = False, buffer
                return
            if m.held is not None:
                buffer, m.held = m.held + buffer, None
            if m.first_write_ns is None:
                m.first_write_ns = perf_counter_ns()
        super().write(buffer, timeout)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = super().read(max_bytes, timeout)
        if data and MARKS.armed and MARKS.first_read_ns is None and MARKS.first_write_ns is not None:
            MARKS.first_read_ns = perf_counter_ns()
        return data

    def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        tls = super().start_tls(ssl_context, server_hostname, timeout)
        return _TimedStream(tls._sock)  # type: ignore[attr-defined]


class _ResolvedBackend(httpcore.SyncBackend):
    """httpcore's sync backend minus its getaddrinfo: the URL already holds the resolved address,
    and a lookup inside connect_tcp (~0.1 ms of glibc even for an IP literal) would bill DNS
    work to connect_ms."""

    def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                    socket_options: Any = None) -> httpcore.NetworkStream:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for option in socket_options or ():
                sock.setsockopt(*option)
            if local_address is not None:
                sock.bind((local_address, 0))
            sock.settimeout(timeout)
            # connect_ms is the connect() call itself: socket creation is client CPU, not the handshake
            start = perf_counter_ns()
            sock.connect((host, port))
            if MARKS.armed:
                MARKS.connect_start_ns, MARKS.connect_end_ns = start, perf_counter_ns()
        except TimeoutError as exc:
            sock.close()
            raise httpcore.ConnectTimeout(str(exc)) from exc
        except OSError as exc:
            sock.close()
            raise httpcore.ConnectError(str(exc)) from exc
        return _TimedStream(sock)


def make_pool(ctx: ssl.SSLContext | None, *, keepalive: bool) -> httpcore.ConnectionPool:
    """One connection at most; keep-alive keeps it, --new-connection closes it after each answer."""
    return httpcore.ConnectionPool(ssl_context=ctx if ctx is not None else ssl.create_default_context(),
                                   max_connections=1, max_keepalive_connections=1 if keepalive else 0,
                                   http1=True, http2=False, network_backend=_ResolvedBackend())
