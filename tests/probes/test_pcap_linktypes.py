"""probe tcp --read on every link type and encapsulation the reader promises (scapy's dissectors plus
probes/linklayer.py's bindings), each crafted capture checked against tshark reading the same file."""

from __future__ import annotations

import gzip
import struct
import subprocess
from pathlib import Path

import pytest
from test_pcap_reader import write_pcap
from wire_refs import stream_key, tshark_available, tshark_view

from zgtool.errors import UsageError
from zgtool.probes.pcap import analyse_packets, read_capture

OPTS = [("MSS", 1460), ("SAckOK", b""), ("Timestamp", (1, 0)), ("NOP", None), ("WScale", 7)]


def handshake(v6: bool) -> list[tuple[float, bytes]]:
    """SYN, SYN/ACK 5 ms later, ACK 1 ms after that, as IP bytes."""
    from scapy.layers.inet import IP, TCP
    from scapy.layers.inet6 import IPv6

    c, s = ("fd00::2", "fd00::9") if v6 else ("10.0.0.2", "10.0.0.9")

    def ip(src: str, dst: str) -> object:
        return IPv6(src=src, dst=dst) if v6 else IP(src=src, dst=dst, flags="DF", id=0)

    pkts = [(300.0, ip(c, s) / TCP(sport=41000, dport=8000, flags="S", seq=1, options=OPTS)),
            (300.005, ip(s, c) / TCP(sport=8000, dport=41000, flags="SA", seq=9, ack=2, options=OPTS)),
            (300.006, ip(c, s) / TCP(sport=41000, dport=8000, flags="A", seq=2, ack=10))]
    return [(t, bytes(p)) for t, p in pkts]


def ether(etype: int) -> bytes:
    return bytes.fromhex("020000000002020000000001") + struct.pack(">H", etype)


def label(value: int, bottom: bool) -> bytes:
    return struct.pack(">I", (value << 12) | (0x100 if bottom else 0) | 64)


def nflog(ip: bytes) -> bytes:
    prefix = struct.pack("<HH", 8, 1) + b"\x08\x00\x01\x00"          # NFULA_PACKET_HDR before the payload
    return b"\x02\x00\x00\x00" + prefix + struct.pack("<HH", 4 + len(ip), 9) + ip + b"\0" * (-len(ip) % 4)


# name: (link type, v6, frame from IP bytes, big-endian file)
CASES = {
    "raw_ip_14_openbsd": (14, False, lambda ip: ip, False),
    "raw_ipv4_228": (228, False, lambda ip: ip, False),
    "raw_ipv6_229": (229, True, lambda ip: ip, False),
    "sll2_276": (276, True, lambda ip: struct.pack(">HHIHBB8s", 0x86DD, 0, 1, 1, 0, 6, b"\2" * 6) + ip, False),
    "sll_113": (113, False, lambda ip: struct.pack(">HHH8sH", 0, 1, 6, b"\2" * 6, 0x0800) + ip, False),
    "ppp_hdlc_9": (9, False, lambda ip: b"\xff\x03\x00\x21" + ip, False),
    "ppp_ipv6_9": (9, True, lambda ip: b"\x00\x57" + ip, False),
    "ppp_serial_50": (50, False, lambda ip: b"\xff\x03\x00\x21" + ip, False),
    "pppoe_session": (1, False, lambda ip: ether(0x8864) + b"\x11\x00\x00\x01" + struct.pack(">H", 2 + len(ip))
                      + b"\x00\x21" + ip, False),
    "qinq_9100": (1, False, lambda ip: ether(0x9100) + b"\x00\x64\x81\x00" + b"\x00\xc8\x08\x00" + ip, False),
    "mpls_multicast": (1, False, lambda ip: ether(0x8848) + label(17, True) + ip, False),
    "mpls_over_ppp": (9, False, lambda ip: b"\xff\x03\x02\x81" + label(18, True) + ip, False),
    "mpls_pseudowire": (1, False, lambda ip: ether(0x8847) + label(19, True) + b"\0\0\0\0" + ether(0x0800) + ip,
                        False),
    "nflog_239": (239, False, nflog, False),
    "null_ipv4_big_endian_host": (0, False, lambda ip: struct.pack(">I", 2) + ip, True),
}

# tshark guesses an MPLS payload from its first nibble; a pseudowire's control word has to be named
DECODE_AS = {"mpls_pseudowire": ("mpls.label==19,pwethcw",)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_link_type_reaches_the_tcp_handshake_as_tshark_does(tmp_path: Path, case: str) -> None:
    linktype, v6, frame, big_endian = CASES[case]
    path = tmp_path / f"{case}.pcap"
    write_pcap(path, linktype, [(t, frame(ip)) for t, ip in handshake(v6)], big_endian=big_endian)
    a = analyse_packets(read_capture(path), source=str(path))
    (s,) = a.streams
    assert a.tcp_packets == 3 and s.handshake_seen and s.server.endswith(":8000"), a
    assert s.syn_synack_ms == pytest.approx(5.0, abs=1e-3) and s.handshake_ms == pytest.approx(6.0, abs=1e-3)
    if not tshark_available():
        pytest.skip("tshark is not installed (scripts/setup.sh installs it)")
    t = tshark_view(path, DECODE_AS.get(case, ())).streams[stream_key(s.client, s.server)]
    assert (t.synack_ttl, t.synack_window, t.synack_mss, t.synack_wscale) == (
        s.server_ttl, s.server_window, s.server_mss, s.server_wscale)
    assert t.initial_rtt_ms == pytest.approx(s.handshake_ms, abs=1e-3)


def pcapng(path: Path, tsresol: int, tsoffset_s: int, stamps: list[int], frames: list[bytes]) -> None:
    """One raw-IP interface with if_tsresol and if_tsoffset, one EPB per frame."""
    opts = struct.pack("<HHB3x", 9, 1, tsresol) + struct.pack("<HHq", 14, 8, tsoffset_s) + struct.pack("<HH", 0, 0)
    out = struct.pack("<IIIHHqI", 0x0A0D0D0A, 28, 0x1A2B3C4D, 1, 0, -1, 28)
    out += struct.pack("<IIHHI", 1, 20 + len(opts), 101, 0, 65535) + opts + struct.pack("<I", 20 + len(opts))
    for ts, data in zip(stamps, frames, strict=True):
        pad = -len(data) % 4
        blen = 32 + len(data) + pad
        out += struct.pack("<IIIIIII", 6, blen, 0, ts >> 32, ts & 0xFFFFFFFF, len(data), len(data))
        out += data + b"\0" * pad + struct.pack("<I", blen)
    path.write_bytes(out)


def test_pcapng_timestamps_honour_if_tsresol_and_if_tsoffset_like_tshark(tmp_path: Path) -> None:
    path = tmp_path / "tsoffset.pcapng"
    stamps = [5_000_000_000, 5_005_000_000, 5_006_000_000]        # nanoseconds (if_tsresol 9) after the offset
    pcapng(path, 9, 1_600_000_000, stamps, [ip for _, ip in handshake(False)])
    a = analyse_packets(read_capture(path), source=str(path))
    s = a.streams[0]
    assert s.start_s == pytest.approx(1_600_000_005.0, abs=1e-6) and s.syn_synack_ms == pytest.approx(5.0, abs=1e-3)
    if not tshark_available():
        pytest.skip("tshark is not installed (scripts/setup.sh installs it)")
    out = subprocess.run(["tshark", "-r", str(path), "-T", "fields", "-e", "frame.time_epoch"], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert float(out[0]) == pytest.approx(s.start_s, abs=1e-6)


def test_a_gzip_compressed_capture_is_read_as_it_is(tmp_path: Path) -> None:
    plain = tmp_path / "plain.pcap"
    write_pcap(plain, 101, handshake(False))
    packed = tmp_path / "packed.pcap.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    ours = analyse_packets(read_capture(packed), source=str(packed)).streams[0]
    assert ours == analyse_packets(read_capture(plain), source=str(plain)).streams[0]


def test_a_gzip_capture_cut_short_names_the_record_and_offset_of_the_inflated_file(tmp_path: Path) -> None:
    plain = tmp_path / "plain.pcap"
    write_pcap(plain, 101, handshake(False))
    packed = tmp_path / "cut.pcap.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()[:-10]))
    with pytest.raises(UsageError, match=r"truncated: record 3 at byte offset 176 needs 56 bytes but the file "
                                         r"ends after 46; 2 complete record\(s\) before it"):
        read_capture(packed)


def test_a_gzip_stream_cut_inside_a_record_says_what_that_record_needs(tmp_path: Path) -> None:
    plain = tmp_path / "plain.pcap"
    write_pcap(plain, 101, handshake(False))
    packed = gzip.compress(plain.read_bytes())
    cut = tmp_path / "cut.pcap.gz"
    cut.write_bytes(packed[:-12])       # the stream's end marker and the last compressed bytes gone
    with pytest.raises(UsageError, match=r"truncated: record (\d) at byte offset (\d+) needs 56 bytes"):
        read_capture(cut)


def test_a_pcapng_packet_naming_an_undescribed_interface_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "iface.pcapng"
    pcapng(path, 6, 0, [1, 2, 3], [ip for _, ip in handshake(False)])
    data = bytearray(path.read_bytes())
    second_epb = data.index(struct.pack("<I", 6), 28 + 48 + 4 + 8)
    data[second_epb + 8:second_epb + 12] = struct.pack("<I", 3)      # interface 3 of 1
    path.write_bytes(bytes(data))
    with pytest.raises(UsageError, match=rf"corrupt: record 2 at byte offset {second_epb} names interface 3"):
        read_capture(path)


def test_a_pcapng_packet_claiming_more_bytes_than_its_block_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "caplen.pcapng"
    pcapng(path, 6, 0, [1, 2, 3], [ip for _, ip in handshake(False)])
    data = bytearray(path.read_bytes())
    first_epb = 28 + struct.unpack("<I", data[32:36])[0]               # after the 28-byte SHB and the IDB
    data[first_epb + 20:first_epb + 24] = struct.pack("<I", 4000)      # caplen 4000 in a ~100-byte block
    path.write_bytes(bytes(data))
    with pytest.raises(UsageError, match=rf"corrupt: record 1 at byte offset {first_epb} claims 4000 captured bytes"):
        read_capture(path)


def test_a_modified_pcap_is_refused_with_the_conversion_to_run(tmp_path: Path) -> None:
    path = tmp_path / "modified.pcap"
    path.write_bytes(struct.pack("<IHHiIII", 0xA1B2CD34, 2, 4, 0, 0, 65535, 1))
    with pytest.raises(UsageError, match=r"'modified' pcap \(magic 34cdb2a1\).*editcap -F pcap"):
        read_capture(path)


def test_a_file_that_is_no_capture_says_so(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello, world\n")
    with pytest.raises(UsageError, match=r"is not a pcap or pcapng capture \(first bytes 68656c6c\)"):
        read_capture(path)
