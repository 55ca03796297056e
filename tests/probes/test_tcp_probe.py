"""probe tcp: a live loopback capture, --read on captures (own and hand-made), bad files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from probe_servers import ThreadedUvicorn

from zgtool.errors import UsageError
from zgtool.probes.pcap import analyse_packets, read_capture
from zgtool.probes.tcp import probe_tcp, start_capture, stop_capture
from zgtool.targets import resolve

CLIENT, SERVER = ("10.0.0.2", 40000), ("10.0.0.9", 8000)


def capture_unavailable() -> str | None:
    sniffer, _, why = start_capture("127.0.0.1", 9, 9, "lo")
    if sniffer is not None:
        stop_capture(sniffer)
    return why


@pytest.fixture(scope="module")
def live(origin: ThreadedUvicorn, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    why = capture_unavailable()
    if why:
        pytest.skip(f"live capture not permitted here: {why}")
    pcap = tmp_path_factory.mktemp("cap") / "live.pcap"
    return probe_tcp(resolve(origin.url), pcap_out=pcap, require_capture=True), pcap


@pytest.mark.root
def test_live_capture_on_loopback_times_the_handshake_below_connect(live: tuple) -> None:
    r, _ = live
    s = r.stream
    assert r.captured and r.iface == "lo" and s is not None
    assert s.client == f"127.0.0.1:{r.local_port}" and s.handshake_seen
    assert 0 < s.syn_synack_ms < r.connect_ms
    assert (s.server_ttl, s.server_initial_ttl, s.server_hops) == (64, 64, 0)
    assert s.server_options == "mss,sok,ts,nop,ws" and s.server_mss == 65495
    assert s.server_signature.startswith("4:64+0:0:65495:")  # p0f raw_sig: observed TTL + distance
    assert s.http_status == 200 and s.server_header == "uvicorn" == r.server_header
    assert s.first_request_line == "POST /v1/messages HTTP/1.1"
    assert s.retransmissions == 0 and s.ttfb_ms is not None and s.ttfb_ms > 0
    assert r.tcp_info_rtt_ms is not None


@pytest.mark.root
def test_read_on_the_recorded_capture_reports_the_same_stream(live: tuple) -> None:
    r, pcap = live
    a = analyse_packets(read_capture(pcap), source=str(pcap))
    assert a.duplicates_dropped == 0  # loopback doubles were dropped before writing
    assert len(a.streams) == 1
    s = a.streams[0]
    assert s.client == r.stream.client and s.packets == r.stream.packets
    # pcap keeps microseconds: equal to the live figure within that resolution
    assert s.syn_synack_ms == pytest.approx(r.stream.syn_synack_ms, abs=0.002)
    assert s.http_status == 200 and s.retransmissions == 0


def handmade_pcap(path: Path) -> None:
    """Two streams: the first with one client and two server retransmissions (TTL 52: 12 hops)."""
    from scapy.layers.inet import IP, TCP
    from scapy.packet import Raw
    from scapy.utils import wrpcap

    opts = [("MSS", 1460), ("SAckOK", b""), ("Timestamp", (1, 0)), ("NOP", None), ("WScale", 7)]

    def c2s(t: float, flags: str, seq: int, ack: int, data: bytes = b"", sport: int = CLIENT[1], **kw):
        p = IP(src=CLIENT[0], dst=SERVER[0], ttl=64, flags="DF", id=0) / TCP(sport=sport, dport=SERVER[1], flags=flags,
                                                                       seq=seq, ack=ack, **kw)
        p = p / Raw(data) if data else p
        p.time = t
        return p

    def s2c(t: float, flags: str, seq: int, ack: int, data: bytes = b"", dport: int = CLIENT[1], **kw):
        p = IP(src=SERVER[0], dst=CLIENT[0], ttl=52, flags="DF", id=0) / TCP(sport=SERVER[1], dport=dport, flags=flags,
                                                                       seq=seq, ack=ack, **kw)
        p = p / Raw(data) if data else p
        p.time = t
        return p

    req = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    resp = b"HTTP/1.1 200 OK\r\nServer: handmade/1.0\r\nContent-Length: 2\r\n\r\n{}"
    c0, s0 = 1000, 5000
    pkts = [
        c2s(100.000, "S", c0, 0, window=64240, options=opts),
        s2c(100.020, "SA", s0, c0 + 1, window=65160, options=opts),
        c2s(100.021, "A", c0 + 1, s0 + 1),
        c2s(100.022, "PA", c0 + 1, s0 + 1, req),
        c2s(100.300, "PA", c0 + 1, s0 + 1, req),                 # client retransmission (RTO)
        s2c(100.320, "A", s0 + 1, c0 + 1 + len(req)),
        s2c(100.350, "PA", s0 + 1, c0 + 1 + len(req), resp),
        s2c(100.650, "PA", s0 + 1, c0 + 1 + len(req), resp),     # server retransmissions
        s2c(101.250, "PA", s0 + 1, c0 + 1 + len(req), resp),
        c2s(101.260, "A", c0 + 1 + len(req), s0 + 1 + len(resp)),
        c2s(101.270, "FA", c0 + 1 + len(req), s0 + 1 + len(resp)),
        # a second, clean stream from another client port
        c2s(102.000, "S", 7000, 0, sport=40001, options=opts),
        s2c(102.010, "SA", 9000, 7001, dport=40001, options=opts),
        c2s(102.011, "A", 7001, 9001, sport=40001),
        c2s(102.020, "R", 7001, 9001, sport=40001),
    ]
    wrpcap(str(path), pkts)


def test_read_on_a_handmade_capture_counts_retransmissions_per_stream(tmp_path: Path) -> None:
    pcap = tmp_path / "retrans.pcap"
    handmade_pcap(pcap)
    a = analyse_packets(read_capture(pcap), source=str(pcap))
    assert a.packets_total == a.tcp_packets == 15 and len(a.streams) == 2
    s, t = a.streams
    assert (s.retransmissions_client, s.retransmissions_server) == (1, 2)
    assert s.client == "10.0.0.2:40000" and s.server == "10.0.0.9:8000"
    assert s.syn_synack_ms == pytest.approx(20.0, abs=1e-3) and s.synack_ack_ms == pytest.approx(1.0, abs=1e-3)
    assert (s.server_ttl, s.server_initial_ttl, s.server_hops) == (52, 64, 12)
    assert s.server_window == 65160 and s.server_wscale == 7 and s.server_options == "mss,sok,ts,nop,ws"
    # p0f 3.09b: 65160 = 45 x (MSS - 12) with timestamps on
    assert s.server_signature == "4:52+12:0:1460:mss*45,7:mss,sok,ts,nop,ws:df:0"
    assert s.http_status == 200 and s.server_header == "handmade/1.0"
    assert s.first_request_line == "GET /v1/models HTTP/1.1"
    assert s.ttfb_ms == pytest.approx(328.0, abs=1e-3) and s.closed_by == "fin"
    assert t.retransmissions == 0 and t.closed_by == "rst" and t.client == "10.0.0.2:40001"


def test_a_file_that_is_not_a_capture_is_rejected_cleanly(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(os.urandom(64))
    with pytest.raises(UsageError, match="not a pcap or pcapng capture"):
        read_capture(bad)
    with pytest.raises(UsageError, match="not found"):
        read_capture(tmp_path / "missing.pcap")


def test_a_capture_without_tcp_is_a_clear_error(tmp_path: Path) -> None:
    from scapy.layers.inet import IP, UDP
    from scapy.utils import wrpcap

    path = tmp_path / "udp.pcap"
    wrpcap(str(path), [IP(dst="10.0.0.1") / UDP(dport=53), IP(dst="10.0.0.1") / UDP(dport=53)])
    with pytest.raises(UsageError, match="2 packet\\(s\\) but no TCP"):
        analyse_packets(read_capture(path), source=str(path))


@pytest.mark.root
def test_live_capture_over_tls_reads_the_server_hello(tls_server) -> None:
    why = capture_unavailable()
    if why:
        pytest.skip(f"live capture not permitted here: {why}")
    from zgtool.probes.tls import probe_tls

    t = resolve(tls_server.url)
    r = probe_tcp(t, method="GET", path="/", require_capture=True)
    s = r.stream
    assert r.http_status == 200  # read through TLS on the socket
    assert s is not None and s.http_status is None and s.tls_server_hello is not None
    assert s.tls_server_hello.version == "TLSv1.3" and s.ja4s.startswith("t13")
    # TLS 1.3 hides ALPN in EncryptedExtensions, so the JA4S does not depend on what we offered
    assert s.ja4s == probe_tls(t).ja4s
