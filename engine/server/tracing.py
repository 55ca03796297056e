"""W3C trace context in, one OTLP/HTTP (JSON) span per generation request out.

- ``parse_traceparent`` reads an incoming ``traceparent`` (W3C Trace Context level 1:
  ``00-<32 hex trace id>-<16 hex parent span id>-<2 hex flags>``; all-zero ids and version
  ``ff`` are invalid and ignored, as the spec says). The trace id that reached the engine is
  echoed in the ``x-zgtool-trace-id`` response header and the access log (``trace_id``),
  and the parent span id in ``x-zgtool-parent-span-id``; neither is sent when no valid
  traceparent arrived, so a proxy that drops the header is visible.
- ``SpanExporter`` (``zgtool serve --otlp-endpoint URL``) queues finished spans and posts them
  from one background thread in batches (at most ``BATCH_MAX`` spans, or whatever arrived
  within ``FLUSH_S``), so the request path only appends to a queue. The span carries the
  incoming trace id and has the incoming span as its parent, and the OpenTelemetry GenAI
  attributes under the names vLLM uses (vllm/tracing.py ``SpanAttributes``), in seconds.
"""

from __future__ import annotations

import json
import logging
import queue
import re
import secrets
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

log = logging.getLogger("zgtool.serve")

TRACE_ID_HEADER = b"x-zgtool-trace-id"
PARENT_SPAN_HEADER = b"x-zgtool-parent-span-id"
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
BATCH_MAX = 512
FLUSH_S = 0.5
QUEUE_MAX = 10_000          # spans beyond it are dropped (counted), never block the loop
SPAN_KIND_SERVER = 2
SERVICE_NAME = "zgtool-engine"


@dataclass(frozen=True, slots=True)
class TraceContext:
    trace_id: str            # 32 lowercase hex
    parent_span_id: str      # 16 lowercase hex
    flags: int
    tracestate: str | None = None


def parse_traceparent(value: bytes | None, tracestate: bytes | None = None) -> TraceContext | None:
    """The incoming context, or None when absent or invalid (then a new trace starts)."""
    if not value:
        return None
    m = _TRACEPARENT.fullmatch(value.strip())
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == b"ff" or (version == b"00" and rest) or trace_id == b"0" * 32 or span_id == b"0" * 16:
        return None
    state = tracestate.decode("latin-1").strip() if tracestate else None
    return TraceContext(trace_id.decode(), span_id.decode(), int(flags, 16), state or None)


def response_headers(ctx: TraceContext | None) -> list[tuple[bytes, bytes]]:
    if ctx is None:
        return []
    return [(TRACE_ID_HEADER, ctx.trace_id.encode()), (PARENT_SPAN_HEADER, ctx.parent_span_id.encode())]


def traces_url(endpoint: str) -> str:
    """OTLP/HTTP convention: a base URL (no path) gets ``/v1/traces``; a full path is kept."""
    u = urlsplit(endpoint)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise ValueError(f"--otlp-endpoint must be an http(s) URL, not {endpoint!r}")
    if u.path in ("", "/"):
        return endpoint.rstrip("/") + "/v1/traces"
    return endpoint


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        v: dict[str, Any] = {"boolValue": value}
    elif isinstance(value, int):
        v = {"intValue": str(value)}      # OTLP JSON: 64-bit integers as strings
    elif isinstance(value, float):
        v = {"doubleValue": value}
    elif isinstance(value, list | tuple):
        v = {"arrayValue": {"values": [{"stringValue": str(x)} for x in value]}}
    else:
        v = {"stringValue": str(value)}
    return {"key": key, "value": v}


def make_span(ctx: TraceContext | None, name: str, start_ns: int, end_ns: int, attributes: dict[str, Any],
              error: str | None = None) -> dict[str, Any]:
    """One OTLP JSON span: a child of the incoming span, or the root of a new trace."""
    span: dict[str, Any] = {
        "traceId": ctx.trace_id if ctx is not None else secrets.token_hex(16),
        "spanId": secrets.token_hex(8),
        "name": name,
        "kind": SPAN_KIND_SERVER,
        "startTimeUnixNano": str(start_ns),
        "endTimeUnixNano": str(end_ns),
        "attributes": [_attr(k, v) for k, v in attributes.items() if v is not None],
        "status": {"code": 2, "message": error} if error else {"code": 1},
    }
    if ctx is not None:
        span["parentSpanId"] = ctx.parent_span_id
        if ctx.tracestate:
            span["traceState"] = ctx.tracestate
        span["flags"] = 0x100 | (ctx.flags & 0xFF)   # W3C flags + "parent is remote"
    return span


def export_body(spans: list[dict[str, Any]], version: str) -> bytes:
    return json.dumps({"resourceSpans": [{
        "resource": {"attributes": [_attr("service.name", SERVICE_NAME)]},
        "scopeSpans": [{"scope": {"name": "zgtool.engine", "version": version}, "spans": spans}],
    }]}, separators=(",", ":")).encode()


class SpanExporter:
    """Batches spans and posts them from one daemon thread; ``close`` flushes what is queued."""

    def __init__(self, endpoint: str, version: str, timeout_s: float = 5.0) -> None:
        self.url = traces_url(endpoint)
        self.version = version
        self.timeout_s = timeout_s
        self.dropped = 0
        self.failed_posts = 0
        self.exported = 0
        self._q: queue.Queue[dict[str, Any] | None] = queue.Queue(QUEUE_MAX)
        self._thread = threading.Thread(target=self._run, name="zgtool-otlp", daemon=True)
        self._thread.start()

    def submit(self, span: dict[str, Any]) -> None:
        try:
            self._q.put_nowait(span)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout_s: float = 5.0) -> None:
        try:
            self._q.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        closing = False
        while not closing:
            first = self._q.get()
            if first is None:
                break
            batch = [first]
            deadline = time.monotonic() + FLUSH_S
            while len(batch) < BATCH_MAX:
                left = deadline - time.monotonic()
                try:
                    item = self._q.get(timeout=max(0.0, left)) if left > 0 else self._q.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    closing = True
                    break
                batch.append(item)
            self._post(batch)

    def _post(self, batch: list[dict[str, Any]]) -> None:
        req = urllib.request.Request(self.url, data=export_body(batch, self.version), method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310 - operator's URL
                resp.read()
            self.exported += len(batch)
        except Exception as exc:  # noqa: BLE001 - a collector outage must never touch requests
            self.failed_posts += 1
            if self.failed_posts == 1 or self.failed_posts % 100 == 0:
                log.warning("OTLP export to %s failed (%d batch(es) so far): %s", self.url, self.failed_posts, exc)
