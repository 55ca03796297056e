"""What tshark and p0f 3.09b say about a capture, for comparing `probe tcp --read` against them."""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


def _addr(a: str) -> str:
    try:
        ip = ipaddress.ip_address(a)
    except ValueError:
        return a
    return f"[{ip.compressed}]" if ip.version == 6 else ip.compressed


def stream_key(a: str, b: str) -> tuple[str, str]:
    """Order-free key of a connection from two 'addr:port' strings (IPv6 in brackets)."""
    return tuple(sorted((a, b)))  # type: ignore[return-value]


def endpoint(addr: str, port: str | int) -> str:
    return f"{_addr(addr)}:{port}"


@dataclass
class TsharkStream:
    synack_ttl: int | None = None
    synack_window: int | None = None
    synack_mss: int | None = None
    synack_wscale: int | None = None
    initial_rtt_ms: float | None = None
    retransmissions: int = 0
    out_of_order: int = 0


@dataclass
class TsharkView:
    streams: dict[tuple[str, str], TsharkStream] = field(default_factory=dict)


def tshark_available() -> bool:
    return shutil.which("tshark") is not None


def _fields(path: Path, display_filter: str, *fields: str, decode_as: tuple[str, ...] = ()) -> list[list[str]]:
    cmd = ["tshark", "-n", "-r", str(path), "-Y", display_filter, "-T", "fields", "-E", "separator=|"]
    for rule in decode_as:  # e.g. "mpls.label==19,pwethcw": what tshark cannot guess by itself
        cmd += ["-d", rule]
    for f in ("ip.src", "ipv6.src", "tcp.srcport", "ip.dst", "ipv6.dst", "tcp.dstport", *fields):
        cmd += ["-e", f]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False).stdout
    return [line.split("|") for line in out.splitlines() if line.strip()]


def _key(row: list[str]) -> tuple[str, str]:
    # tunnels (MPLS-in-GRE, 6in4) list several addresses; the innermost is the last
    src = (row[0] or row[1]).split(",")[-1]
    dst = (row[3] or row[4]).split(",")[-1]
    return stream_key(endpoint(src, row[2].split(",")[-1]), endpoint(dst, row[5].split(",")[-1]))


def tshark_view(path: Path, decode_as: tuple[str, ...] = ()) -> TsharkView:
    """One tshark pass over every TCP packet: SYN/ACK fields, initial RTT, retransmissions, out-of-order."""
    view = TsharkView()
    rows = _fields(path, "tcp", "tcp.flags", "ip.ttl", "ipv6.hlim", "tcp.window_size_value", "tcp.options.mss_val",
                   "tcp.options.wscale.shift", "tcp.analysis.initial_rtt", "tcp.analysis.retransmission",
                   "tcp.analysis.out_of_order", decode_as=decode_as)
    for row in rows:
        st = view.streams.setdefault(_key(row), TsharkStream())
        flags = int(row[6].split(",")[-1], 16)
        if flags & 0x12 == 0x12 and st.synack_ttl is None:
            ttl = (row[7] or row[8]).split(",")[-1]
            st.synack_ttl = int(ttl) if ttl else None
            st.synack_window = int(row[9]) if row[9] else None
            st.synack_mss = int(row[10]) if row[10] else None
            st.synack_wscale = int(row[11]) if row[11] else None
        if row[12] and st.initial_rtt_ms is None:
            st.initial_rtt_ms = float(row[12]) * 1e3
        st.retransmissions += bool(row[13])
        st.out_of_order += bool(row[14])
    return view


def p0f_available() -> bool:
    return shutil.which("p0f") is not None or Path("/usr/sbin/p0f").exists()


_P0F_LINE = re.compile(r"mod=(syn|syn\+ack)\|cli=([^|]*)/(\d+)\|srv=([^|]*)/(\d+)\|.*raw_sig=(.*)$")


def p0f_signatures(path: Path) -> list[tuple[str, str, str, str]]:
    """[(mod 'syn'|'syn+ack', client 'addr:port', server 'addr:port', raw_sig)] as p0f -r logs them."""
    binary = shutil.which("p0f") or "/usr/sbin/p0f"
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "p0f.log"
        subprocess.run([binary, "-r", str(path), "-o", str(log)], capture_output=True, timeout=60, check=False)
        text = log.read_text() if log.exists() else ""
    out = []
    for line in text.splitlines():
        m = _P0F_LINE.search(line)
        if m:
            out.append((m[1], endpoint(m[2], m[3]), endpoint(m[4], m[5]), m[6]))
    return out
