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
