"""Server-sent events: one writer and one incremental parser, used by every side.

Writer: ``event(name, obj)``, ``data(obj)``, ``comment(text)``, ``SSE_HEADERS`` and
``timing_comment(obj)`` / ``parse_timing_comment(text)`` for zgtool's per-request timing,
which rides as an SSE comment line (``: zgtool-timing {json}``): the official SDKs,
like every conforming SSE client, drop comments, so they never see it.

Parser: ``SSEParser().feed(chunk)`` returns the complete ``Event``s in the chunk (any
split across chunks, ``\\n``, ``\\r\\n`` or ``\\r`` line ends); comment lines are kept in
``Event.comments`` of the event they precede, or arrive as an ``Event`` with
``event == ""`` and no data when a blank line ends them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import orjson

SSE_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    # nginx (and similar proxies) buffer responses unless told not to.
    (b"x-accel-buffering", b"no"),
]
TIMING_PREFIX = "zgtool-timing "
DONE = b"data: [DONE]\n\n"


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def event(name: str, obj: Any) -> bytes:
    """``event: name`` + one ``data:`` line with obj as compact JSON."""
    return b"event: " + name.encode() + b"\ndata: " + _json(obj) + b"\n\n"


def data(obj: Any) -> bytes:
    """One unnamed event (OpenAI chunks)."""
    return b"data: " + _json(obj) + b"\n\n"


def comment(text: str) -> bytes:
    """An SSE comment block; ignored by conforming clients (keep-alives, timing)."""
    return b"".join(b": " + line.encode() + b"\n" for line in (text.splitlines() or [""])) + b"\n"


def timing_comment(obj: dict[str, Any]) -> bytes:
    """``: zgtool-timing {...}`` with obj as compact JSON. orjson writes it (a stream's timing event
    carries a float per token: ~10x faster than json.dumps); its numbers are json.dumps' digits for
    every value a timing holds (ms rounded to 3 places; it writes 1e-05 as 0.00001, equal JSON), and
    a non-ASCII string, which it would not escape, takes json.dumps."""
    raw = orjson.dumps(obj)
    text = raw.decode() if raw.isascii() else _json(obj).decode()
    return comment(TIMING_PREFIX + text)


def parse_timing_comment(text: str) -> dict[str, Any] | None:
    """The JSON of a ``zgtool-timing`` comment (without the leading colon), else None."""
    text = text.lstrip()
    if not text.startswith(TIMING_PREFIX):
        return None
    try:
        obj = json.loads(text[len(TIMING_PREFIX):])
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


@dataclass
class Event:
    event: str = "message"       # "" for a block that held only comments
    data: str = ""
    id: str | None = None
    retry: int | None = None
    comments: list[str] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.data)

    @property
    def timing(self) -> dict[str, Any] | None:
        """zgtool's timing, when one of this event's comments carries it."""
        for c in self.comments:
            t = parse_timing_comment(c)
            if t is not None:
                return t
        return None


class SSEParser:
    """Incremental parser (WHATWG event-stream rules, plus comments kept)."""

    __slots__ = ("_buf", "_event", "_data", "_id", "_retry", "_comments", "_cr")

    def __init__(self) -> None:
        self._buf = b""
        self._cr = False
        self._reset()

    def _reset(self) -> None:
        self._event: str | None = None
        self._data: list[str] = []
        self._id: str | None = None
        self._retry: int | None = None
        self._comments: list[str] = []

    def feed(self, chunk: bytes) -> list[Event]:
        if self._cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]          # the \n of a \r\n split across chunks
        self._cr = False
        buf = self._buf + chunk
        if b"\r" in buf:
            self._cr = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        out: list[Event] = []
        start = 0
        while True:
            end = buf.find(b"\n", start)
            if end == -1:
                break
            ev = self._line(buf[start:end].decode("utf-8", errors="replace"))
            if ev is not None:
                out.append(ev)
            start = end + 1
        self._buf = buf[start:]
        return out

    def _line(self, line: str) -> Event | None:
        if not line:
            if not self._data and self._event is None and self._id is None and self._retry is None:
                if self._comments:
                    ev = Event("", "", comments=self._comments)
                    self._comments = []
                    return ev
                return None
            ev = Event(self._event or "message", "\n".join(self._data), self._id, self._retry, self._comments)
            self._reset()
            return ev
        if line[0] == ":":
            self._comments.append(line[1:].removeprefix(" "))
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)
        return None
