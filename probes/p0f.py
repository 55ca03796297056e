"""p0f 3.09b `raw_sig` of a SYN or SYN/ACK, computed from the IP packet's bytes as p0f does.

    ver:ttl+dist:olen:mss:wsize,scale:olayout:quirks:pclass

Semantics follow p0f 3.09b (process.c parse_packet, fp_tcp.c dump_sig/detect_win_multi):
  * ttl+dist: the observed TTL (hop limit) and the distance to the next initial TTL of
    32/64/128/255 (`ttl+?` beyond 35 hops);
  * olen: IPv4 option bytes (0 for IPv6);
  * mss and scale: the option values, 0 when the option is absent (p0f writes 0, never `*`;
    `*` only for MSS 1331 echoed in a SYN/ACK, p0f-sendsyn's probe value);
  * wsize: `mss*N` / `mtu*N` when the window is a multiple of the MSS (or MSS-12 with
    timestamps, 1460/1448/1440/1428, MSS+40, MSS+headers, MSS+60 on IPv6, 1500, and on a
    SYN/ACK the SYN's MSS and MSS-12), else the raw value;
  * olayout: option kinds in order; `eol+N` with N bytes of padding after the EOL, `?K`
    for unknown kinds;
  * quirks, in p0f's order: df id+ id- ecn 0+ flow seq- ack+ ack- uptr+ urgf+ pushf+ ts1-
    ts2+ opt+ exws bad (`flow`: IPv6 flow label non-zero);
  * pclass: `+` with payload, else `0`.
Packets p0f would not fingerprint (fragments, non-TCP, bad header lengths) give None.
"""

from __future__ import annotations

import struct

MAX_DIST = 35
SPECIAL_MSS = 1331
MIN_TCP4, MIN_TCP6 = 40, 60
QUIRK_ORDER = ("df", "id+", "id-", "ecn", "0+", "flow", "seq-", "ack+", "ack-", "uptr+", "urgf+", "pushf+",
               "ts1-", "ts2+", "opt+", "exws", "bad")
OPT_NAMES = {0: "eol", 1: "nop", 2: "mss", 3: "ws", 4: "sok", 5: "sack", 8: "ts"}


def guess_dist(ttl: int) -> int:
    for initial in (32, 64, 128):
        if ttl <= initial:
            return initial - ttl
    return 255 - ttl


def raw_sig(ip: bytes, syn_mss: int = 0) -> str | None:
    """p0f's raw_sig of one SYN or SYN/ACK; `syn_mss` is the MSS of the SYN a SYN/ACK answers."""
    parsed = _parse(ip)
    if parsed is None:
        return None
    ver, ttl, olen, quirks, tot_hdr, tcp = parsed
    return _tcp_sig(ver, ttl, olen, quirks, tot_hdr, tcp, syn_mss)


def _parse(ip: bytes) -> tuple[int, int, int, set[str], int, bytes] | None:
    if len(ip) < 20:
        return None
    ver = ip[0] >> 4
    quirks: set[str] = set()
    if ver == 4:
        hdr_len = (ip[0] & 0x0F) * 4
        tot_len = struct.unpack(">H", ip[2:4])[0]
        data = ip[:tot_len] if len(ip) > tot_len else ip
        if len(data) < MIN_TCP4 or hdr_len < 20 or tot_len > len(data) or hdr_len + 20 > len(data):
            return None
        if ip[9] != 6:
            return None
        flags_off = struct.unpack(">H", ip[6:8])[0]
        if flags_off & ~(0x4000 | 0x8000):  # MF or a fragment offset
            return None
        ip_id = struct.unpack(">H", ip[4:6])[0]
        if ip[1] & 0x03:
            quirks.add("ecn")
        if flags_off & 0x8000:
            quirks.add("0+")
        if flags_off & 0x4000:
            quirks.update(["df", "id+"] if ip_id else ["df"])
        elif not ip_id:
            quirks.add("id-")
        return ver, ip[8], hdr_len - 20, quirks, hdr_len, data[hdr_len:]
    if ver == 6:
        if len(ip) < MIN_TCP6:
            return None
        ver_tos = struct.unpack(">I", ip[:4])[0]
        tot_len = struct.unpack(">H", ip[4:6])[0] + 40
        data = ip[:tot_len] if len(ip) > tot_len else ip
        if len(data) < MIN_TCP6 or tot_len > len(data) or ip[6] != 6:
            return None
        if (ver_tos >> 20) & 0x03:
            quirks.add("ecn")
        if ver_tos & 0xFFFFF:
            quirks.add("flow")
        return ver, ip[7], 0, quirks, 40, data[40:]
    return None


def _tcp_sig(ver: int, ttl: int, olen: int, quirks: set[str], tot_hdr: int, tcp: bytes, syn_mss: int) -> str | None:
    doff = (tcp[12] >> 4) * 4
    if doff < 20 or doff > len(tcp):
        return None
    flags = tcp[13]
    syn, ack_f, rst, fin = flags & 0x02, flags & 0x10, flags & 0x04, flags & 0x01
    if (syn and (fin or rst)) or (fin and rst) or not (flags & 0x17):
        return None
    win = struct.unpack(">H", tcp[14:16])[0]
    seq = struct.unpack(">I", tcp[4:8])[0]
    ack_raw = tcp[8:12]
    if (flags & 0xC0) or (tcp[12] & 0x01):  # ECE/CWR or NS
        quirks.add("ecn")
    if not seq:
        quirks.add("seq-")
    if ack_f:
        if ack_raw == b"\0\0\0\0":
            quirks.add("ack-")
    # p0f 3.09b tests `RD32(ack) & !(flags & RST)`: a bitwise AND with 0/1, so on the
    # little-endian hosts it runs on only the low bit of the first ack byte counts. Kept as is.
    elif (ack_raw[0] & 1) and not rst:
        quirks.add("ack+")
    if flags & 0x20:
        quirks.add("urgf+")
    elif struct.unpack(">H", tcp[18:20])[0]:
        quirks.add("uptr+")
    if flags & 0x08:
        quirks.add("pushf+")
    layout, mss, wscale, ts1, eol_pad, oq = _options(tcp[20:doff], syn=bool(syn and not ack_f))
    quirks.update(oq)
    pay = len(tcp) - doff
    all_quirks = [q for q in QUIRK_ORDER if q in quirks]
    dist = guess_dist(ttl)
    head = f"{ver}:{ttl}+{dist if dist <= MAX_DIST else '?'}:{olen}:"
    mss_txt = "*" if mss == SPECIAL_MSS and syn and ack_f else str(mss)
    multi = _win_multi(win, mss, ts1, ver, tot_hdr + doff, syn_mss)
    wsize = f"{multi[1]}*{multi[0]}" if multi else str(win)
    opts = ",".join(f"eol+{eol_pad}" if k == 0 else OPT_NAMES.get(k, f"?{k}") for k in layout)
    return f"{head}{mss_txt}:{wsize},{wscale}:{opts}:{','.join(all_quirks)}:{'+' if pay else '0'}"


def _options(opts: bytes, *, syn: bool) -> tuple[list[int], int, int, int, int, list[str]]:
    """(layout, mss, wscale, ts1, eol padding, option quirks in p0f's order)."""
    layout: list[int] = []
    mss = wscale = ts1 = eol_pad = 0
    ts1_zero = ts2_nz = eol_nz = exws = bad = False
    i, end = 0, len(opts)
    aborted = False
    while i < end and len(layout) < 24:
        kind = opts[i]
        layout.append(kind)
        i += 1
        if kind == 0:
            eol_pad = end - i
            rest = opts[i:]
            if any(rest):
                eol_nz = True
            i = end
        elif kind == 1:
            continue
        elif kind == 2:
            if i + 3 > end:
                aborted = True
                break
            bad |= opts[i] != 4
            mss = struct.unpack(">H", opts[i + 1:i + 3])[0]
            i += 3
        elif kind == 3:
            if i + 2 > end:
                aborted = True
                break
            bad |= opts[i] != 3
            wscale = opts[i + 1]
            exws |= wscale > 14
            i += 2
        elif kind == 4:
            if i + 1 > end:
                aborted = True
                break
            bad |= opts[i] != 2
            i += 1
        elif kind == 5:
            if i == end or not 10 <= opts[i] <= 34 or i - 1 + opts[i] > end:
                aborted = True
                break
            i += opts[i] - 1
        elif kind == 8:
            if i + 9 > end:
                aborted = True
                break
            bad |= opts[i] != 10
            ts1 = struct.unpack(">I", opts[i + 1:i + 5])[0]
            ts1_zero |= not ts1
            ts2_nz |= syn and opts[i + 5:i + 9] != b"\0\0\0\0"
            i += 9
        else:
            if i == end or not 2 <= opts[i] <= 40 or i - 1 + opts[i] > end:
                aborted = True
                break
            i += opts[i] - 1
    if aborted or i != end:
        bad = True
    q = [name for name, on in (("ts1-", ts1_zero), ("ts2+", ts2_nz), ("opt+", eol_nz), ("exws", exws),
                               ("bad", bad)) if on]
    return layout, mss, wscale, ts1, eol_pad, q


def _win_multi(win: int, mss: int, ts1: int, ver: int, tot_hdr: int, syn_mss: int) -> tuple[int, str] | None:
    """(N, "mss"|"mtu") when the window is N times one of p0f's candidates, in p0f's order."""
    if not win or mss < 100:
        return None
    cands: list[tuple[int, str]] = [(mss, "mss")]
    if ts1:
        cands.append((mss - 12, "mss"))
    cands += [(1500 - MIN_TCP4, "mss"), (1500 - MIN_TCP4 - 12, "mss")]
    if ver == 6:
        cands += [(1500 - MIN_TCP6, "mss"), (1500 - MIN_TCP6 - 12, "mss")]
    cands += [(mss + MIN_TCP4, "mtu"), (mss + tot_hdr, "mtu")]
    if ver == 6:
        cands.append((mss + MIN_TCP6, "mtu"))
    cands.append((1500, "mtu"))
    if syn_mss:
        cands += [(syn_mss, "mss"), (syn_mss - 12, "mss")]
    for div, kind in cands:
        if div > 0 and win % div == 0:
            return win // div, kind
    return None
