"""`probe tcp`: capture one real connection and its first request with scapy, then analyse it.

The local socket is bound before the SYN so the BPF filter names this one flow exactly.
Without capture privilege (root or CAP_NET_RAW) the probe falls back to connect timing
plus the kernel's TCP_INFO RTT and says so (MissingCapability only with require_capture).

Data of a live `probe tcp` (kind "probe.tcp", mode "live"):
    mode, url, host, ip, port, local_port, iface, tls, captured, capture_note,
    connect_ms (socket connect()), tcp_info_rtt_ms, tcp_info_rttvar_ms (kernel smoothed RTT),
    ttfb_ms (request sent -> first response byte, from the socket), http_status, server_header,
    stream (pcap.TcpStream of this flow, or None without capture), pcap (file written) | None,
    packets_captured, notes [str]
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zgtool.errors import MissingCapability, TargetUnreachable
from zgtool.probes.http1 import Http1Connection
from zgtool.probes.pcap import TcpStream, analyse_packets, dedupe, load_layers
from zgtool.probes.request import build
from zgtool.targets import Target

CAPTURE_START_TIMEOUT_S = 5.0
TRAILING_PACKETS_S = 0.05     # let the FIN/ACK exchange land in the capture
# Opening the capture socket (SO_TIMESTAMPNS) switches on kernel RX timestamps through deferred
# work; packets that arrive before it has run are stamped when scapy reads them, which
# inflates SYN -> SYN/ACK by the sniffer's wake-up time. A short settle avoids that.
TIMESTAMP_SETTLE_S = 0.05
TCP_INFO_RTT_OFFSET = 68      # struct tcp_info: 8 bytes of u8 fields, then u32s; tcpi_rtt is the 16th


@dataclass
class TcpResult:
    mode: str
    url: str
    host: str
    ip: str
    port: int
    local_port: int
    iface: str | None
    tls: bool
    captured: bool
    capture_note: str | None
    connect_ms: float | None
    tcp_info_rtt_ms: float | None
    tcp_info_rttvar_ms: float | None
    ttfb_ms: float | None
    http_status: int | None
    server_header: str | None
    stream: TcpStream | None
    pcap: str | None
    packets_captured: int
    notes: list[str] = field(default_factory=list)


def tcp_info_rtt(sock: socket.socket) -> tuple[float | None, float | None]:
    """(srtt, rttvar) in ms from Linux TCP_INFO; (None, None) where unavailable."""
    opt = getattr(socket, "TCP_INFO", None)
    if opt is None:
        return None, None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, opt, 104)
        rtt_us, rttvar_us = struct.unpack_from("II", raw, TCP_INFO_RTT_OFFSET)
    except (OSError, struct.error):
        return None, None
    return rtt_us / 1e3, rttvar_us / 1e3


def iface_for(ip: str) -> str | None:
    from scapy.config import conf

    try:
        if ":" in ip:
            return str(conf.route6.route(ip)[0])
        return str(conf.route.route(ip)[0])
    except Exception:  # routing table unreadable: let scapy pick its default
        return None


def start_capture(ip: str, port: int, local_port: int, iface: str | None) -> tuple[Any, str | None, str | None]:
    """(sniffer or None, iface, why-not). Never raises for missing privilege."""
    try:
        from scapy.sendrecv import AsyncSniffer

        load_layers()
    except ImportError as exc:
        return None, iface, f"capture unavailable: scapy cannot be imported ({exc})"
    iface = iface or iface_for(ip)
    bpf = f"tcp and host {ip} and port {port} and port {local_port}"
    started = threading.Event()
    sniffer = AsyncSniffer(iface=iface, filter=bpf, store=True, started_callback=started.set)
    try:
        sniffer.start()
    except Exception as exc:  # scapy raises PermissionError, OSError, Scapy_Exception, ImportError
        return None, iface, _why(exc)
    deadline = time.monotonic() + CAPTURE_START_TIMEOUT_S
    while not started.wait(0.02):
        thread = sniffer.thread
        if sniffer.exception is not None or (thread is not None and not thread.is_alive()):
            return None, iface, _why(sniffer.exception)
        if time.monotonic() > deadline:
            return None, iface, f"capture on {iface} did not start within {CAPTURE_START_TIMEOUT_S:g} s"
    time.sleep(TIMESTAMP_SETTLE_S)
    return sniffer, iface, None


def _why(exc: BaseException | None) -> str:
    text = f"{type(exc).__name__}: {exc}" if exc else "the capture thread stopped"
    if isinstance(exc, PermissionError) or "not permitted" in text:
        return f"capture not permitted ({text}): needs root or CAP_NET_RAW"
    if "libpcap" in text:
        return f"capture unavailable: libpcap is missing ({text})"
    return f"capture unavailable ({text})"


def stop_capture(sniffer: Any) -> list[Any]:
    try:
        return list(sniffer.stop() or [])
    except Exception:  # a sniffer that died mid-way still holds what it saw
        return list(sniffer.results or [])


def probe_tcp(target: Target, *, timeout_s: float = 10.0, pcap_out: Path | None = None,
              require_capture: bool = False, iface: str | None = None, insecure: bool = True,
              method: str | None = None, path: str | None = None) -> TcpResult:
    try:
        infos = socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise TargetUnreachable(f"cannot resolve {target.host!r}: {exc.strerror or exc}") from exc
    family, _, _, _, addr = infos[0]
    ip = str(addr[0])
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
    local_port = int(sock.getsockname()[1])
    sniffer, used_iface, why = start_capture(ip, target.port, local_port, iface)
    if sniffer is None and require_capture:
        sock.close()
        raise MissingCapability(why or "capture unavailable")
    notes: list[str] = []
    # TLS is probed without verification: this probe reports on the connection, it sends no key.
    conn = Http1Connection(host=target.host, port=target.port, tls=target.scheme == "https",
                           timeout_s=timeout_s, verify_tls=not insecure)
    req = build(target, stream=False, max_tokens=1, method=method, path=path)
    req_headers = [(k, v) for k, v in req.headers if k.lower() not in ("x-api-key", "authorization")]
    status = server_hdr = None
    rtt = rttvar = None
    try:
        conn.connect(pre_bound=sock)
        assert conn.sock is not None
        rtt, rttvar = tcp_info_rtt(conn.sock)
        conn.send_request(req.method, req.path, req_headers, req.body)
        head = conn.read_head()
        status, server_hdr = head.status, head.get("server")
        for _ in conn.iter_body(head, method=req.method):
            pass
    finally:
        conn.close()
        packets: list[Any] = []
        if sniffer is not None:
            time.sleep(TRAILING_PACKETS_S)
            packets = stop_capture(sniffer)
    t = conn.timings
    stream = None
    if sniffer is not None:
        if pcap_out is not None:
            from scapy.utils import wrpcap

            pcap_out.parent.mkdir(parents=True, exist_ok=True)
            wrpcap(str(pcap_out), dedupe(packets)[0])
        if packets:
            streams = analyse_packets(packets, source="live capture", mode="live").streams
            stream = next((s for s in streams if s.client.endswith(f":{local_port}")), None)
        if stream is None:
            notes.append(f"the capture on {used_iface} saw no packets of this connection")
    else:
        notes.append(f"{why}; fell back to connect() timing and the kernel's TCP_INFO RTT")
        if pcap_out is not None:
            notes.append(f"no capture, so {pcap_out} was not written")
    if stream is not None and stream.syn_synack_ms is not None and t.connected_s is not None:
        notes.append("SYN -> SYN/ACK is the wire RTT; connect() adds the local stack's work on both ends")
    if target.host in ("127.0.0.1", "localhost", "::1") or ip.startswith("127."):
        notes.append("loopback: TTL and options come from the one local kernel; they cannot separate a "
                     "local proxy from the origin (see probe headers)")
    return TcpResult(
        mode="live", url=target.url, host=target.host, ip=ip, port=target.port, local_port=local_port,
        iface=used_iface, tls=target.scheme == "https", captured=sniffer is not None, capture_note=why,
        connect_ms=_round(t.ms(t.start_s, t.connected_s)), tcp_info_rtt_ms=rtt, tcp_info_rttvar_ms=rttvar,
        ttfb_ms=_round(t.ms(t.request_out_s, t.first_byte_s)), http_status=status, server_header=server_hdr,
        stream=stream, pcap=str(pcap_out) if pcap_out is not None and sniffer is not None else None,
        packets_captured=len(packets), notes=notes)


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)
