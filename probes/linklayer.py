"""From a captured frame to its IP header: link types and the encapsulations in between.

Link types: Ethernet (1), BSD loopback NULL (0, address family in the capturing host's
byte order) and LOOP (108, network order), raw IP (101, 12, 14, 228, 229), Linux cooked
SLL (113) and SLL2 (276), PPP (9, 50) and NFLOG (239). Between link and IP: 802.1Q / 802.1ad
VLAN tags (any depth), PPPoE sessions and MPLS label stacks (unicast and multicast; after
the bottom label the IP version nibble, or an Ethernet pseudowire behind a zero control word).

IPv6 in a NULL/LOOP header carries a different address family on each BSD: 24 (NetBSD,
OpenBSD, BSD/OS), 28 (FreeBSD, DragonFly) and 30 (macOS/Darwin); all three are IPv6.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

AF_INET = 2
AF_INET6 = (24, 28, 30, 10)       # BSDs and macOS; 10 is Linux's, seen in some converted files
ETH_IPV4, ETH_IPV6, ETH_MPLS, ETH_MPLS_MC, ETH_PPPOE = 0x0800, 0x86DD, 0x8847, 0x8848, 0x8864
ETH_VLAN = (0x8100, 0x88A8, 0x9100, 0x9200)
PPP_IPV4, PPP_IPV6, PPP_MPLS = 0x0021, 0x0057, 0x0281
RAW_IP = (101, 12, 14)
MAX_DEPTH = 16


@dataclass(frozen=True)
class Decoded:
    ip: bytes | None                 # from the first byte of the IPv4/IPv6 header; None when there is none
    vlan_tags: int = 0
    mpls_labels: tuple[int, ...] = ()
    skipped: str | None = None       # why there is no IP (unsupported link type, ARP, ...)


def decode(linktype: int, frame: bytes) -> Decoded:
    try:
        return _decode(linktype, frame)
    except (struct.error, IndexError):
        return Decoded(None, skipped="frame too short for its link header")


def _decode(linktype: int, frame: bytes) -> Decoded:
    if linktype == 1:
        return _ether(frame, 0, 0, ())
    if linktype in (0, 108):
        af = struct.unpack(">I", frame[:4])[0] if linktype == 108 else struct.unpack("<I", frame[:4])[0]
        if linktype == 0 and af > 0xFFFF:  # written by a big-endian host
            af = struct.unpack(">I", frame[:4])[0]
        if af == AF_INET or af in AF_INET6:
            return _ip(frame[4:], 0, ())
        return Decoded(None, skipped=f"loopback address family {af}")
    if linktype in RAW_IP:
        return _ip(frame, 0, ())
    if linktype == 228:
        return _ip(frame, 0, ())
    if linktype == 229:
        return _ip(frame, 0, ())
    if linktype == 113:
        return _ethertype(struct.unpack(">H", frame[14:16])[0], frame, 16, 0, ())
    if linktype == 276:
        return _ethertype(struct.unpack(">H", frame[0:2])[0], frame, 20, 0, ())
    if linktype in (9, 50):
        off = 2 if frame[:2] == b"\xff\x03" else 0
        return _ppp(struct.unpack(">H", frame[off:off + 2])[0], frame, off + 2, 0, ())
    if linktype == 239:
        return _nflog(frame)
    return Decoded(None, skipped=f"link type {linktype} is not decoded")


def _ether(frame: bytes, off: int, vlans: int, labels: tuple[int, ...]) -> Decoded:
    return _ethertype(struct.unpack(">H", frame[off + 12:off + 14])[0], frame, off + 14, vlans, labels)


def _ethertype(etype: int, frame: bytes, off: int, vlans: int, labels: tuple[int, ...]) -> Decoded:
    for _ in range(MAX_DEPTH):
        if etype in ETH_VLAN:
            vlans += 1
            etype = struct.unpack(">H", frame[off + 2:off + 4])[0]
            off += 4
            continue
        break
    if etype in (ETH_IPV4, ETH_IPV6):
        return _ip(frame[off:], vlans, labels)
    if etype in (ETH_MPLS, ETH_MPLS_MC):
        return _mpls(frame, off, vlans, labels)
    if etype == ETH_PPPOE:
        return _ppp(struct.unpack(">H", frame[off + 6:off + 8])[0], frame, off + 8, vlans, labels)
    return Decoded(None, vlans, labels, skipped=f"ethertype 0x{etype:04x}")


def _ppp(proto: int, frame: bytes, off: int, vlans: int, labels: tuple[int, ...]) -> Decoded:
    if proto in (PPP_IPV4, PPP_IPV6):
        return _ip(frame[off:], vlans, labels)
    if proto == PPP_MPLS:
        return _mpls(frame, off, vlans, labels)
    return Decoded(None, vlans, labels, skipped=f"PPP protocol 0x{proto:04x}")


def _mpls(frame: bytes, off: int, vlans: int, labels: tuple[int, ...]) -> Decoded:
    stack = list(labels)
    for _ in range(MAX_DEPTH):
        entry = struct.unpack(">I", frame[off:off + 4])[0]
        stack.append(entry >> 12)
        off += 4
        if entry & 0x100:  # bottom of stack
            break
    else:
        return Decoded(None, vlans, tuple(stack), skipped="MPLS label stack deeper than 16")
    nibble = frame[off] >> 4
    if nibble in (4, 6):
        return _ip(frame[off:], vlans, tuple(stack))
    if nibble == 0:  # pseudowire control word, then an Ethernet frame (RFC 4448)
        return _ether(frame, off + 4, vlans, tuple(stack))
    return Decoded(None, vlans, tuple(stack), skipped="MPLS payload is neither IP nor an Ethernet pseudowire")


def _nflog(frame: bytes) -> Decoded:
    off = 4
    while off + 4 <= len(frame):
        tlv_len, tlv_type = struct.unpack("<HH", frame[off:off + 4])
        if tlv_len < 4:
            break
        if tlv_type == 9:  # NFULA_PAYLOAD: the IP packet
            return _ip(frame[off + 4:off + tlv_len], 0, ())
        off += tlv_len + (-tlv_len % 4)
    return Decoded(None, skipped="NFLOG record without a payload")


def _ip(data: bytes, vlans: int, labels: tuple[int, ...]) -> Decoded:
    if not data or data[0] >> 4 not in (4, 6):
        return Decoded(None, vlans, labels, skipped="not IPv4 or IPv6")
    return Decoded(data, vlans, labels)
