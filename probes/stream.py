"""`probe stream`: stream one answer, time every read and SSE event, and flag a buffering hop.

A buffering intermediary (nginx `proxy_buffering on`, some gateways) holds the stream
and releases it in one burst after a long silence. Verdict rules:
  * with the server's own emission times (an SSE event carrying `token_times_ms` /
    `token_times_s`): buffering when the content's arrival span is under a quarter of its
    emission span (and the emission span is long enough to judge), and a held tail when
    >= 80 % of the content lands in one flush (as below) whose tokens the server emitted over
    four times longer than they took to arrive: a hop that passes the first event(s) and
    holds the rest keeps the first-to-last span, so that span alone cannot see it;
  * otherwise: buffering when >= 80 % of the content arrives in the final burst after a long
    time without any SSE event (>= 20 ms and >= half of the time to the last byte; comments
    and padding bytes do not count: a hop can pace bytes while holding the events) and that
    burst is one flush (its events land in <= 2 reads, or < 1/4 as many reads as events);
    the same burst arriving event by event, read by read, is an origin that started late
    and then streamed ("streaming");
  * a stream too short or too fast to tell is "inconclusive", never "streaming".

Result data (kind "probe.stream"):
    url, path, status, content_type, headers [[n, v]]; times in ms from the request's first byte out:
    headers_ms, first_body_ms, first_content_ms, last_content_ms, total_ms,
    num_reads, num_events, num_content_events, content_bytes,
    reads   [{t_ms, raw_bytes, body_bytes}]                 one per recv()
    events  [{t_ms, event, content_bytes}]                  one per SSE event
    emission {source, times_ms, span_ms} | None             the server's own token times
    buffering {verdict: buffering|streaming|inconclusive, buffered: bool, reason,
               burst_fraction, burst_start_ms, silence_before_burst_ms, arrival_span_ms,
               emission_span_ms, gap_threshold_ms, burst_reads}
    notes [str]
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from zgtool.http.sse import SSEParser as KitParser
from zgtool.probes.http1 import content_decoder
from zgtool.probes.request import build, connection_for
from zgtool.targets import Target

EMISSION_KEYS = {"token_times_ms": 1.0, "emit_times_ms": 1.0, "token_times_s": 1e3, "emit_times_s": 1e3}
MIN_CONTENT_EVENTS = 3
MIN_SILENCE_MS = 20.0
MIN_EMISSION_SPAN_MS = 10.0
BURST_FRACTION = 0.8
FLUSH_READS = 2              # a released buffer lands in at most this many reads ...
FLUSH_READ_FRACTION = 0.25   # ... or in under a quarter as many reads as it has events


@dataclass
class Read:
    t_ms: float
    raw_bytes: int
    body_bytes: int


@dataclass
class Event:
    t_ms: float
    event: str
    content_bytes: int


@dataclass
class Emission:
    source: str
    times_ms: list[float]      # relative to the first emitted token
    span_ms: float


@dataclass
class Buffering:
    verdict: str               # buffering | streaming | inconclusive
    buffered: bool
    reason: str
    burst_fraction: float | None = None
    burst_start_ms: float | None = None
    silence_before_burst_ms: float | None = None
    arrival_span_ms: float | None = None
    emission_span_ms: float | None = None
    gap_threshold_ms: float | None = None
    burst_reads: int | None = None


@dataclass
class StreamResult:
    url: str
    path: str
    status: int
    content_type: str
    headers: list[tuple[str, str]]
    headers_ms: float | None
    first_body_ms: float | None
    first_content_ms: float | None
    last_content_ms: float | None
    total_ms: float
    num_reads: int
    num_events: int
    num_content_events: int
    content_bytes: int
    reads: list[Read]
    events: list[Event]
    emission: Emission | None
    buffering: Buffering
    notes: list[str] = field(default_factory=list)


class SSEParser:
    """(event name, data) pairs from the http kit's incremental parser (zgtool.http.sse), the one SSE
    parser of the package; zgtool's timing comment comes out as a ("zgtool_timing", json) pair."""

    def __init__(self) -> None:
        self._kit = KitParser()

    def feed(self, chunk: str | bytes) -> list[tuple[str, str]]:
        out = []
        for ev in self._kit.feed(chunk.encode() if isinstance(chunk, str) else chunk):
            timing = ev.timing
            if timing is not None:        # zgtool's timing rides in an SSE comment
                out.append(("zgtool_timing", json.dumps(timing)))
            if ev.event:
                out.append((ev.event, ev.data))
        return out


def content_of(event: str, data: str) -> tuple[int, Any]:
    """(generated-content bytes, parsed JSON or None) of one SSE event, Anthropic or OpenAI."""
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, ValueError):
        return 0, None
    if not isinstance(obj, dict):
        return 0, obj
    delta = obj.get("delta")
    if (event == "content_block_delta" or obj.get("type") == "content_block_delta") and isinstance(delta, dict):
        text = delta.get("text") or delta.get("partial_json") or delta.get("thinking") or ""
        return len(str(text).encode()), obj
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        d = choices[0].get("delta") or {}
        text = (d.get("content") or "") if isinstance(d, dict) else ""
        return len(str(text).encode()), obj
    return 0, obj


def find_emission(obj: Any, depth: int = 0) -> Emission | None:
    """The server's per-token emission times, wherever in the event's JSON they sit."""
    if depth > 4:
        return None
    if isinstance(obj, dict):
        for key, scale in EMISSION_KEYS.items():
            vals = obj.get(key)
            if isinstance(vals, list) and len(vals) >= 2 and all(isinstance(v, int | float) for v in vals):
                base = float(vals[0])
                times = [(float(v) - base) * scale for v in vals]
                return Emission(key, times, max(times) - min(times))
        for v in obj.values():
            found = find_emission(v, depth + 1)
            if found:
                return found
        ttft, total = obj.get("ttft_ms"), obj.get("total_ms")
        if isinstance(ttft, int | float) and isinstance(total, int | float) and total >= ttft:
            # zgtool's timing event: first token at ttft_ms, the last no later than total_ms
            return Emission("ttft_ms..total_ms", [0.0, float(total - ttft)], float(total - ttft))
    return None


def judge(events: list[Event], first_body_ms: float | None, headers_ms: float | None,
          emission: Emission | None) -> Buffering:
    content = [e for e in events if e.content_bytes > 0]
    if len(content) < MIN_CONTENT_EVENTS:
        return Buffering("inconclusive", False, f"only {len(content)} content event(s); need {MIN_CONTENT_EVENTS}")
    total_bytes = sum(e.content_bytes for e in content)
    arrival_span = content[-1].t_ms - content[0].t_ms
    last_ms = content[-1].t_ms
    # Gaps under this are "the same burst": scheduler and socket jitter, not pacing.
    gap = max(5.0, 0.02 * last_ms)
    start = len(content) - 1
    while start > 0 and content[start].t_ms - content[start - 1].t_ms < gap:
        start -= 1
    burst = content[start:]
    burst_fraction = sum(e.content_bytes for e in burst) / total_bytes
    # silence = time without any SSE *event* before the burst; comments and padding bytes do not count
    prior = [e.t_ms for e in events if e.t_ms < burst[0].t_ms - gap]
    prior += [t for t in (headers_ms,) if t is not None and t < burst[0].t_ms - gap]
    silence = burst[0].t_ms - max(prior, default=0.0)
    # a held buffer is released in one write: its events land in one or two reads; an origin
    # that is merely fast writes event by event and the reads follow its writes
    burst_reads = len({e.t_ms for e in burst})
    flush = burst_reads <= max(FLUSH_READS, math.ceil(FLUSH_READ_FRACTION * len(burst)))
    figures: dict[str, Any] = dict(burst_fraction=round(burst_fraction, 3), burst_start_ms=round(burst[0].t_ms, 3),
                   silence_before_burst_ms=round(silence, 3), arrival_span_ms=round(arrival_span, 3),
                   gap_threshold_ms=round(gap, 3), burst_reads=burst_reads)
    if emission is not None and emission.span_ms >= MIN_EMISSION_SPAN_MS:
        figures["emission_span_ms"] = round(emission.span_ms, 3)
        if arrival_span < 0.25 * emission.span_ms:
            return Buffering("buffering", True, (
                f"the server emitted tokens over {emission.span_ms:.1f} ms but they arrived within "
                f"{arrival_span:.1f} ms: something between held them back"), **figures)
        emitted = _emitted_span(emission, len(content), len(burst))
        burst_span = burst[-1].t_ms - burst[0].t_ms
        if (burst_fraction >= BURST_FRACTION and flush and emitted >= MIN_EMISSION_SPAN_MS
                and burst_span < 0.25 * emitted):
            return Buffering("buffering", True, (
                f"{burst_fraction:.1%} of the content ({len(burst)} of {len(content)} events) arrived in one flush "
                f"({burst_reads} read(s)) at {burst[0].t_ms:.1f} ms, {silence:.1f} ms after the event before it, "
                f"though the server emitted those tokens over {emitted:.1f} ms: a hop passed the first event(s) "
                "and held the tail"), **figures)
        return Buffering("streaming", False, (
            f"tokens emitted over {emission.span_ms:.1f} ms arrived over {arrival_span:.1f} ms"), **figures)
    long_silence = silence >= max(MIN_SILENCE_MS, 0.5 * last_ms)
    if burst_fraction >= BURST_FRACTION and long_silence and flush:
        padded = first_body_ms is not None and first_body_ms < burst[0].t_ms - gap
        return Buffering("buffering", True, (
            f"{burst_fraction:.0%} of the content arrived in one flush ({burst_reads} read(s)) at "
            f"{burst[0].t_ms:.1f} ms after {silence:.1f} ms without an event"
            + ("; bytes kept arriving before it (SSE comments or padding), but the events were held"
               if padded else "")), **figures)
    if burst_fraction >= BURST_FRACTION and long_silence:
        return Buffering("streaming", False, (
            f"after {silence:.1f} ms without an event the content arrived event by event ({burst_reads} reads "
            f"for {len(burst)} events) at the origin's own pace: a slow start, not a held buffer"), **figures)
    if len(burst) < len(content) and arrival_span >= MIN_SILENCE_MS:
        return Buffering("streaming", False, (
            f"content arrived in {_count_bursts(content, gap)} bursts over {arrival_span:.1f} ms"), **figures)
    return Buffering("inconclusive", False, (
        f"the whole answer took {last_ms:.1f} ms and arrived in one burst; too fast to tell "
        "streaming from buffering without the server's emission times (ask for more tokens)"), **figures)


def _emitted_span(emission: Emission, n_content: int, n_burst: int) -> float:
    """How long the server took to emit the burst's tokens: from its own times when there is one per
    content event, else that share of its whole span."""
    times = emission.times_ms
    if len(times) == n_content and n_burst >= 1:
        return times[-1] - times[n_content - n_burst]
    return emission.span_ms * (n_burst - 1) / max(1, n_content - 1)


def _count_bursts(content: list[Event], gap: float) -> int:
    return 1 + sum(1 for a, b in zip(content, content[1:], strict=False) if b.t_ms - a.t_ms >= gap)


def probe_stream(target: Target, *, max_tokens: int = 64, timeout_s: float = 30.0,
                 insecure: bool = False) -> StreamResult:
    req = build(target, stream=True, max_tokens=max_tokens)
    conn = connection_for(target, timeout_s=timeout_s, insecure=insecure)
    parser = SSEParser()
    reads: list[Read] = []
    events: list[Event] = []
    emission = None
    body = bytearray()
    with conn:
        conn.connect()
        conn.send_request(req.method, req.path, req.headers, req.body)
        t0 = conn.timings.request_out_s or time.perf_counter()
        head = conn.read_head()
        decode = content_decoder(head)
        for piece in conn.iter_body(head):
            t_ms = (piece.t_s - t0) * 1e3
            data = decode(piece.data)
            reads.append(Read(round(t_ms, 3), piece.raw_bytes, len(data)))
            if len(body) < 4096:
                body += data
            for name, payload in parser.feed(data):
                nbytes, obj = content_of(name, payload)
                events.append(Event(round(t_ms, 3), name, nbytes))
                emission = emission or find_emission(obj)
        end_ms = (time.perf_counter() - t0) * 1e3
    t = conn.timings
    headers_ms = t.ms(t0, t.head_done_s)
    ctype = head.get("content-type") or ""
    notes = []
    if head.status >= 400:
        notes.append(f"HTTP {head.status} instead of a stream: {bytes(body[:300]).decode('utf-8', 'replace')}")
    if "event-stream" not in ctype:
        notes.append(f"the answer is {ctype or 'untyped'}, not text/event-stream: the target did not stream")
    if head.get("content-encoding"):
        notes.append(f"the answer was {head.get('content-encoding')}-compressed on the way (compressing "
                     "proxies such as nginx's gzip filter hold back stream chunks)")
    if (head.get("x-accel-buffering") or "").lower() == "no":
        notes.append("the origin sent X-Accel-Buffering: no (asks nginx-style proxies not to buffer)")
    first_body = next((r.t_ms for r in reads if r.body_bytes), None)
    content = [e for e in events if e.content_bytes > 0]
    return StreamResult(
        url=target.url, path=req.path, status=head.status, content_type=ctype, headers=head.headers,
        headers_ms=round(headers_ms, 3) if headers_ms is not None else None,
        first_body_ms=first_body,
        first_content_ms=content[0].t_ms if content else None,
        last_content_ms=content[-1].t_ms if content else None,
        total_ms=round(end_ms, 3), num_reads=len(reads), num_events=len(events),
        num_content_events=len(content), content_bytes=sum(e.content_bytes for e in content),
        reads=reads, events=events, emission=emission,
        buffering=judge(events, first_body, headers_ms, emission), notes=notes)
