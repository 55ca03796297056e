"""uvicorn request-response cycles over a recording transport, for the one-write tests
(test_server_one_write.py, test_server_respond.py): no socket, every write kept in order."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from zgtool.engine.server.protocol import _OneWriteCycle

DATE_HEADER = [(b"date", b"Thu, 03 Dec 2026 15:00:00 GMT")]


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def make_cycle(t: RecordingTransport, *, keep_alive: bool = True, method: str = "POST",
               cls: type[RequestResponseCycle] = _OneWriteCycle,
               default_headers: list[tuple[bytes, bytes]] | None = None) -> Any:
    """A POST /v1/messages cycle of class `cls`; `cycle.completed` records on_response calls."""
    log = logging.getLogger("test")
    completed: list[bool] = []
    cycle = RequestResponseCycle(
        scope={"type": "http", "method": method, "path": "/v1/messages", "http_version": "1.1"},  # type: ignore[arg-type]
        transport=t, flow=FlowControl(t), logger=log,  # type: ignore[arg-type]
        access_logger=log, access_log=False,
        default_headers=DATE_HEADER if default_headers is None else default_headers,
        message_event=asyncio.Event(), expect_100_continue=False, keep_alive=keep_alive,
        on_response=lambda: completed.append(True))
    cycle.__class__ = cls
    cycle.completed = completed  # type: ignore[attr-defined]
    return cycle
