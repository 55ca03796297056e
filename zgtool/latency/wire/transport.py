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

from zgtool.latency.wire.bodymap import BodyMap

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)     # Linux; Python does not export it
SO_TIMESTAMPING = getattr(socket, "SO_TIMESTAMPING", 37)
# the kernel's time each send went to the device, keyed by byte (TX_SOFTWARE | SOFTWARE | OPT_ID | OPT_TSONLY)
_TX_FLAGS = (1 << 1) | (1 << 4) | (1 << 7) | (1 << 11)
_MSG_ERRQUEUE = 0x2000
_RECVERR = {(socket.SOL_IP, 11), (socket.IPPROTO_IPV6, 25)}   # IP_RECVERR, IPV6_RECVERR: sock_extended_err
_HEAD_LIMIT = 64 * 1024
_TS_SPACE = socket.CMSG_SPACE(16)                            # one struct timespec
_BYTES_RECEIVED_AT = 128                                     # struct tcp_info: tcpi_bytes_received (u64)
_DATA_SEGS_IN_AT = 152                                       # struct tcp_info: tcpi_data_segs_in (u32)
_TCP_INFO_LEN = 160
_HEAD_END = b"\r\n\r\n"
LAG_FLAG_NS = 200_000   # a figure this unsure is not vouched for: its request is flagged


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
    at a time): the instant the request's first byte goes to the kernel and, per response read, when
    its bytes arrived, without h11 serialising/parsing time on either side.

    Receive times are the kernel's own (SO_TIMESTAMPNS: when the segment reached the socket, the
    clock a packet capture uses), taken in the receive loop before any parsing, so a client that
    loses the CPU does not bill its own wake-up to the server. One read's time is that of the last
    segment it took: the kernel merges segments queued behind an unread one and keeps the latest
    time. So each read also records its `slack`: how much earlier than its time its first byte may
    have arrived. A read that took one data segment (counted on loopback, where each send is one
    segment, with tcp_info's segment and byte counters) has none; one that took several has the
    time since the client last saw an empty queue. A point at a read's last byte (a header end, an
    SSE event that ends the read) carries that read's own time and no slack (`end_slack`).
    """

    connect_start_ns: int | None = None
    connect_end_ns: int | None = None
    first_write_ns: int | None = None      # just before the request's first send call
    send_return_ns: int | None = None      # when that call returned
    tx_ns: int | None = None               # the kernel's time it went to the device (SO_TIMESTAMPING)
    # where the request and its answer sit on the connection (plain TCP only): the packet clock's keys
    conn: tuple[bytes, int, int] | None = None      # (server address, server port, client port)
    up_offset: int | None = None           # the request's first byte in the client's byte stream
    down_offset: int | None = None         # the answer's first byte in the server's byte stream
    read_at: list[int]                     # per read, the answer offset of its first byte
    rx_bytes: int = 0                      # answer bytes read so far
    head: bytes = b""                      # the answer's head, for its transfer coding
    body: BodyMap | None = None            # decoded body byte -> answer offset
    first_read_ns: int | None = None       # arrival of the response's first bytes
    last_read_ns: int | None = None        # arrival of the latest bytes read
    prev_return_ns: int | None = None      # when the previous read returned (or the request went out)
    lag_ns: int = 0                        # the largest slack of any read so far
    first_lag_ns: int = 0                  # the slack of the response's first read (ttfb)
    kernel_rx: bool = True                 # every read so far had a kernel receive timestamp
    reads: int = 0
    armed: bool = False
    hold_headers: bool = False   # the request has a body: send headers and body in one write
    held: bytes | None = None
    # per read, in order: arrival (its last segment's time), slack of its first byte, slack of its last byte
    arrivals: list[int]
    slack: list[int]
    end_slack: list[int]
    # the last moment the receive queue was seen empty: (time, tcp_info counters then); None: not known
    sync: tuple[int, tuple[int, int]] | None = None
    head_tail: bytes = b""                 # the last bytes of the response head so far, for its end
    head_point: tuple[int, int] | None = None      # (arrival, slack) of the response head's last byte
    body_point: tuple[int, int] | None = None      # (arrival, slack) of the body's first byte
    body_next: bool = False                # the head ended a read: the body starts the next one

    def reset(self, *, has_body: bool) -> None:
        self.connect_start_ns = self.connect_end_ns = self.first_write_ns = self.first_read_ns = None
        self.send_return_ns = self.tx_ns = self.conn = self.up_offset = self.down_offset = None
        self.read_at, self.rx_bytes, self.head, self.body = [], 0, b"", None
        self.last_read_ns = self.prev_return_ns = None
        self.lag_ns, self.first_lag_ns, self.kernel_rx, self.reads = 0, 0, True, 0
        self.hold_headers, self.held = has_body, None
        self.arrivals, self.slack, self.end_slack = [], [], []
        self.sync, self.head_tail, self.head_point, self.body_point, self.body_next = None, b"", None, None, False

    def note_read(self, data: bytes, *, arrival_ns: int, slack_ns: int, end_slack_ns: int, return_ns: int,
                  kernel: bool) -> None:
        if self.first_read_ns is None:
            self.first_read_ns = arrival_ns
            self.first_lag_ns = slack_ns
        self.last_read_ns = arrival_ns
        if not kernel:
            self.kernel_rx = False
        self.lag_ns = max(self.lag_ns, slack_ns)
        self.prev_return_ns = return_ns
        self.arrivals.append(arrival_ns)
        self.slack.append(slack_ns)
        self.end_slack.append(end_slack_ns)
        self.reads += 1
        self._note_head(data, arrival_ns, slack_ns, end_slack_ns)
        self._note_offsets(data)

    def _note_offsets(self, data: bytes) -> None:
        """Answer offsets of this read and, past the head, of the body bytes it holds."""
        start = self.rx_bytes
        self.read_at.append(start)
        self.rx_bytes += len(data)
        if self.body is not None:
            self.body.feed(data)
            return
        if len(self.head) >= _HEAD_LIMIT:
            return
        self.head += data[:_HEAD_LIMIT]
        at = self.head.find(_HEAD_END)
        if at < 0:
            return
        end = at + len(_HEAD_END)
        chunked = b"transfer-encoding: chunked" in self.head[:end].lower()
        self.head = self.head[:end]
        self.body = BodyMap(end, chunked)
        self.body.feed(data[end - start:])

    def head_end(self) -> int | None:
        """The answer offset of the head's last byte (its blank line's; for a chunked body not the first chunk's
        size line, which may come much later: vLLM sends a stream's head at once, its first chunk with a token)."""
        return self.body.start - 1 if self.body is not None else None

    def _note_head(self, data: bytes, arrival_ns: int, slack_ns: int, end_slack_ns: int) -> None:
        if self.body_next:
            self.body_point, self.body_next = (arrival_ns, slack_ns), False
        if self.head_point is not None:
            return
        buf = self.head_tail + data
        at = buf.find(_HEAD_END)
        if at < 0:
            self.head_tail = buf[-(len(_HEAD_END) - 1):]
            return
        end = at + len(_HEAD_END)
        if end == len(buf):                # the head ended this read: the body starts the next one
            self.head_point, self.body_next = (arrival_ns, end_slack_ns), True
        else:
            self.head_point = self.body_point = (arrival_ns, slack_ns)

    def point(self, read: int, *, at_end: bool) -> tuple[int, int] | None:
        """(arrival, slack) of a point in read `read` (0-based): at its last byte, or anywhere before."""
        if not 0 <= read < self.reads:
            return None
        return self.arrivals[read], (self.end_slack if at_end else self.slack)[read]


MARKS = _Marks()


def _queued(sock: socket.socket) -> int:
    """Bytes already in the socket's receive queue (FIONREAD)."""
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def _rx_counters(sock: socket.socket) -> tuple[int, int] | None:
    """(data segments, bytes) this connection has received so far: tcp_info's tcpi_data_segs_in and
    tcpi_bytes_received (Linux 4.6+), read in one call."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except (OSError, AttributeError):
        return None
    if len(info) < _DATA_SEGS_IN_AT + 4:
        return None
    return (int(struct.unpack_from("I", info, _DATA_SEGS_IN_AT)[0]),
            int(struct.unpack_from("Q", info, _BYTES_RECEIVED_AT)[0]))


def _segments_at_most(before: tuple[int, int], after: tuple[int, int], nbytes: int) -> int:
    """How many data segments at most a read of `nbytes` took, when `before` was counted with the
    queue empty and `after` just after the read: bytes counted beyond those read came in at least
    one more segment, still queued."""
    segs = (after[0] - before[0]) % 2**32
    extra = after[1] - before[1] - nbytes
    return segs - 1 if extra > 0 else segs


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


_MAX_REPORTS = 256     # transmit reports read per send at most


def _error_report(sock: socket.socket) -> tuple[int | None, int | None] | None:
    """One transmit report from the socket's error queue: (kernel time on perf_counter, byte), None: none left."""
    try:
        _d, anc, _f, _a = sock.recvmsg(0, 512, _MSG_ERRQUEUE)
    except OSError:
        return None
    key = ts = None
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING and len(raw) >= 16:
            sec, nsec = struct.unpack("qq", raw[:16])
            ts = sec * 1_000_000_000 + nsec - (time_ns() - perf_counter_ns())
        elif (level, kind) in _RECVERR and len(raw) >= 16:
            key = struct.unpack_from("I", raw, 12)[0]        # sock_extended_err.ee_data: the byte
    if ts is None and key is None:
        return None        # a read with no report in it (seen through a hop): the queue holds none
    return ts, key


class _TimedStream(httpcore._backends.sync.SyncStream):
    loopback: bool | None = None
    sent: int = 0                  # bytes sent and received on this connection so far (plain TCP)
    received: int = 0
    tx_stamps: bool = False        # SO_TIMESTAMPING's transmit times are on
    key: tuple[bytes, int, int] | None = None

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
                if self._counts():
                    self._sync(m)     # nothing of the answer can be here yet: count from now
                # the lower bound of every arrival: nothing of the answer can come before the call;
                # the figures start at the kernel's own send time (resolved after the answer)
                m.first_write_ns = m.prev_return_ns = perf_counter_ns()
                m.up_offset, m.conn = self.sent, self._key()
                super().write(buffer, timeout)
                m.send_return_ns = perf_counter_ns()
                self.sent += len(buffer)
                if self.tx_stamps:
                    m.tx_ns = self._tx_time(self.sent - 1)
                return
        super().write(buffer, timeout)
        self.sent += len(buffer)

    def _key(self) -> tuple[bytes, int, int] | None:
        """(server address, server port, client port) of a plain TCP connection: its packet clock key."""
        if self.key is None and type(self._sock) is socket.socket:
            from zgtool.latency.wire.pktclock import address_bytes

            try:
                peer, local = self._sock.getpeername(), self._sock.getsockname()
                self.key = (address_bytes(peer[0]), int(peer[1]), int(local[1]))
            except (OSError, ValueError, IndexError):
                self.key = None
        return self.key

    def _tx_time(self, last_byte: int) -> int | None:
        """The kernel's transmit time of the send whose last byte is `last_byte` (perf_counter clock), taking
        every queued transmit report (an unread one would make the socket poll as in error)."""
        found = None
        sock = self._sock
        timeout = sock.gettimeout()
        sock.settimeout(0)         # a socket with a timeout would wait for one to come
        try:
            for _ in range(_MAX_REPORTS):      # bounded: a queue that never empties must not hang a run
                if (report := _error_report(sock)) is None:
                    break
                if report[0] is not None and report[1] == last_byte % 2**32:
                    found = report[0]
        finally:
            sock.settimeout(timeout)
        return found


    def _counts(self) -> bool:
        """Segments can be counted: a plain socket on loopback, where each send is one segment (no GRO,
        64 KiB MTU). Over a NIC, GRO hands over segments that arrived together as one, and counts them all."""
        if self.loopback is None:
            self.loopback = type(self._sock) is socket.socket and _on_loopback(self._sock)
        return self.loopback

    def _sync(self, m: _Marks) -> None:
        """Note this moment as one with nothing unread: what is counted later arrived after it."""
        t = perf_counter_ns()
        counters = _rx_counters(self._sock)      # before FIONREAD: an empty queue then vouches for them
        m.sync = (t, counters) if counters is not None and not _queued(self._sock) else None

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        m = MARKS
        if not (m.armed and m.first_write_ns is not None):
            data = super().read(max_bytes, timeout)
            self.received += len(data)
            return data
        if m.down_offset is None:
            m.down_offset = self.received
        if self.tx_stamps:      # a transmit report left queued would make the socket poll as in error
            tx = self._tx_time(self.sent - 1)
            m.tx_ns = m.tx_ns if tx is None else tx
        sock = self._sock
        plain = type(sock) is socket.socket     # TLS reads go through the SSL object: no ancillary data
        count = self._counts()
        if count and m.sync is None:
            self._sync(m)
        asked_ns = perf_counter_ns()
        queued = _queued(sock) if plain else 0
        if m.sync is not None and not queued:
            m.sync = (asked_ns, m.sync[1])       # still nothing unread: nothing arrived since
        wait0 = RUN_DELAY.ns()
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
        if not data:
            return data
        self.received += len(data)
        arrival = kernel if kernel is not None and kernel <= return_ns else return_ns
        # every byte of this read arrived after `lower`: the last empty queue, else the last read
        lower = max(m.sync[0] if m.sync is not None else m.prev_return_ns or m.first_write_ns, m.first_write_ns)
        most = None
        if count and m.sync is not None:
            after = _rx_counters(sock)
            most = _segments_at_most(m.sync[1], after, len(data)) if after is not None else None
        run_wait = 0 if wait0 is None or wait1 is None else max(0, wait1 - wait0)
        if kernel is None:
            # our own clock: late by the run-queue wait, or back to `lower` for bytes already queued
            slack = end_slack = max(run_wait, return_ns - lower if queued else 0)
        else:
            if most == 1:
                slack = 0                            # one segment: its own time
            elif count:
                slack = arrival - lower              # several (or not known): the first may be that early
            else:
                # a NIC: segments merge when the client was late (it waited for a CPU) or bytes waited
                slack = max(run_wait, arrival - lower if queued else 0)
            # a read cut at max_bytes may end inside a segment merged with later ones
            end_slack = slack if len(data) >= max_bytes else 0
        m.note_read(data, arrival_ns=arrival, slack_ns=slack, end_slack_ns=end_slack, return_ns=return_ns,
                    kernel=kernel is not None)
        if count:
            self._sync(m)
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
            tx = True
            try:        # transmit times: TCP takes the option once connected (its byte counter starts here)
                sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, _TX_FLAGS)
            except OSError:
                tx = False
        except TimeoutError as exc:
            sock.close()
            raise httpcore.ConnectTimeout(str(exc)) from exc
        except OSError as exc:
            sock.close()
            raise httpcore.ConnectError(str(exc)) from exc
        stream = _TimedStream(sock)
        stream.tx_stamps = tx
        return stream


def make_pool(ctx: ssl.SSLContext | None, *, keepalive: bool) -> httpcore.ConnectionPool:
    """One connection at most; keep-alive keeps it, --new-connection closes it after each answer."""
    return httpcore.ConnectionPool(ssl_context=ctx if ctx is not None else ssl.create_default_context(),
                                   max_connections=1, max_keepalive_connections=1 if keepalive else 0,
                                   http1=True, http2=False, network_backend=_ResolvedBackend())
