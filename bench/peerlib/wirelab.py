"""Processes of a wire-truth experiment on loopback: an engine, delay hops in front of it, CPU burners, and
tcpdump as the reference clock (bench/kernel_rx_clock.py and bench/wire_truth.py). No zgtool.latency import:
these measure zgtool from outside.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HOP = Path(__file__).with_name("delayhop.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_engine(model: str, procs: list[subprocess.Popen[Any]]) -> str:
    """`zgtool serve --model MODEL` on a free port; its URL once /health answers."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "zgtool", "serve", "--model", model, "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    procs.append(proc)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise SystemExit(f"zgtool serve --model {model} exited: {err[-500:]}")
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return url
        time.sleep(0.2)
    raise SystemExit(f"zgtool serve --model {model} did not answer /health in 300 s")


@dataclass
class Hop:
    url: str
    log: Path
    proc: subprocess.Popen[str]
    read_at: int = 0

    def new_lines(self) -> list[tuple[float, float]]:
        """(hold ms, downstream ms) of every answer the hop logged since the last call."""
        with self.log.open() as f:
            f.seek(self.read_at)
            text = f.read()
            self.read_at = f.tell()
        return [(float(a), float(b)) for a, b in (line.split() for line in text.splitlines() if line.strip())]


def start_hop(upstream: str, delay_ms: float, mode: str, logdir: Path, procs: list[subprocess.Popen[Any]]) -> Hop:
    """bench/peerlib/delayhop.py in front of `upstream`, logging each answer's hold."""
    log = logdir / f"hop-{len(procs)}-{mode}-{delay_ms}.log"
    log.touch()
    args = [sys.executable, str(HOP), "--upstream", upstream.removeprefix("http://"), "--delay-ms", str(delay_ms),
            "--mode", mode, "--log", str(log)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, start_new_session=True)
    procs.append(proc)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("PORT "):
        raise SystemExit(f"delay hop did not start: {line!r}")
    return Hop(f"http://127.0.0.1:{line.split()[1]}", log, proc)


def burners(procs: list[subprocess.Popen[Any]], count: int | None = None) -> None:
    """One busy loop per core (or `count`): the box the issue measured on."""
    for _ in range(count or os.cpu_count() or 2):
        procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))


def stop_all(procs: list[subprocess.Popen[Any]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@contextlib.contextmanager
def tcpdump(ports: list[int], pcap: Path, snap: int = 128) -> Iterator[None]:
    """tcpdump on lo (C, nanosecond kernel timestamps, headers only); ready once it says it is listening."""
    expr = " or ".join(f"tcp port {p}" for p in ports)
    proc = subprocess.Popen(["tcpdump", "-i", "lo", "-U", "--immediate-mode", "-n", "-s", str(snap), "-B", "131072",
                             "--time-stamp-precision=nano", "-w", str(pcap), expr],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline() if proc.stderr else ""
    if "listening" not in line:
        proc.kill()
        proc.wait()
        raise SystemExit(f"tcpdump did not start: {line.strip()}")
    try:
        yield
    finally:
        time.sleep(0.3)
        proc.terminate()        # tcpdump flushes and exits on SIGTERM
        proc.wait(timeout=30)


def wire_segments(pcap: Path, server_ports: set[int]) -> dict[tuple[int, int, str], list[tuple[int, int, int]]]:
    """tcpdump's data segments: (server port, client port, "up"|"down") -> [(first byte offset, end offset,
    time ns)], offsets counted from each direction's SYN (the capture keeps headers; lengths come from IP)."""
    from scapy.layers.inet import IP, TCP
    from scapy.utils import PcapReader

    isn: dict[tuple[int, int, str], int] = {}
    out: dict[tuple[int, int, str], list[tuple[int, int, int]]] = {}
    with PcapReader(str(pcap)) as r:
        for p in r:
            if TCP not in p or IP not in p:
                continue
            tcp = p[TCP]
            up = tcp.dport in server_ports
            key = (tcp.dport, tcp.sport, "up") if up else (tcp.sport, tcp.dport, "down")
            if "S" in str(tcp.flags):
                isn[key] = tcp.seq
                continue
            n = p[IP].len - p[IP].ihl * 4 - tcp.dataofs * 4
            if n > 0 and key in isn:
                rel = (tcp.seq - isn[key] - 1) % 2**32
                out.setdefault(key, []).append((rel, rel + n, int(p.time * 1_000_000_000)))
    return out


def wire_at(segs: list[tuple[int, int, int]], offset: int) -> int | None:
    """The earliest time a segment holding byte `offset` was seen."""
    ts = [t for a, b, t in segs if a <= offset < b]
    return min(ts) if ts else None


@dataclass
class WireRequest:
    """One request and its answer as tcpdump saw them (seconds, the pcap's clock)."""

    start: float                       # the request's first payload segment
    resp_first: float | None = None
    first_token: float | None = None   # the first segment holding a non-empty content delta
    resp_last: float | None = None


_RID = re.compile(rb"\r\nrequest-id: *([^\r\n]+)", re.I)
_TOKEN = re.compile(rb'"delta":\{"content":"[^"]')


def wire_requests(pcap: Path, server_ports: set[int]) -> dict[str, WireRequest]:
    """Requests by the engine's request-id header (the capture must keep the head: -s 2048), in keep-alive
    order per connection: a client payload starting with POST opens a request, the server's payloads until
    the next one are its answer."""
    from scapy.layers.inet import TCP
    from scapy.utils import PcapReader

    out: dict[str, WireRequest] = {}
    cur: dict[tuple[int, int], WireRequest] = {}
    high: dict[tuple[int, int, int], int] = {}      # (server, client, direction) -> highest sequence end seen
    with PcapReader(str(pcap)) as r:
        for p in r:
            if TCP not in p:
                continue
            tcp = p[TCP]
            payload = bytes(tcp.payload)
            if not payload:
                continue
            t = float(p.time)
            flow = (tcp.sport, tcp.dport, 0) if tcp.dport in server_ports else (tcp.dport, tcp.sport, 1)
            end = (tcp.seq + len(payload)) % 2**32
            if flow in high and (end - high[flow]) % 2**32 >= 2**31 or high.get(flow) == end:
                continue                                 # a retransmission: the bytes came before
            high[flow] = end
            if tcp.dport in server_ports:
                if payload.startswith(b"POST "):
                    cur[(tcp.dport, tcp.sport)] = WireRequest(start=t)
                continue
            req = cur.get((tcp.sport, tcp.dport))
            if req is None:
                continue
            if req.resp_first is None:
                req.resp_first = t
                m = _RID.search(payload)
                if m:
                    out[m.group(1).decode().strip()] = req
            if req.first_token is None and _TOKEN.search(payload):
                req.first_token = t
            req.resp_last = t
    return out
