"""OTLP/gRPC on the span receiver's one port, against clients we did not write: the OpenTelemetry SDK's gRPC span
exporter (what vLLM uses when OTEL_EXPORTER_OTLP_TRACES_PROTOCOL is unset, its default), grpcio's own channel
for the refusals, and h2's client for framing the SDK never sends. The OTLP/HTTP side is tests/latency/test_otlp.py."""

from __future__ import annotations

import gzip
import socket
import ssl
import struct
import threading
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterator

import grpc
import pytest
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import DataReceived, ResponseReceived, StreamEnded, TrailersReceived
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.exporter import Compression
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from zgtool.latency.attribution import otlp, otlp_grpc
from zgtool.latency.attribution.otlp import SOURCE, OtlpReceiver, attach_spans, span_timing
from zgtool.latency.records import RequestSample

EXPORT = otlp_grpc.EXPORT_PATH


def _spans(trace_id: int, *, service: str = "vllm", n: int = 1) -> tuple[ReadableSpan, ...]:
    """`n` finished SDK spans in `trace_id`, with vLLM's latency attributes (seconds)."""
    mem = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(mem))
    parent = trace.set_span_in_context(NonRecordingSpan(SpanContext(
        trace_id=trace_id, span_id=0x1111, is_remote=True, trace_flags=TraceFlags(1))))
    tracer = provider.get_tracer("zgtool-test")
    for i in range(n):
        with tracer.start_as_current_span(f"llm_request {i}", context=parent) as span:
            span.set_attribute("gen_ai.latency.e2e", 0.25)
            span.set_attribute("gen_ai.latency.time_to_first_token", 0.05)
            span.set_attribute("gen_ai.latency.time_in_queue", 0.01)
    provider.shutdown()
    return mem.get_finished_spans()


@pytest.fixture()
def rx() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


def _sample(trace_id: str) -> RequestSample:
    return RequestSample(index=0, worker=0, round=0, ok=True, total_ms=400.0, trace_id=trace_id)


@pytest.mark.parametrize("compression", [Compression.NoCompression, Compression.Gzip], ids=["plain", "gzip"])
def test_the_sdks_grpc_exporter_pointed_at_the_receivers_http_url_delivers_its_spans(
        rx: OtlpReceiver, compression: Compression) -> None:
    """The URL zgtool prints (http://HOST:PORT/v1/traces) given to a gRPC exporter: it keeps HOST:PORT, plain
    text for http://, and its spans are stored and timed as an OTLP/HTTP export's are."""
    tid = 0x0AF7651916CD43DD8448EB211C80319C
    exporter = OTLPSpanExporter(endpoint=rx.url, compression=compression, timeout=10)
    try:
        assert exporter.export(_spans(tid, n=2)) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    got = rx.store.spans(f"{tid:032x}")
    assert sorted(s.name for s in got) == ["llm_request 0", "llm_request 1"]
    assert {s.service for s in got} == {"vllm"} and {s.parent_span_id for s in got} == {f"{0x1111:016x}"}
    timing = span_timing(got[0])
    assert timing is not None and timing.total_ms == pytest.approx(250.0) and timing.ttft_ms == pytest.approx(50.0)
    assert rx.store.grpc_exports == 1 and rx.store.rejected_posts == 0


def test_http_and_grpc_exports_on_the_one_port_land_in_one_store(rx: OtlpReceiver) -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    tid = 0x1234
    body = encode_spans(_spans(tid, service="vllm")).SerializeToString()
    req = urllib.request.Request(rx.url, body, {"Content-Type": "application/x-protobuf"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert resp.status == 200
    exporter = OTLPSpanExporter(endpoint=rx.url, timeout=10)
    try:
        assert exporter.export(_spans(tid, service="litellm")) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    assert rx.store.spans(f"{tid:032x}")[0].service == "vllm"            # the engine's, by HTTP
    assert [s.service for s in rx.store.hop_spans(f"{tid:032x}")] == ["litellm"]   # the gateway's, by gRPC


def test_grpcio_gets_unimplemented_for_another_method_and_invalid_argument_for_a_broken_message(
        rx: OtlpReceiver) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{rx.port}") as channel:
        metrics = channel.unary_unary("/opentelemetry.proto.collector.metrics.v1.MetricsService/Export")
        with pytest.raises(grpc.RpcError) as err:
            metrics(b"", timeout=10)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "OTLP traces" in urllib.parse.unquote(err.value.details())
        export = channel.unary_unary(EXPORT)
        with pytest.raises(grpc.RpcError) as err:
            export(b"\x0a\xff\xff\xff", timeout=10)       # field 1, a length running past the end
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert export(b"", timeout=10) == b""                # an empty request is a valid one: no spans
    assert rx.store.rejected_posts == 1 and rx.store.received == 0 and rx.store.grpc_exports == 1


def _h2_call(port: int, body: bytes, headers: list[tuple[str, str]] = (), *, path: str = EXPORT
             ) -> tuple[dict[str, str], bytes, dict[str, str]]:
    """One call by h2's client over a fresh connection: (response headers, data, trailers)."""
    conn = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    sid = conn.get_next_available_stream_id()
    conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":authority", f"127.0.0.1:{port}"),
                            (":path", path), ("content-type", "application/grpc"), ("te", "trailers"),
                            *headers])
    conn.send_data(sid, body, end_stream=True)
    head: dict[str, str] = {}
    trailers: dict[str, str] = {}
    data = bytearray()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(conn.data_to_send())
        done = False
        while not done:
            chunk = s.recv(65536)
            assert chunk, "the receiver closed the connection before the call ended"
            for event in conn.receive_data(chunk):
                if isinstance(event, ResponseReceived):
                    head = dict(event.headers)
                elif isinstance(event, TrailersReceived):
                    trailers = dict(event.headers)
                elif isinstance(event, DataReceived):
                    data += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, sid)
                elif isinstance(event, StreamEnded):
                    done = True
            s.sendall(conn.data_to_send())
    return head, bytes(data), trailers


def _status(head: dict[str, str], trailers: dict[str, str]) -> tuple[int, str]:
    where = trailers or head        # a refusal is trailers-only: grpc-status in the one HEADERS frame
    return int(where["grpc-status"]), urllib.parse.unquote(where.get("grpc-message", ""))


def _framed(message: bytes, flag: int = 0) -> bytes:
    return struct.pack(">BI", flag, len(message)) + message


def test_compressed_messages_by_the_calls_encoding_and_each_framing_error_answered_with_its_status(
        rx: OtlpReceiver) -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    message = encode_spans(_spans(0x77)).SerializeToString()
    head, data, trailers = _h2_call(rx.port, _framed(zlib.compress(message), 1), [("grpc-encoding", "deflate")])
    assert head[":status"] == "200" and head["content-type"] == "application/grpc"
    assert data == b"\x00\x00\x00\x00\x00" and _status(head, trailers) == (0, "")
    assert len(rx.store.spans(f"{0x77:032x}")) == 1

    cases = [
        (_framed(gzip.compress(message), 1), [("grpc-encoding", "snappy")], 12, "grpc-encoding 'snappy'"),
        (_framed(b"not gzip", 1), [("grpc-encoding", "gzip")], 3, "does not decompress"),
        (_framed(message)[:-3], [], 3, "a unary call carries one message"),
        (b"\x00\x00", [], 3, "5-byte prefix"),
        (_framed(message, 2), [], 3, "compressed-flag 2"),
    ]
    for body, headers, code, words in cases:
        head, data, trailers = _h2_call(rx.port, body, headers)
        got_code, got_message = _status(head, trailers)
        assert (got_code, data) == (code, b""), words
        assert words in got_message
    assert rx.store.received == 1 and rx.store.grpc_exports == 1


def test_a_message_over_the_size_limit_is_refused_whole_and_stores_nothing(
        rx: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    monkeypatch.setattr(otlp, "MAX_BODY_BYTES", 4096)
    big = encode_spans(_spans(0x88, n=60)).SerializeToString()
    assert len(big) > 4096
    for body, headers in ((_framed(big), []), (_framed(gzip.compress(big), 1), [("grpc-encoding", "gzip")])):
        head, data, trailers = _h2_call(rx.port, body, headers)
        assert _status(head, trailers)[0] == 8 and data == b""       # RESOURCE_EXHAUSTED
    assert rx.store.received == 0 and not rx.store.spans(f"{0x88:032x}")


def test_tls_to_the_plain_receiver_is_closed_at_once_and_the_untimed_requests_say_how_to_send_plain_text(
        rx: OtlpReceiver) -> None:
    """A gRPC exporter given a bare HOST:PORT (no http://) speaks TLS: the handshake fails at once instead of
    waiting for a line, and each request left without a span names the endpoint form that works."""
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", rx.port), timeout=10) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    assert rx.store.tls_attempts == 1
    s = _sample("e" * 32)
    assert attach_spans([s], rx.store, wait_s=0.0) == 1
    assert s.engine_warnings == [
        f"{SOURCE}: no span for the request's trace arrived within 0 s; 1 connection(s) opened TLS to this "
        f"plain-text receiver: give the engine the endpoint as http://127.0.0.1:{rx.port}/v1/traces "
        "(the OpenTelemetry SDK's gRPC exporter uses TLS for a bare HOST:PORT)"]


def test_a_connection_that_breaks_http2_after_the_preface_is_closed_and_counted(rx: OtlpReceiver) -> None:
    with socket.create_connection(("127.0.0.1", rx.port), timeout=10) as c:
        # the preface, then a DATA frame on stream 0: a connection error (RFC 9113 section 6.1)
        c.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
                  + b"\x00\x00\x01\x00\x00\x00\x00\x00\x00x")
        got = b""
        while chunk := c.recv(65536):
            got += chunk
    assert b"\x07\x00\x00\x00\x00\x00" in got          # a GOAWAY frame (type 7, stream 0) before the close
    assert rx.store.grpc_failures == 1
    s = _sample("f" * 32)
    attach_spans([s], rx.store, wait_s=0.0)
    assert "1 OTLP/gRPC connection(s) broke HTTP/2" in s.engine_warnings[0]


def test_a_closed_receiver_drops_the_exporters_grpc_connection_so_the_next_one_on_its_port_gets_the_spans() -> None:
    """grpcio keeps its connection between exports; the receiver that closes must not go on answering it."""
    first = OtlpReceiver().start()
    port = first.port
    exporter = OTLPSpanExporter(endpoint=first.url, timeout=10)
    try:
        assert exporter.export(_spans(0x91)) == SpanExportResult.SUCCESS
        first.close()
        with OtlpReceiver(port=port) as second:
            assert exporter.export(_spans(0x92)) == SpanExportResult.SUCCESS
            assert len(second.store.spans(f"{0x92:032x}")) == 1
        assert not first.store.spans(f"{0x92:032x}")
    finally:
        exporter.shutdown()
        first.close()


def test_a_grpc_connection_does_not_hold_the_receiver_from_http_posts_meanwhile(rx: OtlpReceiver) -> None:
    """Each connection has its own thread: an idle gRPC connection kept open does not stall OTLP/HTTP."""
    with socket.create_connection(("127.0.0.1", rx.port), timeout=10) as idle:
        idle.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        assert idle.recv(9)[3] == 4                       # the receiver's SETTINGS: the connection is served
        done = threading.Event()

        def post() -> None:
            req = urllib.request.Request(rx.url, b"", {"Content-Type": "application/x-protobuf"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                assert resp.status == 200
            done.set()

        t = threading.Thread(target=post)
        t.start()
        t.join(15)
        assert done.is_set()


def test_concurrent_exports_multiplexed_on_one_grpc_channel_are_each_stored(rx: OtlpReceiver) -> None:
    """grpcio sends calls made at once from several threads as concurrent streams of one HTTP/2 connection: each
    stream's message is kept apart and every call is answered."""
    from concurrent.futures import ThreadPoolExecutor

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    bodies = [encode_spans(_spans(0x500 + i, n=3)).SerializeToString() for i in range(12)]
    with grpc.insecure_channel(f"127.0.0.1:{rx.port}") as channel:
        export = channel.unary_unary(EXPORT)
        with ThreadPoolExecutor(max_workers=6) as pool:
            answers = list(pool.map(lambda b: export(b, timeout=10), bodies))
    assert answers == [b""] * 12
    assert all(len(rx.store.spans(f"{0x500 + i:032x}")) == 3 for i in range(12))
    assert rx.store.grpc_exports == 12 and rx.store.received == 36


def test_an_export_larger_than_http2s_initial_windows_arrives_whole(rx: OtlpReceiver) -> None:
    """A batch of a few MB crosses many DATA frames and both of HTTP/2's 64 KiB initial flow-control windows: the
    receiver opens them as it reads, so the exporter is never left waiting."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    spans = _spans(0x600, n=3000)
    assert len(encode_spans(spans).SerializeToString()) > 4 * 65535
    exporter = OTLPSpanExporter(endpoint=rx.url, timeout=20)
    try:
        assert exporter.export(spans) == SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    assert len(rx.store.spans(f"{0x600:032x}")) == 3000


def test_a_call_cancelled_after_its_message_leaves_the_connection_serving_the_next(rx: OtlpReceiver) -> None:
    """An exporter past its deadline resets the stream it has sent whole (RST_STREAM CANCEL, in the same read as
    the message): the receiver keeps the spans it has, answers nothing on that stream and the next call on the
    same connection is answered."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    conn = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
    conn.initiate_connection()
    head = [(":method", "POST"), (":scheme", "http"), (":authority", f"127.0.0.1:{rx.port}"), (":path", EXPORT),
            ("content-type", "application/grpc"), ("te", "trailers")]
    first, second = conn.get_next_available_stream_id(), 0
    conn.send_headers(first, head)
    conn.send_data(first, _framed(encode_spans(_spans(0x700)).SerializeToString()), end_stream=True)
    conn.reset_stream(first, error_code=8)          # CANCEL
    with socket.create_connection(("127.0.0.1", rx.port), timeout=10) as s:
        s.sendall(conn.data_to_send())
        second = conn.get_next_available_stream_id()
        conn.send_headers(second, head)
        conn.send_data(second, _framed(encode_spans(_spans(0x701)).SerializeToString()), end_stream=True)
        s.sendall(conn.data_to_send())
        trailers: dict[str, str] = {}
        while not trailers:
            chunk = s.recv(65536)
            assert chunk, "the receiver closed the connection"
            for event in conn.receive_data(chunk):
                if isinstance(event, TrailersReceived) and event.stream_id == second:
                    trailers = dict(event.headers)
            s.sendall(conn.data_to_send())
    assert trailers["grpc-status"] == "0"
    assert len(rx.store.spans(f"{0x701:032x}")) == 1 and rx.store.grpc_failures == 0


def _bomb(tid: int) -> bytes:
    """A valid ExportTraceServiceRequest (one span) padded with 8 MB of zeros in a field the decoder skips
    (number 15, length-delimited): 8 KB gzipped, 8 MB inflated."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    pad = 8 * 1024 * 1024
    varint = bytearray()
    n = pad
    while True:
        byte, n = n & 0x7F, n >> 7
        varint.append(byte | (0x80 if n else 0))
        if not n:
            break
    return encode_spans(_spans(tid)).SerializeToString() + bytes([15 << 3 | 2]) + bytes(varint) + bytes(pad)


def test_a_body_that_inflates_past_the_limit_is_refused_over_both_protocols_and_stores_nothing(
        rx: OtlpReceiver, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compressed, the body is small; inflated it is over the limit: refused before it is all inflated (the
    bound is the most memory it takes), over HTTP (400) and gRPC (RESOURCE_EXHAUSTED) alike."""
    assert len(otlp.decode_protobuf(_bomb(0x800))) == 1          # the padding alone is no decode error
    monkeypatch.setattr(otlp, "MAX_BODY_BYTES", 1024 * 1024)
    body = gzip.compress(_bomb(0x800))
    assert len(body) < 64 * 1024
    req = urllib.request.Request(rx.url, body, {"Content-Type": "application/x-protobuf",
                                                "Content-Encoding": "gzip"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 400 and b"over 1048576 bytes decompressed" in err.value.read()
    head, data, trailers = _h2_call(rx.port, _framed(gzip.compress(_bomb(0x801)), 1), [("grpc-encoding", "gzip")])
    code, message = _status(head, trailers)
    assert (code, data) == (8, b"") and "over 1048576 bytes decompressed" in message
    assert rx.store.received == 0
