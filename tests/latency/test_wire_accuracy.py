"""Client phases vs packet timestamps on loopback.

New connections (matched by client port): connect = SYN -> SYN/ACK, ttfb = the request's first
payload byte -> the response's first payload byte. Keep-alive streams and bodies from the null
engine (matched by X-Request-ID): ttfb, ttft (first content_block_delta) and total (last response
byte), each measured from the request's first byte out. Tolerance: max(10%, 0.2 ms).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from zgtool.latency.config import SplitConfig
from zgtool.latency.schedule.runner import measure_targets
from zgtool.targets import Target

pytestmark = pytest.mark.root


def tolerance_ms(wire_ms: float) -> float:
    return max(0.10 * wire_ms, 0.2)


@dataclass
class Wire:
    syn: float | None = None
    synack: float | None = None
    req_first: float | None = None
    resp_first: float | None = None


def _capture_available() -> str | None:
    try:
        from scapy.all import conf
        from scapy.arch.common import compile_filter

        compile_filter("tcp port 1", iface="lo")
        conf.L2listen(iface="lo").close()
    except PermissionError:
        return "packet capture not permitted: needs root or CAP_NET_RAW"
    except Exception as exc:  # no libpcap, no lo, ...
        return f"packet capture unavailable: {exc.__class__.__name__}: {exc}"
    return None


def _by_port(packets: list, server_port: int) -> dict[int, Wire]:
    from scapy.layers.inet import TCP

    out: dict[int, Wire] = {}
    for p in packets:
        if TCP not in p:
            continue
        tcp = p[TCP]
        to_server = tcp.dport == server_port
        w = out.setdefault(tcp.sport if to_server else tcp.dport, Wire())
        flags = str(tcp.flags)
        t = float(p.time)
        has_payload = len(bytes(tcp.payload)) > 0
        if to_server and flags == "S" and w.syn is None:
            w.syn = t
        elif not to_server and "S" in flags and "A" in flags and w.synack is None:
            w.synack = t
        elif to_server and has_payload and w.req_first is None:
            w.req_first = t
        elif not to_server and has_payload and w.resp_first is None:
            w.resp_first = t
    return out


@contextlib.contextmanager
def _client_first() -> Iterator[None]:
    """Raise this (client) process's CPU priority while it measures, then restore it.

    The packet timestamps are taken by the kernel; the client's are taken when it runs. On a
    loaded machine a client woken by a response waits for a CPU, which the wire never sees.
    """
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -19)
    except PermissionError:
        pass  # unprivileged: measure at normal priority
    try:
        yield
    finally:
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, 0, before)


def _capture_run(origin: str, pcap: Path) -> tuple[list, list]:
    """Measure 12 new-connection requests while a separate process captures them on lo."""
    port = int(origin.rsplit(":", 1)[1])
    cap = subprocess.Popen([sys.executable, str(Path(__file__).with_name("capture.py")), "lo",
                            f"tcp port {port}", str(pcap)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    try:
        ready = cap.stdout.readline() if cap.stdout else ""
        if not ready.startswith("READY"):
            pytest.skip(f"capture process did not start: {cap.stderr.read() if cap.stderr else ''}")
        cfg = SplitConfig(num_requests=12, warmup=2, new_connection=True, stream=False, max_tokens=2,
                          resamples=200)
        with _client_first():
            (samples,) = measure_targets([Target("o", origin)], cfg)
    finally:
        if cap.stdin:
            cap.stdin.close()
        cap.wait(timeout=30)
    from scapy.all import rdpcap

    return samples, list(rdpcap(str(pcap)))


def test_connect_and_ttfb_agree_with_packet_timestamps(origin: str, tmp_path: Path) -> None:
    """Each request's client figures against its own packets.

    Preemption by other processes on this shared 2-core machine can only add time to the
    client's side of a single request (it is woken late), so an attempt passes when at least
    two thirds of its requests agree within the tolerance; up to three attempts are made.
    A biased instrument (e.g. parsing or DNS inside connect_ms) fails every request, every time.
    """
    reason = _capture_available()
    if reason:
        pytest.skip(reason)
    port = int(origin.rsplit(":", 1)[1])
    report: list[str] = []
    for attempt in range(3):
        samples, packets = _capture_run(origin, tmp_path / f"split{attempt}.pcap")
        wire = _by_port(packets, port)
        rows = []
        for s in samples:
            assert s.ok and s.local_port is not None and s.connect_ms is not None and s.ttfb_ms is not None
            w = wire.get(s.local_port)
            if w is None or None in (w.syn, w.synack, w.req_first, w.resp_first):
                continue  # the sniffer dropped this request's packets: nothing to compare with
            wc, wt = (w.synack - w.syn) * 1e3, (w.resp_first - w.req_first) * 1e3
            ok = abs(s.connect_ms - wc) <= tolerance_ms(wc) and abs(s.ttfb_ms - wt) <= tolerance_ms(wt)
            rows.append(ok)
            report.append(f"attempt {attempt} port {s.local_port}: connect {s.connect_ms:.3f} vs wire {wc:.3f}, "
                          f"ttfb {s.ttfb_ms:.3f} vs wire {wt:.3f} -> {'ok' if ok else 'off'}")
        assert len(rows) >= 8, f"capture matched only {len(rows)} of {len(samples)} requests"
        if sum(rows) * 3 >= 2 * len(rows):
            return
    pytest.fail("client phases disagree with packet timestamps:\n" + "\n".join(report))


# --- keep-alive streams from the null engine, against tcpdump ---------------------------------

NULL_STREAM_TOKENS = 256
MIN_SHARE = 0.9


@pytest.fixture(scope="module")
def null_engine() -> Iterator[str]:
    import httpx

    from zgtool.http.net import free_port

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "zgtool", "serve", "--model", "null", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            pytest.fail(f"null engine did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def _tcpdump(port: int, pcap: Path) -> Iterator[None]:
    """tcpdump (C, nanosecond kernel timestamps) on lo; ready once it says it is listening."""
    proc = subprocess.Popen(["tcpdump", "-i", "lo", "-U", "--immediate-mode", "-n", "-s", "0", "-B", "65536",
                             "--time-stamp-precision=nano",
                             "-w", str(pcap), f"tcp port {port}"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stderr.readline() if proc.stderr else ""
    if "listening" not in line:
        proc.kill()
        proc.wait()
        pytest.skip(f"tcpdump did not start: {line.strip()}")
    try:
        yield
    finally:
        proc.terminate()       # tcpdump flushes and exits on SIGTERM
        proc.wait(timeout=30)


@dataclass
class WireRequest:
    start: float                      # the request's first payload byte
    request_id: str | None = None
    resp_first: float | None = None
    first_delta: float | None = None
    resp_last: float | None = None
    head: bytes = b""                 # the response's first payload (status line and headers)
    tail: bytes = b""                 # its latest payload
    seq0: int | None = None           # the response's first sequence number ...
    seq_end: int | None = None        # ... and the end of the highest segment seen
    payload_bytes: int = 0            # bytes captured: equal to seq_end - seq0 only with no segment lost

    def complete(self) -> bool:
        """Every segment of the response was captured, its last one included.

        tcpdump drops packets when its buffer fills while it waits for a CPU (both cores busy with
        the engine and the client): a response whose tail was dropped would make the client's
        later, true last byte look late. Such requests are the sniffer's loss, not the client's."""
        if self.seq0 is None or self.seq_end is None:
            return False
        if (self.seq_end - self.seq0) % 2**32 != self.payload_bytes:
            return False
        if b"transfer-encoding: chunked" in self.head.lower():
            return self.tail.endswith(b"0\r\n\r\n")
        m = re.search(rb"\r\ncontent-length: *(\d+)", self.head, re.I)
        end = self.head.find(b"\r\n\r\n")
        return m is not None and end >= 0 and self.payload_bytes == end + 4 + int(m.group(1))


_RID = re.compile(rb"\r\n(?:x-)?request-id: *([^\r\n]+)", re.I)


def _wire_requests(packets: list, server_port: int) -> dict[str, WireRequest]:
    """Per keep-alive connection, requests in turn: a client payload starting with POST opens a
    request, the server's payloads on that connection until the next one are its answer. Only
    answers captured whole (no segment dropped by the sniffer) are returned."""
    from scapy.layers.inet import TCP

    out: dict[str, WireRequest] = {}
    cur: dict[int, WireRequest] = {}      # client port -> the request in flight on that connection
    for p in sorted(packets, key=lambda p: p.time):
        if TCP not in p:
            continue
        tcp = p[TCP]
        payload = bytes(tcp.payload)
        if not payload:
            continue
        t = float(p.time)
        if tcp.dport == server_port:
            if payload.startswith(b"POST "):
                cur[tcp.sport] = WireRequest(start=t)
            continue
        req = cur.get(tcp.dport)
        if req is None:
            continue
        if req.resp_first is None:
            req.resp_first, req.head, req.seq0 = t, payload, tcp.seq
            m = _RID.search(payload)
            if m:
                req.request_id = m.group(1).decode().strip()
                out[req.request_id] = req
        if req.first_delta is None and b"content_block_delta" in payload:
            req.first_delta = t
        req.resp_last, req.tail = t, payload
        req.payload_bytes += len(payload)
        end = (tcp.seq + len(payload)) % 2**32
        if req.seq_end is None or 0 < (end - req.seq_end) % 2**32 < 2**31:
            req.seq_end = end
    return {rid: r for rid, r in out.items() if r.complete()}


@dataclass
class Agreement:
    within: bool          # every phase within max(10%, 0.2 ms) of the wire
    honest: bool          # ... or off by no more than the lag the client reported
    flagged: bool
    row: str


def _compare(samples: list, wire: dict[str, WireRequest], stream: bool) -> list[Agreement]:
    out = []
    for s in samples:
        w = wire.get(s.request_id or "")
        if not s.ok or w is None or w.resp_first is None or w.resp_last is None or s.first_byte_out_ms is None:
            continue
        pairs = {"ttfb": (s.ttfb_ms, (w.resp_first - w.start) * 1e3),
                 "total": (s.total_ms - s.first_byte_out_ms, (w.resp_last - w.start) * 1e3)}
        if stream and w.first_delta is not None and s.ttft_ms is not None:
            pairs["ttft"] = (s.ttft_ms - s.first_byte_out_ms, (w.first_delta - w.start) * 1e3)
        lag = s.client_lag_ms or 0.0
        within = all(abs(c - wv) <= tolerance_ms(wv) for c, wv in pairs.values())
        honest = all(abs(c - wv) <= tolerance_ms(wv) + lag for c, wv in pairs.values())
        row = (f"{s.request_id}: " + ", ".join(f"{k} {c:.3f} vs wire {wv:.3f}" for k, (c, wv) in pairs.items())
               + f"; lag {lag:.3f} ms{' FLAGGED' if s.lagged else ''} -> {'ok' if within else 'off'}")
        out.append(Agreement(within, honest, s.lagged, row))
    return out


def _verdict(rows: list[Agreement]) -> str | None:
    """None when the client keeps its word: >= 90% of the requests it vouches for agree with the
    wire, and >= 90% of all requests are off by no more than the lag it reported."""
    vouched = [r for r in rows if not r.flagged]
    if vouched and sum(r.within for r in vouched) < MIN_SHARE * len(vouched):
        return f"{sum(r.within for r in vouched)} of {len(vouched)} unflagged requests agree with the wire"
    if sum(r.honest for r in rows) < MIN_SHARE * len(rows):
        return f"{sum(r.honest for r in rows)} of {len(rows)} requests are within tolerance + reported lag"
    return None


@pytest.mark.parametrize(
    "stream",
    [
        True,
        False,
    ],
    ids=["stream-256", "body-256"],
)
def test_keep_alive_phases_agree_with_tcpdump_unless_the_client_flagged_its_own_lag(
        null_engine: str, tmp_path: Path, stream: bool) -> None:
    """>= 90% of the requests the client vouches for (not flagged as lagged) have ttfb, ttft and
    total within max(10%, 0.2 ms) of the wire, and the flagged ones are off by no more than the
    lag the client reported. A loaded machine (the engine takes both cores while it streams) may
    make the client flag requests; it may not make it report a figure the wire contradicts."""
    if shutil.which("tcpdump") is None or os.geteuid() != 0:
        pytest.skip("needs tcpdump and root")
    port = int(null_engine.rsplit(":", 1)[1])
    cfg = SplitConfig(num_requests=30, warmup=2, stream=stream, max_tokens=NULL_STREAM_TOKENS, resamples=200)
    report: list[str] = []
    for attempt in range(3):
        pcap = tmp_path / f"keepalive{attempt}.pcap"
        with _tcpdump(port, pcap):
            (samples,) = measure_targets([Target("engine", null_engine)], cfg)
        from scapy.all import rdpcap

        rows = _compare(samples, _wire_requests(list(rdpcap(str(pcap))), port), stream)
        assert len(rows) >= 20, f"matched only {len(rows)} of {len(samples)} requests by X-Request-ID"
        report += [f"attempt {attempt}: {r.row}" for r in rows]
        problem = _verdict(rows)
        if problem is None:
            return
        report.append(f"attempt {attempt}: {problem}")
    pytest.fail("client phases disagree with the wire:\n" + "\n".join(report))


# --- the stream's first byte on a direct path, against tcpdump ------------------------------------

TTFB_MEDIAN_TOLERANCE_MS = 0.1
MIN_VOUCHED = 8


def test_stream_ttfb_on_a_direct_path_is_the_heads_own_arrival(null_engine: str, tmp_path: Path) -> None:
    """Straight from the engine the head and the first SSE events leave tens of microseconds apart, and
    a client woken late reads them in one read whose kernel time is the last one's. Where the client
    vouches for its ttfb (the head came in a read of its own), the median is within 0.1 ms of the
    wire; where it does not, the wire lies inside the interval it reported (ttfb - client_lag, ttfb)."""
    if shutil.which("tcpdump") is None or os.geteuid() != 0:
        pytest.skip("needs tcpdump and root")
    from scapy.all import rdpcap

    port = int(null_engine.rsplit(":", 1)[1])
    cfg = SplitConfig(num_requests=30, warmup=2, stream=True, max_tokens=NULL_STREAM_TOKENS, resamples=200)
    errors: list[float] = []
    rows: list[str] = []
    for attempt in range(3):
        pcap = tmp_path / f"ttfb{attempt}.pcap"
        with _tcpdump(port, pcap):
            (samples,) = measure_targets([Target("engine", null_engine)], cfg)
        wire = _wire_requests(list(rdpcap(str(pcap))), port)
        for s in samples:
            w = wire.get(s.request_id or "")
            if not s.ok or w is None or w.resp_first is None or s.ttfb_ms is None:
                continue
            wire_ms = (w.resp_first - w.start) * 1e3
            err = s.ttfb_ms - wire_ms
            rows.append(f"attempt {attempt} {s.request_id}: ttfb {s.ttfb_ms:.3f} vs wire {wire_ms:.3f} "
                        f"(lag {s.client_lag_ms or 0:.3f}{', unvouched' if 'ttfb_ms' in s.unvouched else ''})")
            if "ttfb_ms" in s.unvouched:
                # the truth is inside what it reported: no later than its figure, no earlier than figure - lag
                assert -0.2 <= err <= (s.client_lag_ms or 0.0) + 0.2, rows[-1]
            else:
                errors.append(err)
        if len(errors) >= MIN_VOUCHED:
            break
    if len(errors) < MIN_VOUCHED:
        pytest.skip(f"the client read the head alone in only {len(errors)} requests (a busy machine wakes it "
                    "late): too few to compare a median")
    import statistics

    assert abs(statistics.median(errors)) <= TTFB_MEDIAN_TOLERANCE_MS, "\n".join(rows)


# --- the packet clock: every figure kept, each the wire's own ---------------------------------------

PACKET_TOLERANCE_MS = 0.05


def _sent_copy_answers(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str, int]]:
    """(client port, direction, offset) of every packet-clock lookup answered by a segment's sent
    loopback copy because its received copy (the one tcpdump shows) was not there: the first thing to
    read when a figure here is early."""
    from zgtool.latency.wire.pktclock import PacketClock

    found: list[tuple[int, str, int]] = []
    time_of = PacketClock.time_of

    def watched(self: PacketClock, server: bytes, server_port: int, client_port: int, direction: str,
                offset: int) -> int | None:
        t = time_of(self, server, server_port, client_port, direction, offset)
        seg = self.conns.get((server, server_port, client_port, direction))
        off = offset % 2**32
        if t is not None and seg is not None and seg.spans and not any(
                a <= off < b and received for a, b, _t, received in seg.spans):
            found.append((client_port, direction, offset))
        return t

    monkeypatch.setattr(PacketClock, "time_of", watched)
    return found


def test_with_the_packet_clock_every_figure_is_kept_and_is_the_wires_own(
        null_engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38: with CAP_NET_RAW the client reads every segment's kernel time, so nothing is left out on a busy
    box (two keep-alive workers, the engine streaming on both cores) and ttfb, ttft and total each agree with
    tcpdump within 0.05 ms for every request it matched."""
    if shutil.which("tcpdump") is None or os.geteuid() != 0:
        pytest.skip("needs tcpdump and root")
    from scapy.all import rdpcap

    sent_copies = _sent_copy_answers(monkeypatch)

    port = int(null_engine.rsplit(":", 1)[1])
    cfg = SplitConfig(num_requests=24, warmup=2, concurrency=2, stream=True, max_tokens=NULL_STREAM_TOKENS,
                      resamples=200)
    pcap = tmp_path / "packet_clock.pcap"
    with _tcpdump(port, pcap):
        (samples,) = measure_targets([Target("engine", null_engine)], cfg)
    ok = [s for s in samples if s.ok]
    assert len(ok) == len(samples)
    assert all(s.rx_clock == "packet" for s in ok), {s.rx_clock for s in ok}
    assert [s.unvouched for s in ok if s.unvouched] == [] and not any(s.lagged for s in ok)
    wire = _wire_requests(list(rdpcap(str(pcap))), port)
    rows = []
    for s in ok:
        w = wire.get(s.request_id or "")
        if w is None or w.resp_first is None or w.first_delta is None or w.resp_last is None:
            continue
        out = s.first_byte_out_ms or 0.0
        pairs = {"ttfb": (s.ttfb_ms, (w.resp_first - w.start) * 1e3),
                 "ttft": (s.ttft_ms - out, (w.first_delta - w.start) * 1e3),
                 "total": (s.total_ms - out, (w.resp_last - w.start) * 1e3)}
        rows.append((s.request_id, {k: round(c - wv, 4) for k, (c, wv) in pairs.items()}))
    assert len(rows) >= 16, f"matched only {len(rows)} of {len(ok)} requests"
    off = [r for r in rows if any(abs(e) > PACKET_TOLERANCE_MS for e in r[1].values())]
    assert not off, (off, f"points timed by a sent copy alone: {sent_copies[:8]} ({len(sent_copies)} in all)")


def test_without_the_packet_clock_the_run_says_so_once_and_goes_on(null_engine: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from zgtool.latency.analysis.phases import analyse

    monkeypatch.setenv("ZGTOOL_NO_PACKET_CLOCK", "1")
    targets = [Target("engine", null_engine)]
    cfg = SplitConfig(num_requests=6, warmup=1, stream=True, max_tokens=8, resamples=100)
    samples = measure_targets(targets, cfg)
    assert all(s.ok and s.rx_clock in ("kernel", "client") for s in samples[0])
    notes = [n for n in analyse(targets, samples, cfg).attribution_notes if "packet clock" in n]
    assert len(notes) == 1 and "ZGTOOL_NO_PACKET_CLOCK=1" in notes[0] and "6 of 6 requests" in notes[0]
