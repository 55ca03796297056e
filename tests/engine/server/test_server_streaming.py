"""Streaming: incremental arrival, stream headers, timing event, grouping, disconnect aborts."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from zgtool.http.sse import SSEParser

MSGS = [{"role": "user", "content": "Tell me a story"}]
TIMING_PARTS = ("queue", "prefill", "decode", "detok", "safety")


@pytest.fixture(scope="module")
def tiny(start_server: Any) -> Iterator[Any]:
    """A real (random-weight) model: each token costs a real forward pass."""
    with start_server(model="dummy:tiny") as s:
        yield s


def _events(raw: str) -> list[tuple[str | None, str]]:
    out = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        name = None
        data = ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        out.append((name, data))
    return out


def _server_timing(header: str) -> dict[str, float]:
    parts = {}
    for item in header.split(","):
        name, _, dur = item.strip().partition(";dur=")
        parts[name] = float(dur)
    return parts


def test_a_32_token_stream_arrives_in_several_reads_at_distinct_times(tiny: Any) -> None:
    body = {"model": "dummy:tiny", "max_tokens": 32, "stream": True, "ignore_eos": True, "messages": MSGS}
    arrivals = []
    with httpx.stream("POST", tiny.url + "/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-cache" and r.headers["x-accel-buffering"] == "no"
        for chunk in r.iter_raw():
            arrivals.append((time.perf_counter(), chunk))
    times = sorted({round(t, 4) for t, _ in arrivals})
    assert len(arrivals) >= 8 and len(times) >= 8
    content = [e for e in _events(b"".join(c for _, c in arrivals).decode()) if '"content"' in e[1]]
    assert len(content) >= 8       # tokens that decode to no text (specials, partial UTF-8) send nothing


def test_stream_timing_event_comes_before_message_stop_and_parts_fit_the_total(tiny: Any) -> None:
    body = {"model": "dummy:tiny", "max_tokens": 8, "stream": True, "messages": MSGS}
    r = httpx.post(tiny.url + "/v1/messages", json=body)
    events = _events(r.text)
    names = [n for n, _ in events if n is not None]        # the timing block is a comment: no name
    assert names[-2:] == ["message_delta", "message_stop"]
    timing = next(ev.timing for ev in SSEParser().feed(r.content) if ev.timing is not None)
    assert all(f"{p}_ms" in timing for p in TIMING_PARTS)
    assert sum(timing[f"{p}_ms"] for p in TIMING_PARTS) <= timing["total_ms"]
    assert 0 < timing["ttft_ms"] <= timing["total_ms"]
    assert timing["request_id"] == r.headers["x-request-id"]


def test_server_timing_parts_are_present_and_sum_to_no_more_than_total(tiny: Any) -> None:
    r = httpx.post(tiny.url + "/v1/messages", json={"model": "dummy:tiny", "max_tokens": 8, "messages": MSGS})
    assert r.status_code == 200
    parts = _server_timing(r.headers["server-timing"])
    assert set(parts) == {*TIMING_PARTS, "total"}
    assert parts["prefill"] > 0 and parts["total"] > 0
    assert sum(parts[p] for p in TIMING_PARTS) <= parts["total"]


def test_load_hint_reports_kv_and_queue_but_no_invented_gpu_numbers_on_cpu(tiny: Any) -> None:
    r = httpx.get(tiny.url + "/health")
    hint = json.loads(r.headers["x-gpu-load-hint"])
    assert {"kv_util", "running", "waiting", "cap_factor"} <= set(hint)
    if tiny.engine.device == "cpu":
        assert "sm_util" not in hint and "vram_free_gb" not in hint


def test_disconnect_mid_stream_aborts_and_frees_every_kv_block(tiny: Any) -> None:
    body = json.dumps({"model": "dummy:tiny", "max_tokens": 900, "stream": True, "ignore_eos": True,
                       "messages": MSGS}).encode()
    abort = {"finished_reason": "abort"}
    before = tiny.metric("zg_request_success_total", 0.0, **abort)
    with socket.create_connection(("127.0.0.1", tiny.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while got.count(b'"content"') < 4:
            got += s.recv(65536)
        assert tiny.engine.stats()["kv_blocks_used"] > 0
    stats = tiny.wait_idle()
    assert stats["kv_blocks_used"] == 0 and stats["running"] == 0
    assert tiny.metric("zg_kv_blocks_used") == 0
    assert tiny.wait_metric("zg_request_success_total", before + 1, **abort) == before + 1
    assert tiny.metric("zg_generation_tokens_total") < 900


def test_stream_interval_groups_tokens_but_sends_the_first_alone(start_server: Any) -> None:
    with start_server(stream_interval=4) as s:
        r = httpx.post(s.url + "/v1/messages", json={"model": "null", "max_tokens": 13, "stream": True,
                                                     "messages": MSGS})
    deltas = [json.loads(d)["delta"]["text"] for n, d in _events(r.text) if n == "content_block_delta"]
    assert [len(d) for d in deltas] == [1, 4, 4, 4]
    assert "".join(deltas) == "Hello from the zgtool null model. "[:13]
