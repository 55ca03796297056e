"""A complete answer leaves in one transport write (head and body together); streams do not wait."""

from __future__ import annotations

import asyncio
from typing import Any

from cycle_helpers import RecordingTransport, make_cycle
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle


def _cycle(transport: RecordingTransport, keep_alive: bool = True) -> RequestResponseCycle:
    return make_cycle(transport, keep_alive=keep_alive, default_headers=[])  # type: ignore[no-any-return]


def _send(cycle: RequestResponseCycle, messages: list[dict[str, Any]]) -> None:
    async def go() -> None:
        for m in messages:
            await cycle.send(m)  # type: ignore[arg-type]
    asyncio.run(go())


def test_a_complete_answer_is_one_write_and_keeps_the_connection() -> None:
    t = RecordingTransport()
    body = b'{"ok":true}'
    _send(_cycle(t), [
        {"type": "http.response.start", "status": 200,
         "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]},
        {"type": "http.response.body", "body": body},
    ])
    assert len(t.writes) == 1
    assert t.writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and t.writes[0].endswith(b"\r\n\r\n" + body)
    assert not t.closed


def test_a_complete_answer_on_a_closing_connection_is_written_then_closed() -> None:
    t = RecordingTransport()
    _send(_cycle(t, keep_alive=False), [
        {"type": "http.response.start", "status": 413, "headers": [(b"content-length", b"2")]},
        {"type": "http.response.body", "body": b"{}"},
    ])
    assert len(t.writes) == 1 and t.writes[0].endswith(b"{}")
    assert b"connection: close" in t.writes[0]
    assert t.closed


def test_a_stream_head_goes_out_before_its_first_event() -> None:
    t = RecordingTransport()
    cycle = _cycle(t)
    _send(cycle, [{"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}])
    assert len(t.writes) == 1 and t.writes[0].startswith(b"HTTP/1.1 200 OK")
    _send(cycle, [{"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True},
                  {"type": "http.response.body", "body": b"", "more_body": False}])
    assert len(t.writes) == 3
