"""Analyse captured packets (live from scapy or read from a pcap/pcapng file): one summary per TCP stream.

Per stream: SYN -> SYN/ACK and SYN -> ACK timing, TTL with an initial-TTL guess and hop
estimate (p0f `guess_dist`: round up to 32/64/128/255), window, MSS, window scale, TCP
option order and a p0f-style signature `ver:ittl:olen:mss:wsize,scale:olayout:quirks:pclass`,
retransmissions per direction, time from the first request byte to the first response
byte, and the first response's status and Server header (plaintext) or ServerHello (TLS).

Data of `probe tcp --read` (kind "probe.tcp", mode "read"):
    mode, source, packets_total, tcp_packets, duplicates_dropped, notes [str],
    streams [TcpStream fields, see the dataclass; times in ms, TTLs as numbers]
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zgtool.errors import UsageError
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
    server_signature: str | None     # p0f-style, of the SYN/ACK
    client_signature: str | None     # p0f-style, of the SYN
    packets: int
    packets_client: int
    packets_server: int
    bytes_client: int                # TCP payload bytes
    bytes_server: int
    retransmissions_client: int
    retransmissions_server: int
    ttfb_ms: float | None            # first request byte -> first response byte
    first_request_line: str | None
    http_status: int | None
    server_header: str | None
    tls_sni: str | None
    tls_server_hello: ServerHello | None
    ja4s: str | None
    closed_by: str | None            # "fin" | "rst" | None (still open when the capture ended)

    @property
    def retransmissions(self) -> int:
        return self.retransmissions_client + self.retransmissions_server


@dataclass
class PcapAnalysis:
    mode: str
    source: str
    packets_total: int
    tcp_packets: int
    duplicates_dropped: int
    streams: list[TcpStream]
    notes: list[str] = field(default_factory=list)


def initial_ttl(ttl: int) -> int:
    return next(t for t in INITIAL_TTLS if ttl <= t)


def load_layers() -> None:
    """Register link/IP/TCP dissectors; scapy.sendrecv alone leaves packets undecoded (Raw)."""
    import scapy.layers.inet  # noqa: F401
    import scapy.layers.inet6  # noqa: F401
    import scapy.layers.l2  # noqa: F401


def read_capture(path: str | Path) -> Any:
    """rdpcap with clear errors: missing file, not a capture, truncated capture."""
    from scapy.error import Scapy_Exception

    load_layers()
    from scapy.utils import rdpcap

    p = Path(path)
    if not p.is_file():
        raise UsageError(f"capture file not found: {p}")
    try:
        return rdpcap(str(p))
    except Scapy_Exception as exc:
        raise UsageError(f"{p} is not a pcap or pcapng capture ({exc})") from exc
    except (EOFError, OSError, ValueError, IndexError, TypeError) as exc:
        raise UsageError(f"{p} is a corrupt or truncated capture ({type(exc).__name__}: {exc})") from exc


def _layers(pkt: Any) -> tuple[Any, Any] | None:
    from scapy.layers.inet import IP, TCP
    from scapy.layers.inet6 import IPv6

    if not pkt.haslayer(TCP):
        return None
    ip = pkt.getlayer(IP) or pkt.getlayer(IPv6)
    return (ip, pkt[TCP]) if ip is not None else None


def _payload(ip: Any, tcp: Any) -> bytes:
    raw = bytes(tcp.payload)
    if ip.version == 4:
        n = ip.len - ip.ihl * 4 - tcp.dataofs * 4
    else:
        n = ip.plen - tcp.dataofs * 4
    return raw[:max(n, 0)] if n < len(raw) else raw


def _opts(tcp: Any) -> tuple[str, dict[str, Any]]:
    names, vals = [], {}
    for opt in tcp.options:
        kind, val = (opt[0], opt[1]) if isinstance(opt, tuple) else (opt, None)
        names.append(OPTION_NAMES.get(kind, f"?{kind}") if isinstance(kind, str) else f"?{kind}")
        vals[kind] = val
    return ",".join(names), vals


def signature(ip: Any, tcp: Any) -> str:
    """p0f v3 style `ver:ittl:olen:mss:wsize,scale:olayout:quirks:pclass` of a SYN or SYN/ACK."""
    layout, vals = _opts(tcp)
    ver = ip.version
    ttl = ip.ttl if ver == 4 else ip.hlim
    olen = (ip.ihl * 4 - 20) if ver == 4 else 0
    mss = vals.get("MSS")
    win = int(tcp.window)
    wsize = f"mss*{win // mss}" if mss and win and win % mss == 0 else str(win)
    scale = vals.get("WScale", "*")
    quirks = []
    if ver == 4:
        df = bool(int(ip.flags) & 0x2)
        quirks += ["df"] if df else []
        quirks += ["id+"] if df and ip.id else []
        quirks += ["id-"] if not df and not ip.id else []
    if int(tcp.flags) & 0xC0:  # ECE / CWR
        quirks.append("ecn")
    ts = vals.get("Timestamp")
    if ts and not ts[0]:
        quirks.append("ts1-")
    pclass = "+" if _payload(ip, tcp) else "0"
    return f"{ver}:{initial_ttl(ttl)}:{olen}:{mss if mss else '*'}:{wsize},{scale}:{layout}:{','.join(quirks)}:{pclass}"


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
    kept, dups = dedupe(packets)
    total = len(kept) + dups
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
        raise UsageError(f"{source}: the capture holds {total} packet(s) but no TCP")
    if not total:
        raise UsageError(f"{source}: the capture is empty")
    streams = [_summarise(i, flows[k]) for i, k in enumerate(order)]
    notes = []
    if any(s.server.startswith(("127.", "::1")) for s in streams):
        notes.append("loopback: one kernel on both ends (TTL 64, 0 hops), so TCP fingerprints cannot tell "
                     "a local proxy from the origin")
    return PcapAnalysis(mode, source, total, ntcp, dups, streams, notes)


def _endpoint(ip: Any, port: int, src: bool) -> str:
    addr = str(ip.src if src else ip.dst)
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def _summarise(index: int, pkts: list[tuple[float, Any, Any]]) -> TcpStream:
    pkts.sort(key=lambda x: x[0])
    syns = [(t, ip, tcp) for t, ip, tcp in pkts if tcp.flags.S and not tcp.flags.A]
    synacks = [(t, ip, tcp) for t, ip, tcp in pkts if tcp.flags.S and tcp.flags.A]
    if syns:
        _, ip0, tcp0 = syns[0]
        client = _endpoint(ip0, int(tcp0.sport), True)
    elif synacks:
        _, ip0, tcp0 = synacks[0]
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
    synack = synacks[0] if synacks else None
    syn = None
    if synack is not None:
        before = [s for s in syns if s[0] <= synack[0]]
        syn = before[-1] if before else None
    elif syns:
        syn = syns[0]
    ack_t = None
    if synack is not None:
        ack_t = next((t for t, ip, tcp in pkts if t >= synack[0] and is_client(ip, tcp)
                      and tcp.flags.A and not tcp.flags.S), None)
    retrans = {True: 0, False: 0}
    isn: dict[bool, int] = {}
    max_end: dict[bool, int] = {}
    nbytes = {True: 0, False: 0}
    npk = {True: 0, False: 0}
    data: dict[bool, list[tuple[int, bytes]]] = {True: [], False: []}
    first_payload_t: dict[bool, float] = {}
    closed = None
    ttl: dict[bool, int] = {}
    for t, ip, tcp in pkts:
        side = is_client(ip, tcp)
        npk[side] += 1
        ttl.setdefault(side, int(ip.ttl if ip.version == 4 else ip.hlim))
        pl = _payload(ip, tcp)
        seq = int(tcp.seq)
        if side not in isn:
            isn[side] = seq
            max_end[side] = 0
        rel = (seq - isn[side]) % 2**32
        seg = len(pl) + (1 if tcp.flags.S else 0) + (1 if tcp.flags.F else 0)
        if seg:
            if rel + seg <= max_end[side]:
                retrans[side] += 1
                continue
            max_end[side] = max(max_end[side], rel + seg)
        if pl:
            nbytes[side] += len(pl)
            data[side].append((rel, pl))
            first_payload_t.setdefault(side, t)
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
    return TcpStream(
        index=index, client=client, server=server, handshake_seen=bool(syn and synack), start_s=t_first,
        duration_ms=round((pkts[-1][0] - t_first) * 1e3, 3),
        syn_synack_ms=_ms(syn[0], synack[0]) if syn and synack else None,
        synack_ack_ms=_ms(synack[0], ack_t) if synack and ack_t is not None else None,
        handshake_ms=_ms(syn[0], ack_t) if syn and ack_t is not None else None,
        syn_retransmitted=len(syns) > 1,
        server_ttl=s_ttl, server_initial_ttl=initial_ttl(s_ttl) if s_ttl else None,
        server_hops=initial_ttl(s_ttl) - s_ttl if s_ttl else None,
        client_ttl=c_ttl, client_initial_ttl=initial_ttl(c_ttl) if c_ttl else None,
        client_hops=initial_ttl(c_ttl) - c_ttl if c_ttl else None,
        server_window=int(synack[2].window) if synack else None, server_mss=vals.get("MSS"),
        server_wscale=vals.get("WScale"), server_options=layout,
        server_signature=signature(synack[1], synack[2]) if synack else None,
        client_signature=signature(syn[1], syn[2]) if syn else None,
        packets=len(pkts), packets_client=npk[True], packets_server=npk[False],
        bytes_client=nbytes[True], bytes_server=nbytes[False],
        retransmissions_client=retrans[True], retransmissions_server=retrans[False],
        ttfb_ms=round(ttfb, 3) if ttfb is not None else None, first_request_line=req_line,
        http_status=status, server_header=server_hdr, tls_sni=sni, tls_server_hello=sh,
        ja4s=sh.ja4s if sh else None, closed_by=closed)


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
