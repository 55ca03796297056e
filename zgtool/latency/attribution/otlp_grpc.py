"""OTLP/gRPC on the span receiver's port: one HTTP/2 connection served on the thread that read its preface.

vLLM exports its spans over gRPC unless ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`` is set, and the
OpenTelemetry SDK's gRPC exporter keeps only the host and port of an ``http://HOST:PORT/v1/traces`` endpoint
(plain text for ``http://``), so the receiver's one URL serves both protocols: a connection that opens with
HTTP/2's preface is handed here. The HTTP/2 state (settings, flow control, pings, HPACK) is h2's
(python-hyper); this file adds gRPC's unary call on top:

- ``POST /opentelemetry.proto.collector.trace.v1.TraceService/Export``, ``content-type: application/grpc``;
  the body is one length-prefixed message (flag byte, 4-byte big-endian length), compressed when the flag
  is 1 by the request's ``grpc-encoding`` (gzip or deflate);
- answered with an empty ExportTraceServiceResponse and ``grpc-status: 0``; a body that does not decode gets
  ``grpc-status: 3`` (INVALID_ARGUMENT), any other method 12 (UNIMPLEMENTED), a message over the size limit
  8 (RESOURCE_EXHAUSTED), each with a ``grpc-message`` and nothing stored.
"""

from __future__ import annotations

import struct
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import ConnectionTerminated, DataReceived, RequestReceived, StreamEnded, StreamReset
from h2.exceptions import ProtocolError, StreamClosedError

from zgtool.latency.attribution.inflate import GZIP_WBITS, ZLIB_WBITS, InflateError, inflate

EXPORT_PATH = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
GRPC_OK = 0
GRPC_INVALID_ARGUMENT = 3
GRPC_RESOURCE_EXHAUSTED = 8
GRPC_UNIMPLEMENTED = 12
_PREFIX = struct.Struct(">BI")
_EMPTY_RESPONSE = _PREFIX.pack(0, 0)      # an ExportTraceServiceResponse with no field set


class GrpcError(Exception):
    """A call answered with a non-zero grpc-status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class _Call:
    path: str = ""
    encoding: str = "identity"
    body: bytearray = field(default_factory=bytearray)
    too_large: bool = False


def unframe(body: bytes, encoding: str, max_bytes: int) -> bytes:
    """The one message of a unary call's body, decompressed; raises GrpcError."""
    if len(body) < _PREFIX.size:
        raise GrpcError(GRPC_INVALID_ARGUMENT, f"a gRPC message needs a 5-byte prefix, the body has {len(body)} byte(s)")
    flag, length = _PREFIX.unpack_from(body)
    if length != len(body) - _PREFIX.size:
        raise GrpcError(GRPC_INVALID_ARGUMENT, f"the message prefix says {length} bytes and {len(body) - 5} came "
                        "(a unary call carries one message)")
    message = bytes(body[_PREFIX.size:])
    if flag == 0:
        return message
    if flag != 1:
        raise GrpcError(GRPC_INVALID_ARGUMENT, f"compressed-flag {flag} (0 or 1)")
    enc = encoding.strip().lower()
    wbits = {"gzip": GZIP_WBITS, "deflate": ZLIB_WBITS}.get(enc)
    if wbits is None:
        raise GrpcError(GRPC_UNIMPLEMENTED, f"grpc-encoding {encoding!r} (gzip or deflate)")
    try:
        return inflate(message, wbits=wbits, max_bytes=max_bytes)
    except InflateError as exc:
        raise GrpcError(GRPC_RESOURCE_EXHAUSTED if exc.too_large else GRPC_INVALID_ARGUMENT,
                        f"the {enc} message {exc}") from None


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str:
    return next((v.decode("latin-1") for k, v in headers if k.lower() == name), "")


class GrpcConnection:
    """Serves unary Export calls on one HTTP/2 connection; `on_export(message)` stores a decoded request or
    raises GrpcError."""

    def __init__(self, read: Callable[[], bytes], write: Callable[[bytes], object],
                 on_export: Callable[[bytes], None], *, max_bytes: int) -> None:
        self._read, self._write, self._on_export = read, write, on_export
        self._max_bytes = max_bytes
        self._h2 = H2Connection(H2Configuration(client_side=False, header_encoding=None))
        self._calls: dict[int, _Call] = {}
        self.exports = 0

    def serve(self, first: bytes) -> None:
        """`first`: the bytes already read off the connection (the preface's first line). Returns when the
        client goes away or breaks the protocol (h2's ProtocolError propagates after a GOAWAY is sent)."""
        self._h2.initiate_connection()
        data = first
        while data:
            try:
                events = self._h2.receive_data(data)
            except ProtocolError:
                self._flush()
                raise
            for event in events:
                self._handle(event)
            self._flush()
            if any(isinstance(e, ConnectionTerminated) for e in events):
                return
            data = self._read()

    def _flush(self) -> None:
        out = self._h2.data_to_send()
        if out:
            self._write(out)

    def _handle(self, event: object) -> None:
        if isinstance(event, RequestReceived):
            headers = list(event.headers or [])
            self._calls[event.stream_id] = _Call(path=_header(headers, b":path"),
                                                 encoding=_header(headers, b"grpc-encoding") or "identity")
        elif isinstance(event, DataReceived):
            self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            call = self._calls.get(event.stream_id)
            if call is not None and not call.too_large:
                call.body += event.data or b""
                if len(call.body) > self._max_bytes + _PREFIX.size:
                    call.too_large, call.body = True, bytearray()
        elif isinstance(event, StreamEnded):
            call = self._calls.pop(event.stream_id, None)
            if call is not None:
                self._answer(event.stream_id, call)
        elif isinstance(event, StreamReset):
            self._calls.pop(event.stream_id, None)

    def _answer(self, stream_id: int, call: _Call) -> None:
        try:
            self._respond(stream_id, call)
        except StreamClosedError:       # the exporter cancelled the call (RST_STREAM) after sending it whole
            pass

    def _respond(self, stream_id: int, call: _Call) -> None:
        try:
            if call.path != EXPORT_PATH:
                raise GrpcError(GRPC_UNIMPLEMENTED, f"only {EXPORT_PATH} (OTLP traces), not {call.path}")
            if call.too_large:
                raise GrpcError(GRPC_RESOURCE_EXHAUSTED, f"the message is over {self._max_bytes} bytes")
            self._on_export(unframe(bytes(call.body), call.encoding, self._max_bytes))
        except GrpcError as exc:
            self._h2.send_headers(stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc"),
                                              (b"grpc-status", str(exc.code).encode()),
                                              (b"grpc-message", urllib.parse.quote(str(exc)).encode())],
                                  end_stream=True)
            return
        self.exports += 1
        self._h2.send_headers(stream_id, [(b":status", b"200"), (b"content-type", b"application/grpc")])
        self._h2.send_data(stream_id, _EMPTY_RESPONSE)
        self._h2.send_headers(stream_id, [(b"grpc-status", b"0")], end_stream=True)
