"""Client phases vs packet timestamps: connect_ms and ttfb_ms agree with a loopback capture.

For each request (matched by its client port): connect = SYN -> SYN/ACK, ttfb = the request's
first payload byte -> the response's first payload byte, both from kernel capture timestamps.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from zgtool.latency.model import SplitConfig
from zgtool.latency.runner import measure_targets
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
