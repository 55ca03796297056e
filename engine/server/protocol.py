"""uvicorn's httptools protocol plus read deadlines and an explicit TCP_NODELAY.

uvicorn has a keep-alive idle timeout but no deadline for receiving a request's headers
or body, so a slowloris client (one header byte every few seconds) would hold a
connection forever. Here each request gets two absolute deadlines, armed with one
``call_later`` each (no task): headers within ``header_timeout_s`` of the first byte,
body within ``body_timeout_s`` of the headers. A miss answers 408 and closes the
connection; other connections are unaffected.
"""

from __future__ import annotations

import asyncio
import json
import socket
from asyncio import TimerHandle
from collections.abc import Callable
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# ASGI scope key (an extension of ours): a callable run once if the client goes away
# before the response completes.
DISCONNECT_HOOK = "zgtool.on_disconnect"


def _timeout_response(what: str) -> bytes:
    body = json.dumps({"type": "error", "error": {
        "type": "timeout_error", "message": f"request {what} not received in time; closing the connection"}},
        separators=(",", ":")).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\nconnection: close\r\n"
            b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


class DeadlineHttpToolsProtocol(HttpToolsProtocol):
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # uvloop already sets it; some pseudo-sockets refuse setsockopt
                pass
        # A connection that never sends a complete request line is bounded too.
        self._arm(self.header_timeout_s, "headers")

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, what: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete or not cycle.response_started:
            self.transport.write(_timeout_response(what))
        if cycle is not None and not cycle.response_complete:
            # The app may be waiting in receive(); disconnected makes it return http.disconnect.
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.header_timeout_s, "headers")

    def on_headers_complete(self) -> None:
        self._arm(self.body_timeout_s, "body")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # The app registered this when it handed the request to the engine: the engine
            # learns of the disconnect now, with no per-request watcher task on the loop.
            # uvicorn types the scope as a TypedDict that does not know our extension key.
            hook = cast("Callable[[], None] | None", cycle.scope.get(DISCONNECT_HOOK))
            if hook is not None:
                hook()
        super().connection_lost(exc)


def protocol_class(header_timeout_s: float, body_timeout_s: float) -> type[DeadlineHttpToolsProtocol]:
    """A subclass carrying this server's timeouts (uvicorn instantiates it per connection)."""
    return type("ZgHttpProtocol", (DeadlineHttpToolsProtocol,),
                {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s})
