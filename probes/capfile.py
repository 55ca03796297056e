"""Read pcap and pcapng files record by record, checking every length against the file.

Each record keeps its number (1-based, as tshark counts frames), its byte offset in the
file, its timestamp, its link type and its captured bytes. A record header or block
that runs past the end of the file is a truncated capture: `read_records` raises
UsageError naming the record and the byte offset, unless `allow_truncated` is set,
in which case the complete records are returned and `Truncation` says where it stopped.

Formats: pcap (microsecond a1b2c3d4 and nanosecond a1b23c4d magic, either byte order,
the 24-byte-record "modified" pcap a1b2cd34) and pcapng (SHB/IDB/EPB/SPB/OPB, per-interface
link type and if_tsresol/if_tsoffset; other blocks are skipped).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

from zgtool.errors import UsageError

PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1e-6, 16), b"\xa1\xb2\xc3\xd4": (">", 1e-6, 16),
    b"\x4d\x3c\xb2\xa1": ("<", 1e-9, 16), b"\xa1\xb2\x3c\x4d": (">", 1e-9, 16),
    b"\x34\xcd\xb2\xa1": ("<", 1e-6, 24), b"\xa1\xb2\xcd\x34": (">", 1e-6, 24),
}
PCAPNG_SHB = 0x0A0D0D0A
MAX_RECORD_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Record:
    number: int          # 1-based frame number
    offset: int          # byte offset of the record (header) in the file
    time_s: float        # epoch seconds
    linktype: int        # LINKTYPE_* value
    data: bytes          # captured bytes
    orig_len: int        # length on the wire


@dataclass(frozen=True)
class Truncation:
    record: int          # number the incomplete record would have had
    offset: int          # where it starts
    needed: int          # bytes its header says it has (or the header size)
    available: int       # bytes left in the file from `offset`

    def describe(self, complete: int) -> str:
        return (f"truncated: record {self.record} at byte offset {self.offset} needs {self.needed} bytes "
                f"but the file ends after {self.available}; {complete} complete record(s) before it")


@dataclass
class CaptureFile:
    path: str
    format: str                                  # "pcap" | "pcapng"
    records: list[Record] = field(default_factory=list)
    truncation: Truncation | None = None


def read_records(path: str | Path, *, allow_truncated: bool = False) -> CaptureFile:
    p = Path(path)
    if not p.is_file():
        raise UsageError(f"capture file not found: {p}")
    buf = p.read_bytes()
    if len(buf) < 4:
        raise UsageError(f"{p} is not a pcap or pcapng capture (only {len(buf)} bytes)")
    if buf[:4] in PCAP_MAGICS:
        cap = _read_pcap(buf, str(p))
    elif struct.unpack("<I", buf[:4])[0] == PCAPNG_SHB:
        cap = _read_pcapng(buf, str(p))
    else:
        raise UsageError(f"{p} is not a pcap or pcapng capture (first bytes {buf[:4].hex()})")
    if cap.truncation is not None and not allow_truncated:
        raise UsageError(f"{p} is {cap.truncation.describe(len(cap.records))} "
                         "(pass --allow-truncated to analyse the complete records)")
    return cap


def _read_pcap(buf: bytes, name: str) -> CaptureFile:
    order, unit, rec_hdr = PCAP_MAGICS[buf[:4]]
    cap = CaptureFile(name, "pcap")
    if len(buf) < 24:
        cap.truncation = Truncation(1, 0, 24, len(buf))
        return cap
    linktype = struct.unpack(order + "I", buf[20:24])[0] & 0x0FFFFFFF
    off, n = 24, 0
    while off < len(buf):
        n += 1
        if off + rec_hdr > len(buf):
            cap.truncation = Truncation(n, off, rec_hdr, len(buf) - off)
            return cap
        sec, frac, incl, orig = struct.unpack(order + "IIII", buf[off:off + 16])
        if incl > MAX_RECORD_BYTES:
            raise UsageError(f"{name} is corrupt: record {n} at byte offset {off} claims {incl} bytes")
        start = off + rec_hdr
        if start + incl > len(buf):
            cap.truncation = Truncation(n, off, rec_hdr + incl, len(buf) - off)
            return cap
        cap.records.append(Record(n, off, sec + frac * unit, linktype, buf[start:start + incl], orig))
        off = start + incl
    return cap


@dataclass
class _Iface:
    linktype: int
    snaplen: int
    unit: float = 1e-6
    offset_s: int = 0


def _read_pcapng(buf: bytes, name: str) -> CaptureFile:
    cap = CaptureFile(name, "pcapng")
    off, n = 0, 0
    order = "<"
    ifaces: list[_Iface] = []
    while off < len(buf):
        if off + 12 > len(buf):
            cap.truncation = Truncation(n + 1, off, 12, len(buf) - off)
            return cap
        btype = struct.unpack(order + "I", buf[off:off + 4])[0]
        if btype == PCAPNG_SHB:
            bom = buf[off + 8:off + 12]
            order = "<" if bom == b"\x4d\x3c\x2b\x1a" else ">" if bom == b"\x1a\x2b\x3c\x4d" else ""
            if not order:
                raise UsageError(f"{name} is corrupt: section header at byte offset {off} has no byte-order magic")
            ifaces = []
        blen = struct.unpack(order + "I", buf[off + 4:off + 8])[0]
        if blen < 12 or blen % 4:
            raise UsageError(f"{name} is corrupt: block at byte offset {off} has length {blen}")
        if off + blen > len(buf):
            cap.truncation = Truncation(n + 1, off, blen, len(buf) - off)
            return cap
        body = buf[off + 8:off + blen - 4]
        if btype == 1 and len(body) >= 8:
            linktype, _, snaplen = struct.unpack(order + "HHI", body[:8])
            ifaces.append(_iface_options(_Iface(linktype, snaplen), body[8:], order))
        elif btype in (2, 6) and len(body) >= 20:
            if btype == 6:
                iface_id, hi, lo, incl, orig = struct.unpack(order + "IIIII", body[:20])
            else:
                iface_id, _drops, hi, lo, incl, orig = struct.unpack(order + "HHIIII", body[:20])
            n += 1
            if iface_id >= len(ifaces):
                raise UsageError(f"{name} is corrupt: record {n} at byte offset {off} names interface {iface_id}")
            if 20 + incl > len(body):
                raise UsageError(f"{name} is corrupt: record {n} at byte offset {off} claims {incl} captured bytes "
                                 f"in a {blen}-byte block")
            ifc = ifaces[iface_id]
            ts = ((hi << 32) | lo) * ifc.unit + ifc.offset_s
            cap.records.append(Record(n, off, ts, ifc.linktype, body[20:20 + incl], orig))
        elif btype == 3 and len(body) >= 4:
            n += 1
            if not ifaces:
                raise UsageError(f"{name} is corrupt: record {n} at byte offset {off} before any interface block")
            orig = struct.unpack(order + "I", body[:4])[0]
            ifc = ifaces[0]
            incl = min(orig, ifc.snaplen or orig, len(body) - 4)
            cap.records.append(Record(n, off, 0.0, ifc.linktype, body[4:4 + incl], orig))
        off += blen
    return cap


def _iface_options(ifc: _Iface, opts: bytes, order: str) -> _Iface:
    i = 0
    while i + 4 <= len(opts):
        code, length = struct.unpack(order + "HH", opts[i:i + 4])
        val = opts[i + 4:i + 4 + length]
        if code == 0:
            break
        if code == 9 and length >= 1:  # if_tsresol: 2^-n when the top bit is set, else 10^-n
            r = val[0]
            ifc.unit = 2.0 ** -(r & 0x7F) if r & 0x80 else 10.0 ** -r
        elif code == 14 and length >= 8:  # if_tsoffset, seconds
            ifc.offset_s = struct.unpack(order + "q", val[:8])[0]
        i += 4 + length + (-length % 4)
    return ifc
