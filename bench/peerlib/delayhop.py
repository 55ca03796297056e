"""A tiny real HTTP/1.1 hop that injects a known delay (bench/verdict_calibration.py's gateway).

    python bench/peerlib/delayhop.py --upstream 127.0.0.1:PORT --delay-ms 2 --mode head|chunk \
        [--traceparent keep|rewrite|strip]

Binds 127.0.0.1 port 0 and prints "PORT <n>". Keep-alive, one upstream connection per client
connection; request bodies framed by Content-Length, responses by Content-Length or chunked
transfer coding (SSE streams), forwarded frame by frame as they arrive.
  head   the request is held --delay-ms before it goes upstream: every figure of the answer
         (TTFB, TTFT, total, time outside the engine) is late by exactly the delay;
  chunk  the request goes at once; the response head and every body frame (each SSE chunk, or a
         whole body) is held --delay-ms before it is forwarded: TTFB is late by exactly the delay,
         later frames by the delay plus whatever queued behind earlier holds.
With --delay-ms 0 both modes run the same code with no hold: the baseline hop. Holds sleep to 0.3 ms
before the deadline and spin the rest on perf_counter, so they are as exact as the clock.
No zgtool import: it measures zgtool from outside. From Python, `start_hop()` runs it as a child
process and `Hop.new_lines()` reads its --log (bench/verdict_calibration.py, bench/gate_calibration.py,
the latency tests run the script by path).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any, BinaryIO

SPIN_S = 0.0003     # time.sleep overshoots by ~60-100 us (timer slack): spin the last stretch


class HoldLog:
    """--log FILE: one line per answer, "HOLD_MS DOWNSTREAM_MS": how long its first hold actually took
    (a hold overshoots its deadline on a busy machine) and how long the hop waited for upstream, from
    the request sent on to the response's last frame read (the engine and the network beyond the hop,
    as the hop saw them: a hold that leaves the engine idle can make its next answer slower)."""

    def __init__(self, path: str | None) -> None:
        self.f = open(path, "a", buffering=1) if path else None  # noqa: SIM115 - open for the process
        self.lock = threading.Lock()

    def write(self, hold_ms: float, downstream_ms: float) -> None:
        if self.f is not None:
            with self.lock:
                self.f.write(f"{hold_ms:.6f} {downstream_ms:.6f}\n")


LOG = HoldLog(None)


class Answer(threading.local):
    """This connection thread's account of the answer in flight."""

    hold_s: float = 0.0
    upstream_s: float = 0.0     # time spent waiting on upstream reads (not holds, not client writes)


ANSWER = Answer()


def timed_hold(delay_s: float) -> None:
    t0 = perf_counter()
    hold(delay_s)
    if not ANSWER.hold_s:
        ANSWER.hold_s = perf_counter() - t0


def hold(delay_s: float) -> None:
    """Sleep to SPIN_S before the deadline, then spin with sleep(0), which lets go of the GIL: concurrent
    holds overlap (a plain spin would hold the GIL and serialise them: 8 holds of 2 ms = 16 ms)."""
    if delay_s <= 0:
        return
    deadline = perf_counter() + delay_s
    if delay_s > SPIN_S:
        time.sleep(delay_s - SPIN_S)
    while perf_counter() < deadline:
        time.sleep(0)


def read_head(f: Any) -> bytes | None:
    head = b""
    while True:
        line = f.readline()
        if not line:
            return None
        head += line
        if line in (b"\r\n", b"\n"):
            return head


def header(head: bytes, name: bytes) -> bytes | None:
    for line in head.split(b"\r\n")[1:]:
        k, sep, v = line.partition(b":")
        if sep and k.strip().lower() == name:
            return v.strip()
    return None


class TimedReader:
    """The upstream file, with the time spent blocked in its reads added to ANSWER.upstream_s."""

    def __init__(self, f: BinaryIO) -> None:
        self.f = f

    def readline(self) -> bytes:
        t0 = perf_counter()
        try:
            return self.f.readline()
        finally:
            ANSWER.upstream_s += perf_counter() - t0

    def read(self, n: int) -> bytes:
        t0 = perf_counter()
        try:
            return self.f.read(n)
        finally:
            ANSWER.upstream_s += perf_counter() - t0


def relay_response(uf: Any, client: socket.socket, delay_s: float) -> bool:
    """Forward one response frame by frame, holding each by delay_s; False when upstream closed."""
    head = read_head(uf)
    if head is None:
        return False
    if delay_s > 0:
        timed_hold(delay_s)
    client.sendall(head)
    te = header(head, b"transfer-encoding")
    if te is not None and b"chunked" in te.lower():
        while True:
            size_line = uf.readline()
            if not size_line:
                return False
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            frame = size_line + uf.read(size + 2) if size else size_line + _trailer(uf)
            hold(delay_s)
            client.sendall(frame)
            if size == 0:
                return True
    length = int(header(head, b"content-length") or b"0")
    if length:
        body = uf.read(length)
        hold(delay_s)
        client.sendall(body)
    return True


def _trailer(uf: Any) -> bytes:
    out = b""
    while True:
        line = uf.readline()
        out += line
        if line in (b"\r\n", b"\n", b""):
            return out


def trace_context(head: bytes, how: str) -> bytes:
    """--traceparent: keep the client's W3C trace context, strip it (traceparent and tracestate dropped), or
    rewrite it (a fresh trace id: a hop that starts a trace of its own)."""
    if how == "keep":
        return head
    out = []
    for line in head.split(b"\r\n"):
        name = line.partition(b":")[0].strip().lower()
        if name in (b"traceparent", b"tracestate"):
            if how == "rewrite" and name == b"traceparent":
                out.append(b"traceparent: 00-" + os.urandom(16).hex().encode() + b"-" + os.urandom(8).hex().encode()
                           + b"-01")
            continue
        out.append(line)
    return b"\r\n".join(out)


def serve(client: socket.socket, upstream: tuple[str, int], delay_s: float, mode: str, trace: str = "keep") -> None:
    up = socket.create_connection(upstream)
    for s in (client, up):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    cf, uf = client.makefile("rb"), TimedReader(up.makefile("rb"))
    try:
        while (head := read_head(cf)) is not None:
            length = int(header(head, b"content-length") or b"0")
            request = trace_context(head, trace) + (cf.read(length) if length else b"")
            ANSWER.hold_s = ANSWER.upstream_s = 0.0
            if mode == "head":
                timed_hold(delay_s)
            up.sendall(request)
            if not relay_response(uf, client, delay_s if mode == "chunk" else 0.0):
                break
            LOG.write(ANSWER.hold_s * 1e3, ANSWER.upstream_s * 1e3)
    except (OSError, ValueError):
        pass
    finally:
        client.close()
        up.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", required=True)
    ap.add_argument("--delay-ms", type=float, default=0.0)
    ap.add_argument("--mode", choices=("head", "chunk"), default="head")
    ap.add_argument("--log", help="append each answer's first hold, in ms, to this file")
    ap.add_argument("--traceparent", choices=("keep", "rewrite", "strip"), default="keep",
                    help="pass the client's trace context on, give it a fresh trace id, or drop it")
    args = ap.parse_args()
    global LOG
    LOG = HoldLog(args.log)
    host, port = args.upstream.rsplit(":", 1)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(128)
    print(f"PORT {srv.getsockname()[1]}", flush=True)
    while True:
        conn, _ = srv.accept()
        threading.Thread(target=serve, args=(conn, (host, int(port)), args.delay_ms / 1e3, args.mode,
                                                     args.traceparent),
                         daemon=True).start()


@dataclass
class Hop:
    """A running hop: its URL, its --log file and its process."""

    url: str
    log: Path | None
    proc: subprocess.Popen[str]
    read_at: int = 0

    def new_lines(self) -> list[tuple[float, float]]:
        """(hold ms, downstream ms) of every answer logged since the last call."""
        if self.log is None:
            return []
        with self.log.open() as f:
            f.seek(self.read_at)
            text = f.read()
            self.read_at = f.tell()
        return [(float(a), float(b)) for a, b in (line.split() for line in text.splitlines() if line.strip())]


def start_hop(upstream: str, delay_ms: float, mode: str, logdir: Path | None,
              procs: list[subprocess.Popen[Any]], traceparent: str = "keep") -> Hop:
    """This script as a child process in front of `upstream` (URL or host:port), in its own session, added
    to `procs` (the caller stops them); with `logdir`, each answer's hold is logged there."""
    log = logdir / f"hop-{len(procs)}-{mode}-{delay_ms}.log" if logdir is not None else None
    args = [sys.executable, __file__, "--upstream", upstream.removeprefix("http://"), "--delay-ms", str(delay_ms),
            "--mode", mode, "--traceparent", traceparent]
    if log is not None:
        log.touch()
        args += ["--log", str(log)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, start_new_session=True)
    procs.append(proc)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line.startswith("PORT "):
        raise SystemExit(f"delay hop did not start: {line!r}")
    return Hop(f"http://127.0.0.1:{line.split()[1]}", log, proc)


if __name__ == "__main__":
    main()
