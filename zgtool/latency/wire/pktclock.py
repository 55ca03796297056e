"""The kernel's own time of every TCP segment of the run's connections: an AF_PACKET socket (CAP_NET_RAW)
with a BPF filter on the targets' ports, read after each answer, never in the timed path.

Why not the client socket's own receive timestamps alone: on TCP, SO_TIMESTAMPNS gives a read the time of the
newest segment it took, and a segment queued behind an unread one is merged into it and keeps the later time,
so a client woken late reads several segments under the last one's time. A packet socket gets every segment
as its own datagram with its own time, the time tcpdump reports. Measured on this 2-core box under a CPU
burner on both cores (bench/kernel_rx_clock.py, against tcpdump on lo): TTFB and first-token errors within
0.05 ms in 98-100% of requests (worst 0.02 ms), where the socket's own timestamps had p99 errors of 6-19 ms.

Segments are located by TCP sequence number, counted from each direction's SYN (the capture opens before
the run's first connection), so a point of an answer (its first byte, its head's end, a token event's
last byte) is looked up by its byte offset on the connection.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from time import perf_counter_ns, time_ns

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SO_ATTACH_FILTER = 26
SO_RCVBUFFORCE = 33
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4
SNAP_BYTES = 128                 # IP and TCP headers: the payload is never copied
RCVBUF_BYTES = 32 << 20
UP, DOWN = "up", "down"         # client -> server, server -> client

Key = tuple[bytes, int, int, str]      # (server address, server port, client port, direction)


def _asm(ports: list[int]) -> list[tuple[int, int, int, int]]:
    """Classic BPF over a cooked (SOCK_DGRAM) IP packet: TCP to or from any of `ports`, headers only."""
    prog: list[tuple[str, int, object, object, int]] = []   # (label, code, jt, jf, k); jt/jf: label or 0

    def op(code: int, k: int = 0, jt: object = 0, jf: object = 0, label: str = "") -> None:
        prog.append((label, code, jt, jf, k))

    op(0x30, 0)                              # ldb [0]
    op(0x54, 0xF0)                           # and #0xf0
    op(0x15, 0x40, 0, "v6")                  # jeq #0x40 (IPv4)
    op(0x30, 9)                              # ldb [9]
    op(0x15, 6, 0, "drop")                   # jeq #6 (TCP)
    op(0xB1, 0)                              # ldxb 4*([0]&0xf)
    for off in (0, 2):                       # source, destination port
        op(0x48, off)                        # ldh [x+off]
        for p in ports:
            op(0x15, p, "accept", 0)
    op(0x06, 0)                              # ret #0
    op(0x15, 0x60, 0, "drop", label="v6")    # jeq #0x60 (IPv6)
    op(0x30, 6)                              # ldb [6]: next header (no extension headers)
    op(0x15, 6, 0, "drop")
    for off in (40, 42):
        op(0x28, off)                        # ldh [off]
        for p in ports:
            op(0x15, p, "accept", 0)
    op(0x06, 0, label="drop")
    op(0x06, SNAP_BYTES, label="accept")
    where = {label: i for i, (label, *_r) in enumerate(prog) if label}

    def rel(i: int, j: object) -> int:
        return where[j] - i - 1 if isinstance(j, str) else int(j)  # type: ignore[call-overload]

    return [(code, rel(i, jt), rel(i, jf), k) for i, (_l, code, jt, jf, k) in enumerate(prog)]


def bpf_program(ports: list[int]) -> bytes:
    ins = _asm(ports)
    if any(not 0 <= jt <= 255 or not 0 <= jf <= 255 for _c, jt, jf, _k in ins):
        raise ValueError("too many ports for one filter")
    return b"".join(struct.pack("HBBI", *i) for i in ins)


@dataclass
class Segments:
    """One direction of one connection: its ISN and its data segments (start, end, kernel time ns)."""

    isn: int | None = None
    spans: list[tuple[int, int, int, bool]] | None = None   # (start, end, time ns, the received copy)


class PacketClock:
    """Every segment to or from the run's server ports, with the kernel's time (CLOCK_REALTIME, turned into
    the client's perf_counter clock when read out). One per run, shared by every worker thread."""

    def __init__(self, ports: list[int]) -> None:
        import ctypes

        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
        try:
            prog = bpf_program(sorted(set(ports)))
            self._prog = ctypes.create_string_buffer(prog)
            fprog = struct.pack("HP", len(prog) // 8, ctypes.addressof(self._prog))
            self.sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
            self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)
            except OSError:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
            self.sock.setblocking(False)
        except BaseException:
            self.sock.close()
            raise
        self.ports = set(ports)
        self.lock = threading.Lock()
        self.conns: dict[Key, Segments] = {}
        # the clocks' offset, read once: a later step of the wall clock (NTP) must not move figures
        self.offset_ns = time_ns() - perf_counter_ns()

    @classmethod
    def open(cls, ports: list[int]) -> tuple[PacketClock | None, str | None]:
        """(the clock, None) or (None, why not): no CAP_NET_RAW, no AF_PACKET (not Linux)."""
        if not hasattr(socket, "AF_PACKET"):
            return None, "no packet sockets on this system"
        try:
            return cls(ports), None
        except PermissionError:
            return None, "no CAP_NET_RAW for a packet socket"
        except OSError as exc:
            return None, f"packet socket unavailable ({exc.strerror or exc})"

    def close(self) -> None:
        self.sock.close()

    def drain(self) -> None:
        """Take every queued packet into the per-connection tables."""
        with self.lock:
            while True:
                try:
                    data, anc, _flags, addr = self.sock.recvmsg(SNAP_BYTES, 64)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:
                    return
                for level, kind, raw in anc:
                    if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
                        sec, nsec = struct.unpack("qq", raw[:16])
                        self._note(data, sec * 1_000_000_000 + nsec - self.offset_ns, addr[2] == PACKET_OUTGOING)
                        break

    def _note(self, ip: bytes, t_ns: int, outgoing: bool) -> None:
        if len(ip) < 20:
            return
        if ip[0] >> 4 == 4:
            ihl = (ip[0] & 0xF) * 4
            size = struct.unpack_from("!H", ip, 2)[0] - ihl
            src, dst = ip[12:16], ip[16:20]
        else:
            ihl = 40
            size = struct.unpack_from("!H", ip, 4)[0]
            src, dst = ip[8:24], ip[24:40]
        if len(ip) < ihl + 14:
            return
        sport, dport, seq = struct.unpack_from("!HHI", ip, ihl)
        flags = ip[ihl + 13]
        payload = size - (ip[ihl + 12] >> 4) * 4
        up = dport in self.ports
        key: Key = (dst, dport, sport, UP) if up else (src, sport, dport, DOWN)
        seg = self.conns.setdefault(key, Segments())
        if flags & 0x02:                                  # SYN: this direction's initial sequence number
            if seg.isn != seq:
                seg.isn, seg.spans = seq, []
            return
        if payload <= 0 or seg.isn is None or seg.spans is None:
            return
        # on loopback each segment is seen twice: as sent and as received. tcpdump on lo shows the received
        # copy (a few us later under load), so that one is preferred both ways; over a NIC only one copy exists
        start = (seq - seg.isn - 1) % 2**32
        seg.spans.append((start, start + payload, t_ns, not outgoing))

    def time_of(self, server: bytes, server_port: int, client_port: int, direction: str,
                offset: int) -> int | None:
        """The perf_counter time of the segment holding byte `offset` of that direction, None if not seen."""
        seg = self.conns.get((server, server_port, client_port, direction))
        if seg is None or not seg.spans:
            return None
        off = offset % 2**32
        best: dict[bool, int] = {}
        for a, b, t, own in seg.spans:
            if a <= off < b and (own not in best or t < best[own]):
                best[own] = t
        return best.get(True, best.get(False))

    def forget(self, server: bytes, server_port: int, client_port: int, up_to: dict[str, int]) -> None:
        """Drop a connection's segments wholly before these offsets (per direction): they are settled."""
        with self.lock:
            for direction, end in up_to.items():
                seg = self.conns.get((server, server_port, client_port, direction))
                if seg is not None and seg.spans:
                    seg.spans = [s for s in seg.spans if s[1] > end]


def address_bytes(host: str) -> bytes:
    """An IP literal as the packet carries it (IPv4-mapped IPv6 as its IPv4 address)."""
    if host.startswith("::ffff:") and "." in host:
        host = host[7:]
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.inet_pton(family, host)


class _Current:
    """The run's packet clock, where every Session finds it (one run at a time per process)."""

    clock: PacketClock | None = None
    why_not: str | None = None


CURRENT = _Current()
SETTLE_S = 0.02       # enabling kernel timestamps is deferred to a work queue: let it land before any packet


@contextlib.contextmanager
def running(ports: list[int]) -> Iterator[str | None]:
    """Open the packet clock for a run over these server ports; yields why it could not be had (None: it runs)."""
    clock, why = PacketClock.open(ports) if os.environ.get("ZGTOOL_NO_PACKET_CLOCK") != "1" \
        else (None, "ZGTOOL_NO_PACKET_CLOCK=1")
    if clock is not None:
        time.sleep(SETTLE_S)
    CURRENT.clock, CURRENT.why_not = clock, why
    try:
        yield why
    finally:
        CURRENT.clock = None
        if clock is not None:
            clock.close()
