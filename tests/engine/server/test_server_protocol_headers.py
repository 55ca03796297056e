"""Our protocol parses request heads with uvicorn's own callbacks' bodies inlined (one frame per
header instead of two): what it records must stay what uvicorn's HttpToolsProtocol records."""

from __future__ import annotations

from typing import Any

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from zgtool.engine.server.protocol import DeadlineHttpToolsProtocol


class _Head:
    """The attributes the head callbacks touch."""

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.url = b""
        self.expect_100_continue = False
        self._head_bytes = 0
        self.max_header_bytes = 1 << 20


HEADS = [
    [(b"Host", b"x"), (b"Content-Type", b"application/json"), (b"content-length", b"12")],
    [(b"EXPECT", b"100-Continue  "), (b"X-Trailing", b"value \t"), (b"x-empty", b"")],
    [(b"expect", b"something-else"), (b"Authorization", b"Bearer sk-\xff\x80"), (b"A", b" \t")],
]


@pytest.mark.parametrize("fields", HEADS)
def test_headers_url_and_expect_are_recorded_as_uvicorn_records_them(fields: list[tuple[bytes, bytes]]) -> None:
    ours: Any = _Head()
    theirs: Any = _Head()
    for part in (b"/v1/mess", b"ages?x=1"):
        DeadlineHttpToolsProtocol.on_url(ours, part)
        HttpToolsProtocol.on_url(theirs, part)
    for name, value in fields:
        DeadlineHttpToolsProtocol.on_header(ours, name, value)
        HttpToolsProtocol.on_header(theirs, name, value)
    assert ours.headers == theirs.headers
    assert ours.url == theirs.url == b"/v1/messages?x=1"
    assert ours.expect_100_continue is theirs.expect_100_continue


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name in ("peername", "sockname") else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


REQUESTS = [
    b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
    b"GET /v1/models/a%20b?x=1&y=%2F HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n{}",
    b"HEAD /health HTTP/1.1\r\nConnection: close\r\n\r\n",
]


@pytest.mark.parametrize("raw", REQUESTS)
def test_a_request_reaches_the_app_with_the_scope_and_cycle_uvicorns_protocol_builds(raw: bytes) -> None:
    import asyncio

    import uvicorn
    from uvicorn.server import ServerState

    from zgtool.engine.server.protocol import CYCLE, protocol_class

    seen: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(dict(scope))

    state = ("keep_alive", "waiting_for_100_continue", "more_body", "body", "response_started", "chunked_encoding")

    async def run(cls: Any) -> tuple[dict[str, Any], Any, dict[str, Any]]:
        config = uvicorn.Config(app, http="httptools", lifespan="off", log_level="critical")
        config.load()
        proto = cls(config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())
        proto.connection_made(_Transport())
        proto.data_received(raw)
        cycle = proto.cycle
        before = {a: getattr(cycle, a) for a in state}    # as the app's task finds it
        await asyncio.sleep(0)          # the app's task runs (and, given no answer, uvicorn answers 500)
        return seen.pop(), cycle, before

    theirs, their_cycle, their_state = asyncio.run(run(HttpToolsProtocol))
    ours, our_cycle, our_state = asyncio.run(run(protocol_class(10.0, 30.0)))
    assert ours.pop(CYCLE) is our_cycle
    assert ours == theirs
    assert our_state == their_state
    assert isinstance(our_cycle, type(their_cycle))
