"""probe tcp --read on crafted captures, one per defect the reader had, checked against tshark and p0f."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from test_probe_cli import zgtool
from wire_refs import p0f_available, p0f_signatures, stream_key, tshark_available, tshark_view

from zgtool.errors import UsageError
from zgtool.probes.pcap import analyse_packets, read_capture

CLIENT, SERVER = ("10.0.0.2", 40000), ("10.0.0.9", 8000)
OPTS = [("MSS", 1460), ("SAckOK", b""), ("Timestamp", (1, 0)), ("NOP", None), ("WScale", 7)]
REQ = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"


def write_pcap(path: Path, linktype: int, frames: list[tuple[float, bytes]], *, big_endian: bool = False) -> None:
    """A classic microsecond pcap with any link type (scapy cannot write NULL/LOOP headers by itself)."""
    e = ">" if big_endian else "<"
    out = bytearray(struct.pack(e + "IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, linktype))
    for t, data in frames:
        sec = int(t)
        out += struct.pack(e + "IIII", sec, round((t - sec) * 1e6), len(data), len(data)) + data
    path.write_bytes(bytes(out))


def seg(t: float, frm: tuple[str, int], to: tuple[str, int], flags: str, seq: int, ack: int = 0,
        data: bytes = b"", ttl: int = 64, **kw: Any) -> Any:
    from scapy.layers.inet import IP, TCP
    from scapy.packet import Raw

    p = IP(src=frm[0], dst=to[0], ttl=ttl, flags="DF", id=0) / TCP(sport=frm[1], dport=to[1], flags=flags, seq=seq,
                                                                   ack=ack, **kw)
    p = p / Raw(data) if data else p
    p.time = t
    return p


def write(path: Path, pkts: list[Any]) -> Path:
    from scapy.utils import wrpcap

    wrpcap(str(path), pkts)
    return path


def handshake(t0: float = 100.0, rtt: float = 0.020) -> list[Any]:
    return [seg(t0, CLIENT, SERVER, "S", 1000, window=64240, options=OPTS),
            seg(t0 + rtt, SERVER, CLIENT, "SA", 5000, 1001, window=65160, options=OPTS),
            seg(t0 + rtt + 0.001, CLIENT, SERVER, "A", 1001, 5001)]


# ---- truncated captures ---------------------------------------------------------------------


def test_a_truncated_pcap_is_an_error_naming_the_record_and_byte_offset(tmp_path: Path) -> None:
    path = write(tmp_path / "t.pcap", handshake())
    full = path.read_bytes()
    path.write_bytes(full[:-10])  # cut into the third record's data
    third = 24 + (16 + 60) * 2  # global header, two 60-byte raw-IP SYN and SYN/ACK records
    with pytest.raises(UsageError, match=rf"truncated: record 3 at byte offset {third} needs 56 bytes but the file "
                                         r"ends after 46; 2 complete record\(s\) before it"):
        read_capture(path)
    cap = read_capture(path, allow_truncated=True)
    assert len(cap) == 2 and "truncated: record 3" in cap.notes[0]
    a = analyse_packets(cap, source=str(path))
    assert a.streams[0].handshake_seen and any("truncated" in n for n in a.notes)


def test_a_pcap_cut_inside_a_record_header_is_truncated_too(tmp_path: Path) -> None:
    path = write(tmp_path / "t.pcap", handshake())
    path.write_bytes(path.read_bytes()[:24 + 76 + 7])
    with pytest.raises(UsageError, match=r"record 2 at byte offset 100 needs 16 bytes but the file ends after 7"):
        read_capture(path)


def test_a_truncated_pcapng_is_an_error_with_the_block_offset(tmp_path: Path) -> None:
    from scapy.utils import PcapNgWriter

    path = tmp_path / "t.pcapng"
    with PcapNgWriter(str(path)) as w:
        for p in handshake():
            w.write(p)
    data = path.read_bytes()
    path.write_bytes(data[:-5])
    with pytest.raises(UsageError, match=r"truncated: record 3 at byte offset \d+ needs \d+ bytes"):
        read_capture(path)
    assert len(read_capture(path, allow_truncated=True)) == 2


def test_the_cli_exits_2_with_one_line_for_a_truncated_capture(tmp_path: Path) -> None:
    path = write(tmp_path / "t.pcap", handshake())
    path.write_bytes(path.read_bytes()[:-10])
    r = zgtool("probe", "tcp", "--read", str(path))
    assert r.returncode == 2, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "truncated: record 3 at byte offset 176" in r.stderr
    ok = zgtool("probe", "tcp", "--read", str(path), "--allow-truncated", "--json")
    assert ok.returncode == 0, ok.stderr
    data = json.loads(ok.stdout)["data"]
    assert data["packets_total"] == 2 and any("truncated" in n for n in data["notes"])


def test_tshark_agrees_the_cut_file_is_truncated(tmp_path: Path) -> None:
    if not tshark_available():
        pytest.skip("tshark is not installed (scripts/setup.sh installs it)")
    import subprocess

    path = write(tmp_path / "t.pcap", handshake())
    path.write_bytes(path.read_bytes()[:-10])
    r = subprocess.run(["tshark", "-r", str(path)], capture_output=True, text=True, check=False)
    assert r.returncode != 0 and "cut short" in r.stderr


# ---- link types and encapsulations ----------------------------------------------------------


def _ipv6_stream() -> list[tuple[float, bytes]]:
    from scapy.layers.inet import TCP
    from scapy.layers.inet6 import IPv6

    c, s = "fd00::2", "fd00::9"
    pkts = [(200.0, IPv6(src=c, dst=s, fl=0x12345) / TCP(sport=50000, dport=443, flags="S", seq=1, options=OPTS)),
            (200.005, IPv6(src=s, dst=c) / TCP(sport=443, dport=50000, flags="SA", seq=9, ack=2, options=OPTS)),
            (200.006, IPv6(src=c, dst=s) / TCP(sport=50000, dport=443, flags="A", seq=2, ack=10))]
    return [(t, bytes(p)) for t, p in pkts]


@pytest.mark.parametrize(("linktype", "af", "big_endian"), [
    (0, 30, False),   # macOS / Darwin lo0, DLT_NULL in host (little-endian) order
    (0, 28, False),   # FreeBSD
    (0, 24, True),    # NetBSD/OpenBSD written on a big-endian host
    (108, 24, False),  # OpenBSD DLT_LOOP: network order
    (108, 30, False),
])
def test_bsd_and_macos_loopback_ipv6_captures_are_read(tmp_path: Path, linktype: int, af: int,
                                                        big_endian: bool) -> None:
    order = ">" if linktype == 108 or big_endian else "<"
    frames = [(t, struct.pack(order + "I", af) + d) for t, d in _ipv6_stream()]
    path = tmp_path / f"lo{linktype}_{af}.pcap"
    write_pcap(path, linktype, frames, big_endian=big_endian)
    a = analyse_packets(read_capture(path), source=str(path))
    s = a.streams[0]
    assert a.tcp_packets == 3 and s.client == "[fd00::2]:50000" and s.server == "[fd00::9]:443"
    assert s.syn_synack_ms == pytest.approx(5.0, abs=1e-3)
    assert s.client_signature == "6:64+0:0:1460:8192,7:mss,sok,ts,nop,ws:flow:0"  # the flow label quirk
    if tshark_available():
        t = tshark_view(path).streams[stream_key(s.client, s.server)]
        assert (t.synack_ttl, t.synack_mss, t.synack_wscale) == (s.server_ttl, s.server_mss, s.server_wscale)


def test_mpls_encapsulated_tcp_is_decoded_and_noted(tmp_path: Path) -> None:
    from scapy.layers.l2 import Ether

    def mpls(labels: list[int]) -> bytes:
        out = b""
        for i, label in enumerate(labels):
            out += struct.pack(">I", (label << 12) | ((1 if i == len(labels) - 1 else 0) << 8) | 64)
        return out

    frames = []
    for p in handshake() + [seg(100.03, CLIENT, SERVER, "PA", 1001, 5001, REQ)]:
        eth = bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02", type=0x8847))
        frames.append((float(p.time), eth + mpls([16, 1001]) + bytes(p)))
    path = tmp_path / "mpls.pcap"
    write_pcap(path, 1, frames)
    a = analyse_packets(read_capture(path), source=str(path))
    s = a.streams[0]
    assert a.tcp_packets == 4 and s.handshake_seen and s.first_request_line == "GET /v1/models HTTP/1.1"
    assert any("4 packet(s) were MPLS-encapsulated (label stacks 16/1001)" in n for n in a.notes)
    if tshark_available():
        t = tshark_view(path).streams[stream_key(s.client, s.server)]
        assert t.synack_window == s.server_window and t.initial_rtt_ms == pytest.approx(s.handshake_ms, abs=1e-3)


def test_a_capture_of_only_arp_says_what_it_held(tmp_path: Path) -> None:
    from scapy.layers.l2 import ARP, Ether

    path = write(tmp_path / "arp.pcap", [Ether() / ARP(), Ether() / ARP()])
    with pytest.raises(UsageError, match=r"2 packet\(s\) but no TCP"):
        analyse_packets(read_capture(path), source=str(path))


# ---- handshake and sequence analysis ----------------------------------------------------------


def test_a_retransmitted_syn_pairs_the_syn_ack_with_the_syn_it_answers(tmp_path: Path) -> None:
    # the SYN is lost twice (RTO 1 s, then 2 s); the third one is answered 370 ms later
    pkts = [seg(100.0, CLIENT, SERVER, "S", 1000, options=OPTS), seg(101.0, CLIENT, SERVER, "S", 1000, options=OPTS),
            seg(103.002, CLIENT, SERVER, "S", 1000, options=OPTS),
            seg(103.372, SERVER, CLIENT, "SA", 5000, 1001, options=OPTS),
            seg(103.373, CLIENT, SERVER, "A", 1001, 5001)]
    path = write(tmp_path / "synretx.pcap", pkts)
    a = analyse_packets(read_capture(path), source=str(path))
    s = a.streams[0]
    assert s.syn_synack_ms == pytest.approx(370.0, abs=1e-3)
    assert s.first_syn_synack_ms == pytest.approx(3372.0, abs=1e-3)
    assert s.handshake_ms == pytest.approx(371.0, abs=1e-3) and s.syn_count == 3 and s.syn_retransmitted
    assert any("retransmitted their SYN" in n for n in a.notes)
    if tshark_available():
        t = tshark_view(path).streams[stream_key(s.client, s.server)]
        assert t.initial_rtt_ms == pytest.approx(s.handshake_ms, abs=1e-3)  # tshark times from the last SYN too
        assert t.retransmissions == s.retransmissions == 2


def reorder_capture(path: Path) -> Path:
    """Five segments of 100 bytes: 3 and 4 overtake 2 (out of order), later 5 is resent after an RTO."""
    c0, s0 = 1001, 5001
    pkts = handshake()
    body = [bytes([65 + i]) * 100 for i in range(5)]
    t = 100.1
    order = [0, 2, 3, 1, 4]
    for n, i in enumerate(order):
        pkts.append(seg(t + n * 0.0002, SERVER, CLIENT, "A", s0 + 100 * i, c0, body[i]))
    pkts.append(seg(100.2, CLIENT, SERVER, "A", c0, s0 + 500))
    pkts.append(seg(100.5, SERVER, CLIENT, "PA", s0 + 400, c0, body[4]))   # RTO retransmission (already acked: spurious)
    pkts.append(seg(100.6, CLIENT, SERVER, "PA", c0, s0 + 500, REQ))
    pkts.append(seg(101.0, CLIENT, SERVER, "PA", c0, s0 + 500, REQ))       # RTO retransmission
    return write(path, pkts)


def test_out_of_order_segments_are_not_counted_as_retransmissions(tmp_path: Path) -> None:
    path = reorder_capture(tmp_path / "ooo.pcap")
    s = analyse_packets(read_capture(path), source=str(path)).streams[0]
    assert (s.out_of_order_client, s.out_of_order_server) == (0, 1)
    assert (s.retransmissions_client, s.retransmissions_server) == (1, 1)
    assert s.spurious_retransmissions == 1 and s.bytes_server == 500
    if not tshark_available():
        pytest.skip("tshark is not installed (scripts/setup.sh installs it)")
    t = tshark_view(path).streams[stream_key(s.client, s.server)]
    assert (t.retransmissions, t.out_of_order) == (s.retransmissions, s.out_of_order)


# ---- p0f signatures ---------------------------------------------------------------------------


def test_p0f_signature_forms_on_crafted_syns(tmp_path: Path) -> None:
    pkts = [
        # no MSS, no window scale: p0f writes 0 for both; EOL then 2 bytes of padding to the 4-byte boundary
        seg(100.0, CLIENT, SERVER, "S", 1000, window=8192, options=[("NOP", None), ("EOL", None)]),
        seg(100.01, SERVER, CLIENT, "SA", 5000, 1001, window=5840, options=[("MSS", 1460), ("NOP", None),
                                                                             ("EOL", None)]),
        seg(100.02, CLIENT, SERVER, "A", 1001, 5001),
    ]
    path = write(tmp_path / "sig.pcap", pkts)
    s = analyse_packets(read_capture(path), source=str(path)).streams[0]
    assert s.client_signature == "4:64+0:0:0:8192,0:nop,eol+2:df:0"
    assert s.server_signature == "4:64+0:0:1460:mss*4,0:mss,nop,eol+2:df:0"
    if p0f_available():
        theirs = {(m, sig) for m, _, _, sig in p0f_signatures(path)}
        assert theirs == {("syn", s.client_signature), ("syn+ack", s.server_signature)}


def test_a_mangled_ip_header_is_skipped_and_counted_not_a_traceback(tmp_path: Path) -> None:
    from scapy.layers.inet6 import IPv6

    good = [(float(p.time), bytes(p)) for p in handshake()]
    mangled = bytes(IPv6(nh=43) / b"\x06\x05")  # a routing header that claims far more than it carries
    path = tmp_path / "mangled.pcap"
    write_pcap(path, 101, good + [(101.0, mangled), (101.1, b"\x45\x00")])
    a = analyse_packets(read_capture(path), source=str(path))
    assert a.packets_total == 5 and a.tcp_packets == 3 and a.streams[0].handshake_seen
    assert any("frames without IP" in n for n in a.notes)
