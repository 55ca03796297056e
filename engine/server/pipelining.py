"""Pipelined requests keep their answers when a later one is malformed (issue 37, item 3).

uvicorn answers a protocol error (a malformed request line, TE with CL, an oversized head) at
once and closes the connection, even when requests parsed before it on the same connection
are still running or queued: their answers are lost (a "TCPTransport closed" traceback in the
log) and the queued ones never run. nginx answers them in order and then the error.

``InOrderErrors`` does the same: a protocol error is held until every request parsed before
it has its answer, then written, then the connection closes. Reading stops at the error (no
byte after it is parsed). The message the error is in is never run: if its head was complete
(an error in its body) and it waits in the pipeline, it is dropped there; if it already runs,
nothing earlier is pending and the error goes out at once (as before).

Used by the engine's protocol (protocol.py) and by pygw's (zgtool/gateway/pygw_protocol.py).
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class InOrderErrors(HttpToolsProtocol):
    _held_error: bytes | None = None     # the error answer waiting for the answers before it

    def fail_in_order(self, answer: bytes) -> None:
        """Write ``answer`` (a complete error response that closes the connection) after the
        answers of every request parsed before it; stop reading now."""
        transport: Any = self.transport
        if transport.is_closing() or self._held_error is not None:
            return
        cycle = self.cycle
        bad_cycle = cycle is not None and cycle.more_body and not cycle.response_complete
        if bad_cycle and self.pipeline and self.pipeline[0][0] is cycle:
            self.pipeline.popleft()          # the malformed message's own cycle: never run
        elif bad_cycle or (not self.pipeline and (cycle is None or cycle.response_complete)):
            # nothing parsed earlier is waiting: the error goes out now (the running cycle, if
            # it is the malformed message's, learns of the close through connection_lost)
            if cycle is None or cycle.response_complete or not cycle.response_started:
                transport.write(answer)
            transport.close()
            return
        self._held_error = answer
        self.flow.pause_reading()

    def data_received(self, data: bytes) -> None:
        if self._held_error is None:          # nothing after a protocol error is parsed
            super().data_received(data)

    def on_response_complete(self) -> None:
        held = self._held_error
        if held is None or self.pipeline:
            super().on_response_complete()     # (starts the next pipelined request, if any)
            return
        # the last answer before the error is out: now the error, then the close
        self._held_error = None
        self.server_state.total_requests += 1
        transport: Any = self.transport
        if not transport.is_closing():
            transport.write(held)
            transport.close()
