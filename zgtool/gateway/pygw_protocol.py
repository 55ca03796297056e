"""pygw's HTTP protocol: uvicorn's httptools protocol, except that a malformed request answers
its 400 after the answers of the requests pipelined before it on the connection, then closes
(engine/server/pipelining.py; uvicorn answers at once and loses them)."""

from __future__ import annotations

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from zgtool.engine.server.pipelining import InOrderErrors


class PygwProtocol(InOrderErrors):
    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a malformed request, in order."""
        body = msg.encode("ascii", "replace")
        head = [STATUS_LINE[400]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [b"content-type: text/plain; charset=utf-8\r\n", b"content-length: ", str(len(body)).encode(),
                 b"\r\nconnection: close\r\n\r\n", body]
        self.fail_in_order(b"".join(head))
