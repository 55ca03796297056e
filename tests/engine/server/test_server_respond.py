"""The one-write answer the app hands to our protocol (the cycle's respond and respond_lines, protocol.CYCLE) is byte for byte
what uvicorn's two ASGI sends would write, and steps aside (nothing written) for anything
uvicorn's general path must see."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from cycle_helpers import RecordingTransport, make_cycle
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

BODY = b'{"id":"msg_1","type":"message"}'
HEADERS = [(b"server", b"zgtool-engine/test"), (b"request-id", b"req_1"), (b"x-request-id", b"inference-1"),
           (b"server-timing", b"queue;dur=0.010, total;dur=0.200"), (b"x-gpu-load-hint", b'{"kv_util":0.0}'),
           (b"content-type", b"application/json")]


def _asgi_bytes(keep_alive: bool = True) -> tuple[bytes, bool]:
    """What uvicorn's own cycle writes for the same answer (content-length last)."""
    t = RecordingTransport()
    cycle = make_cycle(t, keep_alive=keep_alive, cls=RequestResponseCycle)

    async def go() -> None:
        await cycle.send({"type": "http.response.start", "status": 200,
                          "headers": [*HEADERS, (b"content-length", str(len(BODY)).encode())]})
        await cycle.send({"type": "http.response.body", "body": BODY})
    asyncio.run(go())
    return b"".join(t.writes), t.closed


@pytest.mark.parametrize("keep_alive", [True, False])
def test_respond_writes_what_the_asgi_sends_write_in_one_write(keep_alive: bool) -> None:
    t = RecordingTransport()
    cycle = make_cycle(t, keep_alive=keep_alive)
    assert cycle.respond(200, list(HEADERS), BODY) is True
    expected, closed = _asgi_bytes(keep_alive)
    assert t.writes == [expected]
    assert t.closed is closed is (not keep_alive)
    assert cycle.response_complete and cycle.completed == [True] and cycle.message_event.is_set()


@pytest.mark.parametrize("bad", [b"a\r\nx-injected: 1", b"a\nb", b"a\rb", b"a\x00b", b"a\x7fb"])
def test_a_header_value_uvicorn_refuses_is_left_to_uvicorn(bad: bytes) -> None:
    t = RecordingTransport()
    cycle = make_cycle(t)
    assert cycle.respond(200, [*HEADERS, (b"request-id", bad)], BODY) is False
    assert t.writes == [] and not cycle.response_started

    async def go() -> None:        # uvicorn's path then refuses it, as before
        await cycle.send({"type": "http.response.start", "status": 200, "headers": [(b"request-id", bad)]})
    with pytest.raises(RuntimeError, match="Invalid HTTP header value"):
        asyncio.run(go())


@pytest.mark.parametrize("name", [b"connection", b"content-length", b"transfer-encoding", b"X-Mixed-Case",
                                  b"bad name"])
def test_framing_and_unknown_header_names_take_the_asgi_path(name: bytes) -> None:
    t = RecordingTransport()
    cycle = make_cycle(t)
    assert cycle.respond(200, [*HEADERS, (name, b"1")], BODY) is False
    assert t.writes == [] and not cycle.response_started


def test_head_requests_and_started_responses_take_the_asgi_path() -> None:
    t = RecordingTransport()
    assert make_cycle(t, method="HEAD").respond(200, list(HEADERS), BODY) is False
    cycle = make_cycle(t)

    async def start() -> None:
        await cycle.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    asyncio.run(start())
    assert cycle.respond(200, list(HEADERS), BODY) is False
    assert t.writes == []


def test_an_answer_for_a_client_that_left_is_dropped_quietly() -> None:
    t = RecordingTransport()
    cycle = make_cycle(t)
    cycle.disconnected = True
    assert cycle.respond(200, list(HEADERS), BODY) is True
    assert t.writes == []


def test_the_usual_answers_head_in_one_format_is_base_headers_line_for_line() -> None:
    from types import SimpleNamespace

    from zgtool.engine.server.app import JSON_CT, PLAIN_JSON_LINES, PLAIN_JSON_NUM_LINES, ServerApp
    from zgtool.engine.server.context import Ctx

    hint = b'{"kv_util":0.0123,"running":3,"waiting":0,"cap_factor":1.0}'
    app: Any = SimpleNamespace(load_hint=lambda: hint)
    ctx = Ctx("1a2b3c", "anthropic", 0.0, {})
    timing = (0.0125, 1.5, 22.25, 0.0004, 0.0, 24.987654)
    headers = [*ServerApp.base_headers(app, ctx, timing), JSON_CT]
    fast = PLAIN_JSON_LINES % (b"1a2b3c", b"1a2b3c", *timing, hint)
    assert fast == b"".join(n + b": " + v + b"\r\n" for n, v in headers) and len(headers) == PLAIN_JSON_NUM_LINES
    ours, theirs = RecordingTransport(), RecordingTransport()
    assert make_cycle(ours).respond_lines(200, fast, PLAIN_JSON_NUM_LINES, BODY) is True
    assert make_cycle(theirs).respond(200, headers, BODY) is True
    assert ours.writes == theirs.writes


def test_preformatted_lines_with_a_control_byte_are_refused_as_respond_refuses_them() -> None:
    t = RecordingTransport()
    cycle = make_cycle(t)
    assert cycle.respond_lines(200, b"request-id: a\rb\r\n", 1, BODY) is False
    assert cycle.respond_lines(200, b"request-id: a\r\nx-injected: 1\r\n", 1, BODY) is False
    assert t.writes == [] and not cycle.response_started
