"""From a frame scapy dissected to its IP header: the link types and encapsulations scapy does not bind.

scapy dissects Ethernet (1), BSD loopback NULL (0) and LOOP (108), raw IP (101, 12, 228, 229), Linux
cooked SLL (113) and SLL2 (276), PPP (9) and PPP in HDLC framing (50), 802.1Q / 802.1ad VLAN tags, PPPoE
sessions and MPLS label stacks (scapy.contrib.mpls, with the Ethernet pseudowire behind a zero control
word). `load()` adds what it lacks, for dissection only (bind_bottom_up: nothing scapy builds changes):
- IPv6 in a NULL/LOOP header carries a different address family on each BSD: 24 (NetBSD, OpenBSD,
  BSD/OS), 28 (FreeBSD, DragonFly) and 30 (macOS/Darwin); scapy binds only the capturing OS's own. A NULL
  header is in the capturing host's byte order, which scapy's Loopback cannot tell: NullLoopback reads both.
- raw IP as link type 14 (OpenBSD's DLT_RAW), NFLOG (239), MPLS multicast (0x8848) and MPLS over PPP
  (0x0281), and the 0x9100 / 0x9200 VLAN tag types some switches use for QinQ.
`find_ip(pkt)` then walks the dissected layers to the first IPv4/IPv6 header, counting the VLAN tags and
MPLS labels on the way, or says why there is none.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from scapy.fields import ByteField, LEIntField, ShortField, StrField
from scapy.packet import Packet, Raw, bind_bottom_up

AF_INET = 2
AF_INET6 = (24, 28, 30, 10)       # BSDs and macOS; 10 is Linux's, seen in some converted files
NFULA_PAYLOAD = 9
_loaded = False


class NullLoopback(Packet):
    """DLT_NULL (0): the address family in the capturing host's byte order, either order here (scapy's
    Loopback reads only a little-endian host's and keeps one byte of it)."""

    name = "Loopback"
    fields_desc = [LEIntField("family", AF_INET)]

    def guess_payload_class(self, payload: bytes) -> Any:
        from scapy.layers.inet import IP
        from scapy.layers.inet6 import IPv6

        af = self.family if self.family <= 0xFFFF else struct.unpack("<I", struct.pack(">I", self.family))[0]
        return IP if af == AF_INET else IPv6 if af in AF_INET6 else Raw


class NFLOG(Packet):
    """DLT_NFLOG (239): family, version, resource id, then TLVs in the capturing host's byte order (each
    padded to 4 bytes); the packet itself is the NFULA_PAYLOAD TLV. The TLVs before it stay bytes."""

    name = "NFLOG"
    fields_desc = [ByteField("family", AF_INET), ByteField("version", 0), ShortField("resource_id", 0),
                   StrField("tlvs", b"")]

    def do_dissect(self, s: bytes) -> bytes:
        start, end = _nflog_payload(s)
        rest: bytes = super().do_dissect(s[:start])
        return rest + s[start:end]

    def guess_payload_class(self, payload: bytes) -> Any:
        from scapy.layers.inet6 import IPv46

        return IPv46 if payload else Raw


def _nflog_payload(s: bytes) -> tuple[int, int]:
    """(start, end) of the NFULA_PAYLOAD value; (len, len) when there is none."""
    off = 4
    while off + 4 <= len(s):
        tlv_len, tlv_type = struct.unpack("<HH", s[off:off + 4])
        if tlv_len < 4:
            break
        if tlv_type == NFULA_PAYLOAD:
            return off + 4, min(off + tlv_len, len(s))
        off += tlv_len + (-tlv_len % 4)
    return len(s), len(s)


def load() -> None:
    """Register scapy's link, IP and TCP dissectors and the bindings above (once)."""
    global _loaded
    if _loaded:
        return
    import scapy.layers.inet  # noqa: F401
    import scapy.layers.inet6  # noqa: F401
    import scapy.layers.l2  # noqa: F401
    import scapy.layers.ppp  # noqa: F401
    from scapy.config import conf
    from scapy.contrib.mpls import MPLS
    from scapy.layers.inet6 import IPv6, IPv46
    from scapy.layers.l2 import Dot1AD, Dot1Q, Ether, LoopbackOpenBSD
    from scapy.layers.ppp import PPP

    for af in AF_INET6:
        bind_bottom_up(LoopbackOpenBSD, IPv6, type=af)
    for outer in (Ether, Dot1Q, Dot1AD):
        bind_bottom_up(outer, MPLS, type=0x8848)
        for tpid in (0x9100, 0x9200):
            bind_bottom_up(outer, Dot1AD, type=tpid)
    bind_bottom_up(PPP, MPLS, proto=0x0281)
    conf.l2types.register_num2layer(0, NullLoopback)
    conf.l2types.register_num2layer(14, IPv46)
    conf.l2types.register_num2layer(239, NFLOG)
    _loaded = True


@dataclass(frozen=True)
class Found:
    ip: Any                          # the IP or IPv6 layer; None when there is none
    vlan_tags: int = 0
    mpls_labels: tuple[int, ...] = ()
    skipped: str | None = None       # why there is no IP ("ARP", "link type 147 is not decoded", ...)


def find_ip(pkt: Any) -> Found:
    from scapy.contrib.mpls import MPLS
    from scapy.layers.inet import IP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Dot1AD, Dot1Q

    vlans, labels = 0, list[int]()
    layer, last = pkt, None
    while layer is not None and not isinstance(layer, Raw) and layer.name != "Padding" and layer.name != "NoPayload":
        if isinstance(layer, IP | IPv6):
            return Found(layer, vlans, tuple(labels))
        if isinstance(layer, Dot1Q | Dot1AD):
            vlans += 1
        elif isinstance(layer, MPLS):
            labels.append(int(layer.label))
        last = layer
        layer = layer.payload if layer.payload else None
    if last is None:
        from scapy.config import conf

        lt = getattr(pkt, "linktype", None)
        why = ("malformed frame" if getattr(pkt, "undecodable", False) or lt in conf.l2types.num2layer
               else f"link type {lt} is not decoded")
        return Found(None, skipped=why)
    etype = getattr(last, "type", None) if last.name in ("Ethernet", "802.1Q", "802.1AD") else None
    why = f"ethertype 0x{etype:04x}" if isinstance(etype, int) else f"{last.name} (no IP inside)"
    return Found(None, vlans, tuple(labels), skipped=why)
