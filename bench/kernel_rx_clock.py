"""Which kernel clock recovers a response's arrival times on a busy box? Measured against tcpdump on loopback.

    .venv/bin/python bench/kernel_rx_clock.py [--model dummy:small] [-n 40] [--conc 1,8] [--no-burn]

A bare keep-alive HTTP/1.1 client (no zgtool code in the timed path) streams chat completions from
`zgtool serve --model MODEL`, straight and through a 0 ms hop of bench/peerlib/delayhop.py (chunk mode: each SSE
frame forwarded as its own write, as a gateway does), with one CPU burner per core, while tcpdump captures lo.
Per request it times three points against the wire: the request's first byte out (send), the response's
first byte (ttfb) and the first content token's byte (ttft), each by every mechanism on offer:
  user        perf_counter when the call returned (send: taken before the call, and after it);
  rx_ns       SO_TIMESTAMPNS of the read that brought the byte (TCP: the newest segment the read took,
              and segments queued behind an unread one coalesce and keep the later time);
  tx_sw       SO_TIMESTAMPING TX_SOFTWARE of the send (the kernel's time the segment went to the device);
  pkt         an AF_PACKET socket in the same process (needs CAP_NET_RAW) with SO_TIMESTAMPNS: every
              segment keeps its own time, located by its TCP sequence number; read after the answer.
Prints, per mechanism and point, the error vs the wire at p50/p90/p99 and the share within 0.05 ms.
LAST line: JSON.
Measured here (`-n 48`, burner on, 2-core box shared with other work): pkt within 0.05 ms of tcpdump for
98-100% of TTFB and first-token points (worst 0.02 ms); rx_ns p50 +0.001-0.043 ms but p99 +6.3-18.8 ms at
c=1 (segments merged behind a late read); user p50 +0.6-11.7 ms; tx_sw within 0.003 ms; user_after p99 up to
+38.8 ms. So zgtool times receive points by the packet socket (CAP_NET_RAW), sends by TX_SOFTWARE, and keeps
SO_TIMESTAMPNS with its slack as the fallback (zgtool/latency/wire/pktclock.py, resolve.py).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "peerlib"))

from wirelab import burners, start_engine, start_hop, stop_all, tcpdump, wire_at, wire_segments  # noqa: E402

SO_TIMESTAMPNS, SO_TIMESTAMPING, SO_ATTACH_FILTER, SO_RCVBUFFORCE = 35, 37, 26, 33
TX_SOFTWARE, SOFTWARE, OPT_ID, OPT_TSONLY = 1 << 1, 1 << 4, 1 << 7, 1 << 11
MSG_ERRQUEUE = 0x2000
ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4


def now_ns() -> int:
    return time.time_ns()      # CLOCK_REALTIME: the clock the kernel stamps packets with


# --- the packet socket --------------------------------------------------------------------------

def port_filter(port: int, snap: int = 80) -> bytes:
    """Classic BPF on a cooked (SOCK_DGRAM) IPv4 packet: TCP with source or destination `port`."""
    ins = [
        (0x30, 0, 0, 0),            # 0 ldb [0]
        (0x54, 0, 0, 0xF0),         # 1 and #0xf0
        (0x15, 0, 7, 0x40),         # 2 jeq #0x40 (IPv4), else 10
        (0x30, 0, 0, 9),            # 3 ldb [9]
        (0x15, 0, 5, 6),            # 4 jeq #6 (TCP), else 10
        (0xB1, 0, 0, 0),            # 5 ldxb 4*([0]&0xf)
        (0x48, 0, 0, 0),            # 6 ldh [x+0]: source port
        (0x15, 3, 0, port),         # 7 jeq port: 11
        (0x48, 0, 0, 2),            # 8 ldh [x+2]: destination port
        (0x15, 1, 0, port),         # 9 jeq port: 11
        (0x06, 0, 0, 0),            # 10 drop
        (0x06, 0, 0, snap),         # 11 accept, the headers only
    ]
    return b"".join(struct.pack("HBBI", *i) for i in ins)


class PacketClock:
    """Every TCP segment to or from one port, with the kernel's own time, read after the fact."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_DGRAM, socket.htons(ETH_P_ALL))
        prog = port_filter(port)
        buf = ctypes.create_string_buffer(prog)
        fprog = struct.pack("HP", len(prog) // 8, ctypes.addressof(buf))
        self._keep = buf
        self.sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 64 << 20)
        self.sock.bind(("lo", 0))
        self.sock.setblocking(False)
        self.lock = threading.Lock()
        # (client port, direction) -> {relative seq: time}; isn per (client port, direction)
        self.isn: dict[tuple[int, str], int] = {}
        self.seg: dict[tuple[int, str], list[tuple[int, int, int]]] = {}
        self.drops = 0

    def drain(self) -> None:
        with self.lock:
            while True:
                try:
                    data, anc, _f, addr = self.sock.recvmsg(128, 64)
                except BlockingIOError:
                    return
                t = next((struct.unpack("qq", raw[:16]) for lvl, kind, raw in anc
                          if lvl == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS), None)
                if t is None:
                    continue
                self._note(data, t[0] * 1_000_000_000 + t[1], addr[2])

    def _note(self, ip: bytes, t_ns: int, pkttype: int) -> None:
        ihl = (ip[0] & 0xF) * 4
        total = struct.unpack_from("!H", ip, 2)[0]
        sport, dport, seq = struct.unpack_from("!HHI", ip, ihl)
        flags = ip[ihl + 13]
        doff = (ip[ihl + 12] >> 4) * 4
        payload = total - ihl - doff
        up = dport == self.port
        key = (sport if up else dport, "up" if up else "down")
        if flags & 0x02:                      # SYN: the direction's initial sequence number
            self.isn[key] = seq
            return
        if payload <= 0 or key not in self.isn:
            return
        rel = (seq - self.isn[key] - 1) % 2**32
        self.seg.setdefault(key, []).append((rel, rel + payload, t_ns))

    def time_of(self, client_port: int, direction: str, offset: int) -> int | None:
        """The earliest time a segment holding byte `offset` of that direction's stream was seen."""
        best = None
        for a, b, t in self.seg.get((client_port, direction), ()):
            if a <= offset < b and (best is None or t < best):
                best = t
        return best


# --- the client -----------------------------------------------------------------------------------

@dataclass
class Read:
    start: int            # response-stream offset of its first byte
    size: int
    user_ns: int
    rx_ns: int | None


@dataclass
class Req:
    port: int
    up_offset: int                         # offset of the request's first byte in the client's stream
    down_offset: int                       # offset of the response's first byte in the server's stream
    send_before: int = 0
    send_after: int = 0
    tx_sw: int | None = None
    reads: list[Read] = field(default_factory=list)
    token_at: int | None = None           # response offset of the first content token's last byte


def _cmsg_ts(anc: list[tuple[int, int, bytes]], kind: int) -> int | None:
    for lvl, k, raw in anc:
        if lvl == socket.SOL_SOCKET and k == kind and len(raw) >= 16:
            sec, nsec = struct.unpack("qq", raw[:16])
            return sec * 1_000_000_000 + nsec
    return None


class Client:
    def __init__(self, host: str, port: int, model: str, tokens: int) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self.sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, TX_SOFTWARE | SOFTWARE | OPT_ID | OPT_TSONLY)
        self.port = self.sock.getsockname()[1]
        body = json.dumps({"model": model, "max_tokens": tokens, "stream": True,
                           "messages": [{"role": "user", "content": "Say hello."}]}).encode()
        self.request = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: "
                        f"application/json\r\ncontent-length: {len(body)}\r\n\r\n").encode() + body
        self.sent = 0
        self.received = 0

    def one(self) -> Req:
        s = self.sock
        req = Req(self.port, self.sent, self.received)
        req.send_before = now_ns()
        s.sendall(self.request)
        req.send_after = now_ns()
        self.sent += len(self.request)
        buf = b""
        while not buf.endswith(b"0\r\n\r\n"):
            data, anc, _f, _a = s.recvmsg(65536, 256)
            t = now_ns()
            if not data:
                raise SystemExit("server closed the connection")
            req.reads.append(Read(len(buf), len(data), t, _cmsg_ts(anc, SO_TIMESTAMPNS)))
            buf += data
            if req.token_at is None:
                at = buf.find(b'"delta":{"content":"')
                while at >= 0 and buf[at + 20:at + 21] == b'"':        # an empty content: not a token
                    at = buf.find(b'"delta":{"content":"', at + 1)
                if at >= 0 and buf.find(b"\n\n", at) >= 0:
                    req.token_at = buf.find(b"\n\n", at) + 1
        self.received += len(buf)
        req.tx_sw = self._tx_stamp(self.sent - 1)
        return req

    def _tx_stamp(self, last_byte: int) -> int | None:
        """The TX_SOFTWARE time of the send whose last byte is `last_byte` (OPT_ID counts bytes)."""
        found = None
        with contextlib.suppress(BlockingIOError):
            while True:
                _d, anc, _f, _a = self.sock.recvmsg(0, 512, MSG_ERRQUEUE | socket.MSG_DONTWAIT)
                key = None
                ts = None
                for lvl, kind, raw in anc:
                    if lvl == socket.SOL_SOCKET and kind == SO_TIMESTAMPING:
                        sec, nsec = struct.unpack("qq", raw[:16])
                        ts = sec * 1_000_000_000 + nsec
                    elif lvl in (socket.SOL_IP, socket.IPPROTO_IPV6) and len(raw) >= 16:
                        key = struct.unpack_from("I", raw, 12)[0]      # sock_extended_err.ee_data
                if ts is not None and key is not None and key % 2**32 == last_byte % 2**32:
                    found = ts
        return found


def read_at(req: Req, offset: int) -> Read | None:
    return next((r for r in req.reads if r.start <= offset < r.start + r.size), None)


# --- one run ----------------------------------------------------------------------------------------

def run(url: str, port: int, model: str, n: int, conc: int, tokens: int, pkt: PacketClock | None,
        pcap: Path) -> list[dict[str, Any]]:
    host = url.removeprefix("http://").rsplit(":", 1)[0]
    results: list[Req] = []
    lock = threading.Lock()

    def worker(c: Client) -> None:
        c.one()                                        # warm-up
        for _ in range(n // conc):
            r = c.one()
            with lock:
                results.append(r)

    with tcpdump([port], pcap):
        clients = [Client(host, port, model, tokens) for _ in range(conc)]
        threads = [threading.Thread(target=worker, args=(c,)) for c in clients]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for c in clients:
            c.sock.close()
    if pkt is not None:
        pkt.drain()
    wire = wire_segments(pcap, {port})
    rows = []
    for r in results:
        up, down = wire.get((port, r.port, "up"), []), wire.get((port, r.port, "down"), [])
        w_send = wire_at(up, r.up_offset)
        if w_send is None:
            continue
        row: dict[str, Any] = {"send": {"user_before": r.send_before - w_send, "user_after": r.send_after - w_send,
                                        "tx_sw": None if r.tx_sw is None else r.tx_sw - w_send}}
        if pkt is not None:
            p = pkt.time_of(r.port, "up", r.up_offset)
            row["send"]["pkt"] = None if p is None else p - w_send
        for point, off in (("ttfb", 0), ("ttft", r.token_at)):
            if off is None:
                continue
            w = wire_at(down, r.down_offset + off)
            rd = read_at(r, off)
            if w is None or rd is None:
                continue
            errs = {"user": rd.user_ns - w, "rx_ns": None if rd.rx_ns is None else rd.rx_ns - w}
            if pkt is not None:
                p = pkt.time_of(r.port, "down", r.down_offset + off)
                errs["pkt"] = None if p is None else p - w
            row[point] = errs
        rows.append(row)
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for point in ("send", "ttfb", "ttft"):
        for mech in ("user_before", "user_after", "tx_sw", "user", "rx_ns", "pkt"):
            have = [r[point].get(mech) for r in rows if point in r and mech in r[point]]
            if not have:
                continue
            errs = sorted(e / 1e6 for e in have if e is not None)
            if not errs:
                out[f"{point}.{mech}"] = {"n": len(have), "missing": len(have)}
                continue
            q = statistics.quantiles(errs, n=100, method="inclusive") if len(errs) > 1 else errs * 99
            out[f"{point}.{mech}"] = {"n": len(have), "missing": len(have) - len(errs), "p50_ms": q[49],
                                      "p90_ms": q[89], "p99_ms": q[98],
                                      "within_0.05ms": sum(abs(e) <= 0.05 for e in errs) / len(errs)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="dummy:small")
    ap.add_argument("-n", type=int, default=40)
    ap.add_argument("--conc", default="1,8")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--no-burn", action="store_true")
    args = ap.parse_args()
    procs: list[subprocess.Popen[Any]] = []
    report: dict[str, Any] = {"model": args.model, "n": args.n, "burn": not args.no_burn}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            engine = start_engine(args.model, procs)
            hop = start_hop(engine, 0.0, "chunk", Path(tmp), procs)
            if not args.no_burn:
                burners(procs)
            for name, url in (("direct", engine), ("hop0", hop.url)):
                port = int(url.rsplit(":", 1)[1])
                try:
                    pkt: PacketClock | None = PacketClock(port)
                except PermissionError:
                    pkt = None
                for conc in (int(c) for c in args.conc.split(",")):
                    rows = run(url, port, args.model, args.n, conc, args.tokens, pkt, Path(tmp) / f"{name}{conc}.pcap")
                    s = summarise(rows)
                    report[f"{name} c={conc}"] = s
                    print(f"\n{name} c={conc}: {len(rows)} requests matched to the wire")
                    for key, v in s.items():
                        if "p50_ms" in v:
                            print(f"  {key:18s} p50 {v['p50_ms']:+8.3f}  p90 {v['p90_ms']:+8.3f}  p99 "
                                  f"{v['p99_ms']:+8.3f} ms  within 0.05 ms {v['within_0.05ms']:6.1%}  "
                                  f"missing {v['missing']}/{v['n']}")
                        else:
                            print(f"  {key:18s} missing {v['missing']}/{v['n']}")
                if pkt is not None:
                    pkt.sock.close()
        finally:
            stop_all(procs)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
