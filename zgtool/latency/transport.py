"""httpcore network pieces for the instrumented client: a backend that connects to the already
resolved address, and a stream that marks the request's first byte out and, with the kernel's
receive timestamps, when each response read's bytes arrived. Plugged in through httpcore's own
`network_backend` seam.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import ssl
import struct
import termios
import threading
from time import perf_counter_ns, time_ns
from typing import Any

import httpcore
import httpcore._backends.sync
from httpcore._exceptions import map_exceptions

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)     # Linux; Python does not export it
_TS_SPACE = socket.CMSG_SPACE(16)                            # one struct timespec
_DATA_SEGS_IN_AT = 152                                       # struct tcp_info: tcpi_data_segs_in
_TCP_INFO_LEN = 160
LAG_FLAG_NS = 200_000   # a read this late may carry merged segments: its receive time is not vouched for


class _RunDelay(threading.local):
    """This thread's run-queue wait so far (/proc/thread-self/schedstat, 2nd field, ns): time it was
    runnable but another process had the CPU. None where the kernel does not say."""

    fd: int | None = None
    tried: bool = False

    def ns(self) -> int | None:
        if not self.tried:
            self.tried = True
            try:
                self.fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
            except OSError:
                self.fd = None
        if self.fd is None:
            return None
        try:
            return int(os.pread(self.fd, 64, 0).split()[1])
        except (OSError, IndexError, ValueError):
            return None


RUN_DELAY = _RunDelay()


class _Marks(threading.local):
    """Socket-level marks of the request in flight on this thread (a Session is used by one thread
    at a time): the instant the request's first byte goes to the kernel and the instants response
    bytes arrived, without h11 serialising/parsing time on either side.

    Receive times are the kernel's own (SO_TIMESTAMPNS: when the segment reached the socket, the
    clock a packet capture uses), taken in the receive loop before any parsing, so a client that
    loses the CPU to the engine it measures does not bill its own wake-up to the server. What a
    late client can still get wrong — segments merged while it waited, which then carry the later
    segment's time — is measured per read (run-queue wait, bytes already queued, more than one data
    segment taken by one read) as `lag_ns`.
    """

    connect_start_ns: int | None = None
    connect_end_ns: int | None = None
    first_write_ns: int | None = None
    first_read_ns: int | None = None       # arrival of the response's first bytes
    last_read_ns: int | None = None        # arrival of the latest bytes read
    prev_return_ns: int | None = None      # when the previous read returned (or the request went out)
    lag_ns: int = 0                        # the worst read so far: how late this client may have seen bytes
    first_lag_ns: int = 0                  # the same for the response's first read (ttfb)
    kernel_rx: bool = True                 # every read so far had a kernel receive timestamp
    reads: int = 0
    armed: bool = False
    hold_headers: bool = False   # the request has a body: send headers and body in one write
    held: bytes | None = None

    def reset(self, *, has_body: bool) -> None:
        self.connect_start_ns = self.connect_end_ns = self.first_write_ns = self.first_read_ns = None
        self.last_read_ns = self.prev_return_ns = None
        self.lag_ns, self.first_lag_ns, self.kernel_rx, self.reads = 0, 0, True, 0
        self.hold_headers, self.held = has_body, None

    def note_read(self, *, arrival_ns: int, call_ns: int, return_ns: int, queued: int,
                  run_wait_ns: int | None, kernel: bool, merged_since_ns: int | None = None) -> None:
        if self.first_read_ns is None:
            self.first_read_ns = arrival_ns
        self.last_read_ns = arrival_ns
        lag = run_wait_ns or 0
        if not kernel:
            self.kernel_rx = False
            lag = max(lag, return_ns - arrival_ns)
        if queued and self.prev_return_ns is not None:
            # Bytes were waiting before we asked. The kernel merges segments queued behind an unread
            # one and keeps the latest time, so the earliest of them may have arrived any time
            # since the last read returned: that much is not vouched for.
            latest = arrival_ns if kernel else call_ns
            lag = max(lag, latest - self.prev_return_ns)
        if merged_since_ns is not None:
            # Nothing was queued when we asked, yet the read took more than one data segment: they
            # carry the last one's time, and the first may have come any time since we asked. The
            # run-queue wait does not always show why we were late: a wake-up sent to an idle
            # virtual CPU is queued there, and counted, only once the host runs that CPU again.
            lag = max(lag, arrival_ns - merged_since_ns)
        if self.reads == 0:
            self.first_lag_ns = lag
        self.lag_ns = max(self.lag_ns, lag)
        self.prev_return_ns = return_ns
        self.reads += 1


MARKS = _Marks()


def _queued(sock: socket.socket) -> int:
    """Bytes already in the socket's receive queue (FIONREAD)."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def _data_segments_in(sock: socket.socket) -> int | None:
    """Data segments this connection has received so far (tcp_info.tcpi_data_segs_in, Linux 4.6+)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except (OSError, AttributeError):
        return None
    if len(info) < _DATA_SEGS_IN_AT + 4:
        return None
    return int(struct.unpack_from("I", info, _DATA_SEGS_IN_AT)[0])


def _kernel_ns(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    """The SCM_TIMESTAMPNS receive time (CLOCK_REALTIME) on the perf_counter_ns clock."""
    for level, kind, raw in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
            sec, nsec = struct.unpack("qq", raw[:16])
            offset = time_ns() - perf_counter_ns()
            return sec * 1_000_000_000 + nsec - offset
    return None


def _on_loopback(sock: socket.socket) -> bool:
    """Loopback delivers each send as its own segment (no GRO, 64 KiB MTU), so a read that took
    more than one data segment took more than one send. Over a NIC, GRO hands over segments that
    arrived together as one, and counts them all."""
    try:
        host = sock.getpeername()[0]
    except (OSError, IndexError):
        return False
    return host == "::1" or host.startswith(("127.", "::ffff:127."))


class _TimedStream(httpcore._backends.sync.SyncStream):
    loopback: bool | None = None

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
                # before the call: the segment is on the wire ~0.05 ms later, while the return can
                # be milliseconds late (the woken server preempts us inside send on a busy box), and
                # what arrives meanwhile waits for our first read from the moment the request left
                m.first_write_ns = m.prev_return_ns = perf_counter_ns()
        super().write(buffer, timeout)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        m = MARKS
        if not (m.armed and m.first_write_ns is not None):
            return super().read(max_bytes, timeout)
        sock = self._sock
        plain = type(sock) is socket.socket     # TLS reads go through the SSL object: no ancillary data
        asked_ns = perf_counter_ns()
        queued = _queued(sock) if plain else 0
        if self.loopback is None:
            self.loopback = plain and _on_loopback(sock)
        segs0 = _data_segments_in(sock) if self.loopback and not queued else None
        wait0 = RUN_DELAY.ns()
        call_ns = perf_counter_ns()
        if plain:
            with map_exceptions({socket.timeout: httpcore.ReadTimeout, OSError: httpcore.ReadError}):
                sock.settimeout(timeout)
                data, anc, _flags, _addr = sock.recvmsg(max_bytes, _TS_SPACE)
            return_ns = perf_counter_ns()
            kernel = _kernel_ns(anc) if data else None
        else:
            data = super().read(max_bytes, timeout)
            return_ns, kernel = perf_counter_ns(), None
        wait1 = RUN_DELAY.ns()
        if data:
            arrival = kernel if kernel is not None and kernel <= return_ns else return_ns
            segs1 = _data_segments_in(sock) if segs0 is not None else None
            merged = segs0 is not None and segs1 is not None and (segs1 - segs0) % 2**32 > 1
            m.note_read(arrival_ns=arrival, call_ns=call_ns, return_ns=return_ns, queued=queued,
                        run_wait_ns=None if wait0 is None or wait1 is None else wait1 - wait0,
                        kernel=kernel is not None, merged_since_ns=asked_ns if merged else None)
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
            with contextlib.suppress(OSError):      # receive times from the kernel where it gives them
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
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
