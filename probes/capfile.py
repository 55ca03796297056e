"""Read pcap and pcapng files with scapy's streaming readers, checking every record against the file.

scapy's PcapReader and PcapNgReader read one record at a time (the file is never loaded whole, and a
gzip-compressed capture is read as it is) and dissect each frame from its link layer (linklayer.py
registers the link types and encapsulations scapy does not bind by itself). Where a record or block
runs past the end of the file, scapy stops quietly; the readers here note each record's number
(1-based, as tshark counts frames) and byte offset, and turn that stop into a `Truncation`: iterating
`CaptureReader` raises UsageError naming the record and the byte offset, unless `allow_truncated` is
set, in which case the complete records are read and `truncation` says where it stopped.

Formats: pcap (microsecond and nanosecond magic, either byte order) and pcapng (SHB/IDB/EPB/SPB/PB,
per-interface link type and if_tsresol; if_tsoffset is added here, scapy ignores it). The 1999
"modified" pcap (magic a1b2cd34, 24-byte record headers) is refused with the editcap line that converts it.
"""

from __future__ import annotations

import contextlib
import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scapy.config import conf
from scapy.error import Scapy_Exception
from scapy.utils import PcapNgReader, PcapReader, RawPcapNgReader, RawPcapReader

from zgtool.errors import UsageError

RECORD_MAX_BYTES = 4 * 0xFFFF      # scapy reads at most this much of one pcap record (and skips the rest)
MODIFIED_PCAP = (b"\x34\xcd\xb2\xa1", b"\xa1\xb2\xcd\x34")
PCAP_RECORD_HEADER = 16
PCAP_MAGICS = (b"\xd4\xc3\xb2\xa1", b"\xa1\xb2\xc3\xd4", b"\x4d\x3c\xb2\xa1", b"\xa1\xb2\x3c\x4d")


@dataclass(frozen=True)
class Truncation:
    record: int          # number the incomplete record would have had
    offset: int          # where it starts
    needed: int          # bytes its header says it has (or the header size)
    available: int       # bytes left in the file from `offset`

    def describe(self, complete: int) -> str:
        return (f"truncated: record {self.record} at byte offset {self.offset} needs {self.needed} bytes "
                f"but the file ends after {self.available}; {complete} complete record(s) before it")


class _Checked:
    """What both readers add to scapy's: record numbers, byte offsets, truncation, float timestamps."""

    f: Any
    records = 0
    truncation: Truncation | None = None
    name = ""

    def _dissect(self, linktype: int, data: bytes, time_s: float) -> Any:
        cls = conf.l2types.num2layer.get(linktype, conf.raw_layer)
        try:
            pkt = cls(data)
        except Exception:  # scapy raises struct.error, IndexError, ... on a mangled header: keep the bytes
            pkt = conf.raw_layer(data)
            pkt.undecodable = True
        pkt.time = time_s
        pkt.linktype = linktype
        pkt.number = self.records
        return pkt

    def _corrupt(self, what: str) -> UsageError:
        return UsageError(f"{self.name} is corrupt: {what}")


class _CheckedPcap(_Checked, PcapReader):
    def read_packet(self, size: int = RECORD_MAX_BYTES, **kwargs: Any) -> Any:
        off, number = self.f.tell(), self.records + 1
        try:
            data, meta = RawPcapReader._read_packet(self, RECORD_MAX_BYTES)
        except EOFError:  # the header cut short (or, in a gzip stream, anything cut short)
            got = self.f.tell() - off
            if got:
                self.truncation = Truncation(number, off, self._needed(off, got), got)
            raise
        got = self.f.tell() - off
        if got < PCAP_RECORD_HEADER + meta.caplen:
            self.truncation = Truncation(number, off, PCAP_RECORD_HEADER + meta.caplen, got)
            raise EOFError
        self.records = number
        return self._dissect(self.linktype, data, meta.sec + meta.usec * (1e-9 if self.nano else 1e-6))

    def _needed(self, off: int, got: int) -> int:
        """What the record at `off` needs: its header, plus its captured bytes once the header is there."""
        if got < PCAP_RECORD_HEADER:
            return PCAP_RECORD_HEADER
        self.f.seek(off)
        head = self.f.read(PCAP_RECORD_HEADER)
        return PCAP_RECORD_HEADER + struct.unpack(self.endian + "I", head[8:12])[0]


class _CheckedPcapNg(_Checked, PcapNgReader):
    alternative = _CheckedPcap      # scapy's metaclass tries this one when the file is not pcapng
    _iface = 0
    _block_offset = 0

    def read_packet(self, size: int = RECORD_MAX_BYTES, **kwargs: Any) -> Any:
        data, meta = RawPcapNgReader._read_packet(self, RECORD_MAX_BYTES)
        iface = self.interfaces[self._iface][2]
        t = 0.0 if meta.tshigh is None else ((meta.tshigh << 32) | meta.tslow) / meta.tsresol
        return self._dissect(meta.linktype, data, t + iface.get("tsoffset", 0))

    def _read_block(self, size: int = RECORD_MAX_BYTES) -> Any:
        off = self._block_offset = self.f.tell()
        try:
            res = super()._read_block(size)
        except EOFError:
            got = self.f.tell() - off
            if not got:
                raise
            if self.f.read(1):
                raise self._corrupt(f"block at byte offset {off} does not end where its length says") from None
            self.f.seek(off + 4)
            head = self.f.read(4)
            needed = struct.unpack(self.endian + "I", head)[0] if len(head) == 4 else 12
            self.truncation = Truncation(self.records + 1, off, needed, got)
            raise
        if res is not None:
            self.records += 1
        return res

    def _read_block_idb(self, block: bytes, size: int) -> None:
        super()._read_block_idb(block, size)
        tsoffset = self._read_options(block[8:]).get(14)
        if isinstance(tsoffset, bytes) and len(tsoffset) >= 8:  # if_tsoffset: seconds added to every timestamp
            self.interfaces[-1][2]["tsoffset"] = struct.unpack(self.endian + "q", tsoffset[:8])[0]

    def _read_block_epb(self, block: bytes, size: int) -> Any:
        self._iface = struct.unpack(self.endian + "I", block[:4])[0] if len(block) >= 4 else 0
        caplen = struct.unpack(self.endian + "I", block[12:16])[0] if len(block) >= 16 else 0
        if 20 + caplen > len(block):  # scapy would hand on the shorter bytes as if they were the packet
            raise self._corrupt(f"record {self.records + 1} at byte offset {self._block_offset} claims {caplen} "
                                f"captured bytes in a {len(block) + 12}-byte block")
        return super()._read_block_epb(block, size)

    def _read_block_pkt(self, block: bytes, size: int) -> Any:
        self._iface = struct.unpack(self.endian + "H", block[:2])[0] if len(block) >= 2 else 0
        return super()._read_block_pkt(block, size)

    def _read_block_spb(self, block: bytes, size: int) -> Any:
        self._iface = 0
        return super()._read_block_spb(block, size)

    def _check_interface_id(self, intid: int) -> bool:
        if intid >= len(self.interfaces):
            where = "before any interface block" if not self.interfaces else f"names interface {intid}"
            raise self._corrupt(f"record {self.records + 1} at byte offset {self._block_offset} {where}")
        return True


class _Quiet(logging.Filter):
    """Keeps scapy's runtime warnings ("packet has been truncated", ...) from stderr while a file is read:
    the CLI says what went wrong once, in its own words (the one-line error or a note)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return False


@contextlib.contextmanager
def _scapy_quiet() -> Iterator[None]:
    log, quiet = logging.getLogger("scapy.runtime"), _Quiet()
    log.addFilter(quiet)
    try:
        yield
    finally:
        log.removeFilter(quiet)


class CaptureReader:
    """The packets of a capture file, one at a time (scapy packets from the link layer up, `.time` in
    epoch seconds as a float, `.linktype`, `.number`); `records`, `truncation` and `format` once read."""

    def __init__(self, path: str | Path, *, allow_truncated: bool = False) -> None:
        p = Path(path)
        if not p.is_file():
            raise UsageError(f"capture file not found: {p}")
        with p.open("rb") as f:
            head = f.read(4)
        if head in MODIFIED_PCAP:
            raise UsageError(f"{p} is a 'modified' pcap (magic {head.hex()}), which is not read: "
                             f"convert it with `editcap -F pcap {p} OUT.pcap`")
        self.path, self.allow_truncated = p, allow_truncated
        with _scapy_quiet():
            try:
                self._reader: _CheckedPcap | _CheckedPcapNg = _CheckedPcapNg(str(p))  # falls back to pcap
            except Scapy_Exception:
                if head in PCAP_MAGICS:
                    raise UsageError(f"{p} is truncated: its 24-byte pcap file header is cut short "
                                     f"({p.stat().st_size} bytes)") from None
                raise UsageError(f"{p} is not a pcap or pcapng capture (first bytes {head.hex()})") from None
        self._reader.name = str(p)
        self.format = "pcapng" if isinstance(self._reader, RawPcapNgReader) else "pcap"

    @property
    def records(self) -> int:
        return self._reader.records

    @property
    def truncation(self) -> Truncation | None:
        return self._reader.truncation

    def __iter__(self) -> Iterator[Any]:
        with _scapy_quiet():
            try:
                while True:
                    try:
                        pkt = self._reader.read_packet()
                    except EOFError:
                        break
                    yield pkt
            finally:
                self.close()
        if self.truncation is not None and not self.allow_truncated:
            raise UsageError(f"{self.path} is {self.truncation.describe(self.records)} "
                             "(pass --allow-truncated to analyse the complete records)")

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> CaptureReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
