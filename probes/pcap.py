"""Analyse captured packets (live from scapy or read from a pcap/pcapng file): one summary per TCP stream.

Per stream: SYN -> SYN/ACK and SYN -> ACK timing (the SYN/ACK is paired with the SYN it
answers: the last SYN before it whose sequence number it acknowledges, so a retransmitted
SYN does not add its RTO to the RTT), TTL with an initial-TTL guess and hop estimate (p0f
`guess_dist`: round up to 32/64/128/255), window, MSS, window scale, TCP option order and
p0f 3.09b's own `raw_sig` (see p0f.py), retransmissions and out-of-order segments per
direction classified like tshark's tcp.analysis (see seqanalysis.py), time from the first
request byte to the first response byte, and the first response's status and Server header
(plaintext) or ServerHello (TLS).

Files are read one record at a time by scapy's PcapReader/PcapNgReader, wrapped in capfile.py (a
truncated capture is an error naming the record and byte offset, or with allow_truncated a note);
linklayer.py registers what scapy does not dissect by itself (every BSD/macOS IPv6 loopback family,
NFLOG, MPLS multicast and over PPP, ...) and finds the IP header under Ethernet, VLAN/QinQ, MPLS,
PPPoE, SLL/SLL2, NULL/LOOP, raw IP or PPP.

Data of `probe tcp --read` (kind "probe.tcp", mode "read"):
    mode, source, packets_total, tcp_packets, duplicates_dropped, notes [str],
    streams [TcpStream fields, see the dataclass; times in ms, TTLs as numbers]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zgtool.errors import UsageError
from zgtool.probes.capfile import CaptureReader
from zgtool.probes.linklayer import find_ip
from zgtool.probes.linklayer import load as load_link_layers
from zgtool.probes.p0f import raw_sig
from zgtool.probes.seqanalysis import SeqAnalyser
from zgtool.probes.tlsparse import ServerHello, find_client_hello, find_server_hello, is_tls_record

INITIAL_TTLS = (32, 64, 128, 255)
# scapy's lo socket sees each packet twice (outgoing + incoming); identical IP bytes this close
# together are one packet, never a retransmission (Linux needs >= 200 ms RTO to resend).
DUPLICATE_WINDOW_S = 0.001
HEAD_LIMIT = 16 * 1024
OPTION_NAMES = {"MSS": "mss", "NOP": "nop", "WScale": "ws", "SAckOK": "sok", "SAck": "sack",
                "Timestamp": "ts", "EOL": "eol"}


@dataclass
class TcpStream:
    index: int
    client: str                      # "ip:port" of the side that sent the SYN
    server: str
    handshake_seen: bool
    start_s: float                   # capture timestamp (epoch s) of the first packet
    duration_ms: float
    syn_synack_ms: float | None      # the RTT as seen where the capture was taken (client side)
    synack_ack_ms: float | None      # the RTT as seen from the server side
    handshake_ms: float | None       # SYN -> the client's ACK
    syn_retransmitted: bool
    server_ttl: int | None
    server_initial_ttl: int | None
    server_hops: int | None
    client_ttl: int | None
    client_initial_ttl: int | None
    client_hops: int | None
    server_window: int | None        # raw window field of the SYN/ACK
    server_mss: int | None
    server_wscale: int | None
    server_options: str | None       # option layout of the SYN/ACK, e.g. "mss,sok,ts,nop,ws"
    server_signature: str | None     # p0f 3.09b raw_sig of the SYN/ACK
    client_signature: str | None     # p0f 3.09b raw_sig of the SYN
    packets: int
    packets_client: int
    packets_server: int
    bytes_client: int                # TCP payload bytes
    bytes_server: int
    retransmissions_client: int      # like tshark's tcp.analysis.retransmission (fast, spurious included)
    retransmissions_server: int
    ttfb_ms: float | None            # first request byte -> first response byte
    first_request_line: str | None
    http_status: int | None
    server_header: str | None
    tls_sni: str | None
    tls_server_hello: ServerHello | None
    ja4s: str | None
    closed_by: str | None            # "fin" | "rst" | None (still open when the capture ended)
    syn_count: int = 0               # SYNs sent (1 + retransmitted SYNs)
    first_syn_synack_ms: float | None = None   # first SYN -> SYN/ACK: includes the SYN retransmission timeouts
    out_of_order_client: int = 0     # like tshark's tcp.analysis.out_of_order
    out_of_order_server: int = 0
    fast_retransmissions: int = 0
    spurious_retransmissions: int = 0

    @property
    def retransmissions(self) -> int:
        return self.retransmissions_client + self.retransmissions_server

    @property
    def out_of_order(self) -> int:
        return self.out_of_order_client + self.out_of_order_server


@dataclass
class PcapAnalysis:
    mode: str
    source: str
    packets_total: int
    tcp_packets: int
    duplicates_dropped: int
    streams: list[TcpStream]
    notes: list[str] = field(default_factory=list)


class Capture(list):  # type: ignore[type-arg]
    """The IP packets of a capture file (scapy IP/IPv6 objects, `.time` set) and what reading it found."""

    def __init__(self, packets: list[Any], *, records_total: int, notes: list[str]) -> None:
        super().__init__(packets)
        self.records_total = records_total
        self.notes = notes


def initial_ttl(ttl: int) -> int:
    return next(t for t in INITIAL_TTLS if ttl <= t)


def load_layers() -> None:
    """Register link/IP/TCP dissectors; scapy.sendrecv alone leaves packets undecoded (Raw)."""
    load_link_layers()


def read_capture(path: str | Path, *, allow_truncated: bool = False) -> Capture:
    """Every IP packet of a pcap/pcapng file, read one record at a time by scapy; UsageError for a missing,
    foreign or truncated file."""
    load_layers()
    reader = CaptureReader(path, allow_truncated=allow_truncated)
    packets: list[Any] = []
    skipped: dict[str, int] = {}
    vlan = 0
    mpls: dict[tuple[int, ...], int] = {}
    for pkt in reader:
        found = find_ip(pkt)
        if found.ip is None:
            reason = found.skipped or "no IP"
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        vlan += found.vlan_tags > 0
        if found.mpls_labels:
            mpls[found.mpls_labels] = mpls.get(found.mpls_labels, 0) + 1
        found.ip.time = pkt.time
        packets.append(found.ip)
    notes = []
    if reader.truncation is not None:
        notes.append(f"{path} is {reader.truncation.describe(reader.records)}; analysed the complete records")
    if mpls:
        stacks = ", ".join("/".join(map(str, k)) for k in list(mpls)[:4]) + (", ..." if len(mpls) > 4 else "")
        notes.append(f"{sum(mpls.values())} packet(s) were MPLS-encapsulated (label stacks {stacks}); "
                     "decoded to the IP packet inside")
    if vlan:
        notes.append(f"{vlan} packet(s) carried 802.1Q/802.1ad VLAN tags")
    undecoded = {k: v for k, v in skipped.items() if not k.startswith("ARP")}
    if undecoded:
        notes.append("frames without IP: " + "; ".join(f"{v} x {k}" for k, v in sorted(undecoded.items())))
    return Capture(packets, records_total=reader.records, notes=notes)


def _layers(pkt: Any) -> tuple[Any, Any] | None:
    from scapy.layers.inet import IP, TCP
    from scapy.layers.inet6 import IPv6

    if not pkt.haslayer(TCP):
        return None
    ip = pkt.getlayer(IP) or pkt.getlayer(IPv6)
    return (ip, pkt[TCP]) if ip is not None else None


def _seglen(ip: Any, tcp: Any) -> int:
    """TCP payload length on the wire, from the IP header (a short snaplen cuts only the captured bytes)."""
    if ip.version == 4:
        n = int(ip.len) - int(ip.ihl) * 4 - int(tcp.dataofs) * 4
    else:
        ext = len(bytes(ip)) - len(bytes(tcp)) - 40  # IPv6 extension headers before TCP
        n = int(ip.plen) - ext - int(tcp.dataofs) * 4
    return max(n, 0)


def _payload(ip: Any, tcp: Any) -> bytes:
    """The captured payload bytes (fewer than _seglen when the snaplen cut the packet; no Ethernet padding)."""
    raw = bytes(tcp.payload)
    n = _seglen(ip, tcp)
    return raw[:n] if n < len(raw) else raw


def _opts(tcp: Any) -> tuple[str, dict[str, Any]]:
    names, vals = [], {}
    for opt in tcp.options:
        kind, val = (opt[0], opt[1]) if isinstance(opt, tuple) else (opt, None)
        names.append(OPTION_NAMES.get(kind, f"?{kind}") if isinstance(kind, str) else f"?{kind}")
        vals[kind] = val
    return ",".join(names), vals


def signature(ip: Any, tcp: Any, syn_mss: int = 0) -> str | None:
    """p0f 3.09b's raw_sig of a SYN or SYN/ACK (see p0f.py); `syn_mss`: the SYN's MSS, for a SYN/ACK."""
    return raw_sig(bytes(ip), syn_mss)


def dedupe(packets: Any) -> tuple[list[Any], int]:
    """Drop the second copy of each packet scapy sees twice on loopback; (kept, dropped)."""
    kept: list[Any] = []
    last_seen: dict[bytes, float] = {}
    dropped = 0
    for pkt in packets:
        lay = _layers(pkt)
        if lay is not None:
            key, t = bytes(lay[0]), float(pkt.time)
            prev = last_seen.get(key)
            last_seen[key] = t
            if prev is not None and abs(t - prev) <= DUPLICATE_WINDOW_S:
                dropped += 1
                continue
        kept.append(pkt)
    return kept, dropped


def analyse_packets(packets: Any, *, source: str = "live", mode: str = "read") -> PcapAnalysis:
    flows: dict[tuple[Any, ...], list[tuple[float, Any, Any]]] = {}
    order: list[tuple[Any, ...]] = []
    read_notes = list(getattr(packets, "notes", []))
    # only a live loopback capture sees each packet twice; in a file, a copy is a real duplicate
    kept, dups = dedupe(packets) if mode == "live" else (list(packets), 0)
    total = getattr(packets, "records_total", len(kept) + dups)
    ntcp = 0
    for pkt in kept:
        lay = _layers(pkt)
        if lay is None:
            continue
        ip, tcp = lay
        ntcp += 1
        a, b = (str(ip.src), int(tcp.sport)), (str(ip.dst), int(tcp.dport))
        key = tuple(sorted((a, b)))
        if key not in flows:
            flows[key] = []
            order.append(key)
        flows[key].append((float(pkt.time), ip, tcp))
    if total and not ntcp:
        why = f" ({'; '.join(read_notes)})" if read_notes else ""
        raise UsageError(f"{source}: the capture holds {total} packet(s) but no TCP{why}")
    if not total:
        raise UsageError(f"{source}: the capture is empty")
    streams = [_summarise(i, flows[k]) for i, k in enumerate(order)]
    notes = read_notes
    if any(s.server.startswith(("127.", "[::1]")) for s in streams):
        notes.append("loopback: one kernel on both ends (TTL 64, 0 hops), so TCP fingerprints cannot tell "
                     "a local proxy from the origin")
    retried = [s for s in streams if s.syn_count > 1 and s.handshake_seen]
    if retried:
        notes.append(f"{len(retried)} stream(s) retransmitted their SYN: SYN -> SYN/ACK is timed from the SYN "
                     "the SYN/ACK answers; first_syn_synack_ms includes the retransmission timeouts")
    return PcapAnalysis(mode, source, total, ntcp, dups, streams, notes)


def _endpoint(ip: Any, port: int, src: bool) -> str:
    addr = str(ip.src if src else ip.dst)
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def _pair_handshake(pkts: list[tuple[float, Any, Any]]) -> tuple[Any, Any, list[Any]]:
    """(syn, synack, syns): the first SYN/ACK and the SYN it answers (the last SYN before it that
    it acknowledges), so a retransmitted SYN's timeout is not counted as RTT."""
    syns = [(t, ip, tcp) for t, ip, tcp in pkts if tcp.flags.S and not tcp.flags.A]
    synacks = [(t, ip, tcp) for t, ip, tcp in pkts if tcp.flags.S and tcp.flags.A]
    synack = synacks[0] if synacks else None
    if synack is None:
        return (syns[0] if syns else None), None, syns
    answered = [s for s in syns if (int(s[2].seq) + 1) % 2**32 == int(synack[2].ack)]
    before = [s for s in answered if s[0] <= synack[0]] or [s for s in syns if s[0] <= synack[0]]
    # a capture that recorded the SYN/ACK before its SYN (merged interfaces, clock steps): still pair them
    candidates = before or answered
    syn = candidates[-1] if candidates else None
    return syn, synack, syns


def _summarise(index: int, pkts: list[tuple[float, Any, Any]]) -> TcpStream:
    syn, synack, syns = _pair_handshake(pkts)
    if syns:
        _, ip0, tcp0 = syns[0]
        client = _endpoint(ip0, int(tcp0.sport), True)
    elif synack is not None:
        _, ip0, tcp0 = synack
        client = _endpoint(ip0, int(tcp0.dport), False)
    else:  # handshake not captured: the lower port is most likely the server's
        _, ip0, tcp0 = pkts[0]
        client_is_src = int(tcp0.sport) > int(tcp0.dport)
        client = _endpoint(ip0, int(tcp0.sport if client_is_src else tcp0.dport), client_is_src)

    def is_client(ip: Any, tcp: Any) -> bool:
        return _endpoint(ip, int(tcp.sport), True) == client

    t_first, ipf, tcpf = pkts[0]
    server = (_endpoint(ipf, int(tcpf.dport), False) if is_client(ipf, tcpf)
              else _endpoint(ipf, int(tcpf.sport), True))
    ack_t = None
    if synack is not None:
        want = (int(synack[2].seq) + 1) % 2**32
        ack_t = next((t for t, ip, tcp in pkts if t >= synack[0] and is_client(ip, tcp)
                      and tcp.flags.A and not tcp.flags.S and int(tcp.ack) == want), None)
    elif syn is not None:  # only the client's direction was captured: its first ACK ends the handshake
        ack_t = next((t for t, ip, tcp in pkts if t >= syn[0] and is_client(ip, tcp)
                      and tcp.flags.A and not tcp.flags.S), None)
    seqa = SeqAnalyser()
    nbytes = {True: 0, False: 0}
    npk = {True: 0, False: 0}
    data: dict[bool, list[tuple[int, bytes]]] = {True: [], False: []}
    isn: dict[bool, int] = {}
    first_payload_t: dict[bool, float] = {}
    closed = None
    ttl: dict[bool, int] = {}
    mru_syn_t: float | None = None
    for t, ip, tcp in pkts:
        side = is_client(ip, tcp)
        npk[side] += 1
        ttl.setdefault(side, int(ip.ttl if ip.version == 4 else ip.hlim))
        pl = _payload(ip, tcp)
        seglen = _seglen(ip, tcp)
        flags = int(tcp.flags)
        if flags & 0x02 and not flags & 0x10:
            mru_syn_t = t
        if (seqa.initial_rtt_s is None and ack_t is not None and t == ack_t and side and mru_syn_t is not None):
            seqa.initial_rtt_s = t - mru_syn_t  # tshark's tcp.analysis.initial_rtt
        kind = seqa.feed(side, t, int(tcp.seq), int(tcp.ack), flags, int(tcp.window), seglen)
        seq = int(tcp.seq)
        isn.setdefault(side, seq)
        if seglen and kind in (None, "out_of_order"):  # new data (late or not), counted once
            nbytes[side] += seglen
            first_payload_t.setdefault(side, t)
            if pl:
                data[side].append(((seq - isn[side]) % 2**32, pl))
        if tcp.flags.R:
            closed = closed or "rst"
        elif tcp.flags.F:
            closed = closed or "fin"
    req, resp = _assemble(data[True]), _assemble(data[False])
    ttfb = None
    if True in first_payload_t and False in first_payload_t and first_payload_t[False] >= first_payload_t[True]:
        ttfb = (first_payload_t[False] - first_payload_t[True]) * 1e3
    status, server_hdr, req_line, sni, sh = _application(req, resp)
    s_ttl, c_ttl = ttl.get(False), ttl.get(True)
    layout, vals = _opts(synack[2]) if synack else (None, {})
    syn_mss = int(_opts(syn[2])[1].get("MSS") or 0) if syn else 0
    cc, sc = seqa.counts[True], seqa.counts[False]
    return TcpStream(
        index=index, client=client, server=server, handshake_seen=bool(syn and synack), start_s=t_first,
        duration_ms=round((pkts[-1][0] - t_first) * 1e3, 3),
        syn_synack_ms=_ms(syn[0], synack[0]) if syn and synack and synack[0] >= syn[0] else None,
        synack_ack_ms=_ms(synack[0], ack_t) if synack and ack_t is not None else None,
        handshake_ms=_ms(syn[0], ack_t) if syn and ack_t is not None else None,
        syn_retransmitted=len(syns) > 1,
        server_ttl=s_ttl, server_initial_ttl=initial_ttl(s_ttl) if s_ttl is not None else None,
        server_hops=initial_ttl(s_ttl) - s_ttl if s_ttl is not None else None,
        client_ttl=c_ttl, client_initial_ttl=initial_ttl(c_ttl) if c_ttl is not None else None,
        client_hops=initial_ttl(c_ttl) - c_ttl if c_ttl is not None else None,
        server_window=int(synack[2].window) if synack else None, server_mss=vals.get("MSS"),
        server_wscale=vals.get("WScale"), server_options=layout,
        server_signature=signature(synack[1], synack[2], syn_mss) if synack else None,
        client_signature=signature(syn[1], syn[2]) if syn else None,
        packets=len(pkts), packets_client=npk[True], packets_server=npk[False],
        bytes_client=nbytes[True], bytes_server=nbytes[False],
        retransmissions_client=cc.retransmissions, retransmissions_server=sc.retransmissions,
        ttfb_ms=round(ttfb, 3) if ttfb is not None else None, first_request_line=req_line,
        http_status=status, server_header=server_hdr, tls_sni=sni, tls_server_hello=sh,
        ja4s=sh.ja4s if sh else None, closed_by=closed,
        syn_count=len(syns),
        first_syn_synack_ms=_ms(syns[0][0], synack[0]) if syns and synack and synack[0] >= syns[0][0] else None,
        out_of_order_client=cc.out_of_order, out_of_order_server=sc.out_of_order,
        fast_retransmissions=cc.fast_retransmissions + sc.fast_retransmissions,
        spurious_retransmissions=cc.spurious_retransmissions + sc.spurious_retransmissions)


def _ms(a: float, b: float | None) -> float | None:
    return None if b is None else round((b - a) * 1e3, 3)


def _assemble(segments: list[tuple[int, bytes]]) -> bytes:
    """The first HEAD_LIMIT bytes of one direction, in sequence order (a gap ends it)."""
    out = bytearray()
    ordered = sorted(segments, key=lambda s: s[0])
    base = ordered[0][0] if ordered else 0
    for rel, pl in ordered:
        offset = rel - base
        if offset > len(out) or len(out) >= HEAD_LIMIT:
            break
        out += pl[len(out) - offset:]
    return bytes(out)


def _application(req: bytes, resp: bytes) -> tuple[int | None, str | None, str | None, str | None, Any]:
    from zgtool.errors import ZgError
    from zgtool.probes.http1 import parse_head

    status = server = line = sni = sh = None
    if is_tls_record(req):
        try:
            ch = find_client_hello(req)
            sni = ch.sni if ch else None
        except ValueError:
            pass
    elif req:
        line = req.split(b"\r\n", 1)[0].decode("latin-1")[:200]
    if is_tls_record(resp):
        try:
            sh = find_server_hello(resp)
        except ValueError:
            sh = None
    elif resp.startswith(b"HTTP/") and b"\r\n\r\n" in resp:
        try:
            head = parse_head(resp.split(b"\r\n\r\n", 1)[0])
            status, server = head.status, head.get("server")
        except ZgError:
            pass
    return status, server, line, sni, sh
