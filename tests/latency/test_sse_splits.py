"""One SSE parser everywhere: latency-split's stream reader and the stream probe cut the same events out of a
CRLF stream whichever byte a read ends on (the old reader merged/lost events when a CRLF was split)."""

from __future__ import annotations

import json

import pytest

from zgtool.latency.attribution.adapters import Evidence
from zgtool.latency.wire.stream_reader import read_stream as _read_stream
from zgtool.probes.stream import SSEParser as ProbeParser


def _openai_crlf() -> bytes:
    chunks = [{"choices": [{"index": 0, "delta": {"content": t}}]} for t in ("Hel", "lo", " there", "!")]
    chunks.append({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4},
                   "metrics": {"queue_time_ms": 0.5, "time_to_first_token_ms": 3.0, "generation_time_ms": 9.0}})
    body = b"".join(b"data: " + json.dumps(c).encode() + b"\r\n\r\n" for c in chunks)
    return b": zgtool-timing {\"total_ms\": 12.5}\r\n\r\n" + body + b"data: [DONE]\r\n\r\n"


def _anthropic_crlf() -> bytes:
    evs = [("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 7}}}),
           *[("content_block_delta", {"type": "content_block_delta", "delta": {"text": t}}) for t in ("a", "b", "c")],
           ("message_delta", {"type": "message_delta", "usage": {"output_tokens": 3}}),
           ("message_stop", {"type": "message_stop"})]
    return b"".join(f"event: {n}\r\ndata: {json.dumps(d)}\r\n\r\n".encode() for n, d in evs)


def _read(raw: bytes, api: str, cut: int) -> tuple:
    content: list[int] = []
    ev = Evidence(stream=True)
    err, parts, tokens, prompt = _read_stream([raw[:cut], raw[cut:]], api, content, None, ev)
    return err, parts, tokens, prompt, len(content), ev.fields.get("metrics")


@pytest.mark.parametrize(("api", "raw"), [("openai", _openai_crlf()), ("anthropic", _anthropic_crlf())])
def test_latency_reader_sees_every_event_at_every_split_point(api: str, raw: bytes) -> None:
    whole = _read(raw, api, len(raw))
    assert whole[0] is None and whole[4] in (3, 4)
    bad = [cut for cut in range(1, len(raw)) if _read(raw, api, cut) != whole]
    assert bad == []


def test_the_stream_reader_keeps_the_final_chunks_engine_metrics_and_the_timing_comment() -> None:
    err, parts, tokens, prompt, n, metrics = _read(_openai_crlf(), "openai", 7)
    assert (err, parts, tokens, prompt, n) == (None, {"total": 12.5}, 4, 5, 4)
    assert metrics["generation_time_ms"] == 9.0


def test_probe_parser_sees_every_event_at_every_split_point() -> None:
    raw = _openai_crlf()
    whole = ProbeParser().feed(raw)
    assert len(whole) == 7 and whole[0][0] == "zgtool_timing"
    for cut in range(1, len(raw)):
        p = ProbeParser()
        assert p.feed(raw[:cut]) + p.feed(raw[cut:]) == whole, cut
