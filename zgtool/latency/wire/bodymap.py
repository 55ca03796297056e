"""Where a decoded body byte sat on the wire: the raw offset (from the response's first byte) of each byte the
HTTP/1.1 parser hands on, through chunked transfer coding. The receive loop feeds it every raw read after the
head; the stream reader asks it where an SSE event's last byte arrived, to look that byte's segment up in the
packet clock (zgtool.latency.wire.pktclock).
"""

from __future__ import annotations

import bisect

_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = range(5)


class BodyMap:
    """Raw offsets of decoded body bytes; `chunked` follows the transfer coding, else the body is verbatim."""

    def __init__(self, body_raw_start: int, chunked: bool) -> None:
        self.chunked = chunked
        self.start = body_raw_start        # raw offset of the body's first byte (the head ends just before)
        self.raw = body_raw_start          # raw offset of the next byte fed
        self.decoded = 0                   # decoded bytes so far
        self.runs_dec: list[int] = []      # decoded start of each run of body data
        self.runs_raw: list[int] = []      # its raw start
        self.state = _SIZE
        self.line = b""                    # the chunk-size or trailer line so far
        self.left = 0                      # data bytes left in the current chunk

    def feed(self, data: bytes) -> None:
        if not self.chunked:
            self._run(0, len(data))
            self.raw += len(data)
            return
        i, n = 0, len(data)
        while i < n and self.state != _DONE:
            if self.state == _DATA:
                take = min(self.left, n - i)
                self._run(i, take)
                self.left -= take
                i += take
                if not self.left:
                    self.state = _DATA_END
                continue
            end = data.find(b"\n", i)
            if end < 0:
                self.line += data[i:]
                i = n
                continue
            line, self.line = (self.line + data[i:end]).rstrip(b"\r"), b""
            i = end + 1
            self._line(line)
        self.raw += n

    def _line(self, line: bytes) -> None:
        if self.state == _DATA_END:                 # the CRLF after a chunk's data
            self.state = _SIZE
            return
        if self.state == _TRAILER:
            if not line:
                self.state = _DONE
            return
        try:
            size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        except ValueError:
            self.state = _DONE                      # not chunked as declared: stop mapping
            return
        if size == 0:
            self.state = _TRAILER
        else:
            self.state, self.left = _DATA, size

    def _run(self, at: int, size: int) -> None:
        if size <= 0:
            return
        raw = self.raw + at
        if self.runs_dec and self.runs_raw[-1] + (self.decoded - self.runs_dec[-1]) == raw:
            self.decoded += size                    # continues the last run
            return
        self.runs_dec.append(self.decoded)
        self.runs_raw.append(raw)
        self.decoded += size

    def raw_of(self, decoded: int) -> int | None:
        """The raw offset of decoded body byte `decoded`, None when it has not been fed."""
        if not 0 <= decoded < self.decoded:
            return None
        k = bisect.bisect_right(self.runs_dec, decoded) - 1
        return self.runs_raw[k] + decoded - self.runs_dec[k]
