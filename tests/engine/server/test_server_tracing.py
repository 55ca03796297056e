"""Trace context through the engine (issue 23): an incoming W3C traceparent is echoed as what
reached the engine (x-zgtool-trace-id, x-zgtool-parent-span-id, the access log), and with
--otlp-endpoint one OTLP/HTTP JSON span per request arrives at a real local receiver, in the
caller's trace, child of the caller's span, with vLLM's GenAI attribute names in seconds."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from zgtool.engine.server.tracing import parse_traceparent, traces_url
from zgtool.http.net import free_port

ANTH = {"anthropic-version": "2023-06-01"}
BODY = {"model": "null", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
LATENCY = ("gen_ai.latency.time_in_queue", "gen_ai.latency.time_to_first_token",
           "gen_ai.latency.time_in_model_prefill", "gen_ai.latency.time_in_model_decode", "gen_ai.latency.e2e")


class Receiver:
    """An OTLP/HTTP JSON collector: every span posted to /v1/traces, by trace id."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.cond = threading.Condition()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["content-length"]))
                doc = json.loads(body)
                with outer.cond:
                    outer.paths.append(self.path)
                    for rs in doc["resourceSpans"]:
                        for ss in rs["scopeSpans"]:
                            outer.spans.extend(ss["spans"])
                    outer.cond.notify_all()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def wait_for(self, trace_id: str, timeout_s: float = 15.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while True:
                for s in self.spans:
                    if s["traceId"] == trace_id:
                        return s
                left = deadline - time.monotonic()
                assert left > 0, f"no span for trace {trace_id}; got {[s['traceId'] for s in self.spans]}"
                self.cond.wait(left)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def traced(start_server, receiver, tmp_path_factory):
    log = tmp_path_factory.mktemp("trace") / "access.jsonl"
    with start_server(otlp_endpoint=receiver.url, access_log=log) as s:
        s.access_path = log
        yield s


def _traceparent() -> tuple[str, str, str]:
    tid, sid = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{tid}-{sid}-01", tid, sid


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for a in span["attributes"]:
        (kind, value), = a["value"].items()
        out[a["key"]] = int(value) if kind == "intValue" else value
    return out


def test_a_request_span_arrives_in_the_callers_trace_with_genai_latency_attributes(traced, receiver):
    tp, tid, sid = _traceparent()
    r = httpx.post(traced.url + "/v1/messages", json=BODY, timeout=30,
                   headers={**ANTH, "traceparent": tp, "tracestate": "vendor=abc"})
    assert r.status_code == 200
    assert r.headers["x-zgtool-trace-id"] == tid and r.headers["x-zgtool-parent-span-id"] == sid
    span = receiver.wait_for(tid)
    assert receiver.paths[0] == "/v1/traces"
    assert span["parentSpanId"] == sid and span["spanId"] != sid and len(span["spanId"]) == 16
    assert span["name"] == "llm_request" and span["kind"] == 2 and span["traceState"] == "vendor=abc"
    attrs = _attrs(span)
    for key in LATENCY:
        assert isinstance(attrs[key], float) and attrs[key] >= 0, key
    assert attrs["gen_ai.latency.time_to_first_token"] <= attrs["gen_ai.latency.e2e"]
    # seconds, the same phases as Server-Timing's ms
    timing = {p.split(";dur=")[0].strip(): float(p.split(";dur=")[1]) for p in r.headers["server-timing"].split(",")}
    assert attrs["gen_ai.latency.time_in_model_decode"] == pytest.approx(timing["decode"] / 1e3, abs=1e-5)
    assert attrs["gen_ai.usage.completion_tokens"] == r.json()["usage"]["output_tokens"]
    assert attrs["gen_ai.usage.prompt_tokens"] == r.json()["usage"]["input_tokens"]
    assert attrs["gen_ai.request.max_tokens"] == 4 and attrs["gen_ai.request.model"] == "null"
    assert attrs["gen_ai.request.id"] == r.headers["x-request-id"]
    assert int(span["startTimeUnixNano"]) < int(span["endTimeUnixNano"])
    # the access log names the trace that reached the engine
    rid = r.headers["x-request-id"].removeprefix("inference-")
    deadline = time.monotonic() + 10
    while True:
        rows = [json.loads(x) for x in traced.access_path.read_text().splitlines() if x.strip()] \
            if traced.access_path.exists() else []
        row = next((x for x in rows if x.get("request_id") == rid), None)
        if row is not None or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert row is not None and row["trace_id"] == tid and row["parent_span_id"] == sid


def test_a_streamed_openai_request_gets_its_span_too(traced, receiver):
    tp, tid, sid = _traceparent()
    body = {"model": "null", "max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", traced.url + "/v1/chat/completions", json=body, headers={"traceparent": tp},
                      timeout=30) as r:
        assert r.status_code == 200 and r.headers["x-zgtool-trace-id"] == tid
        text = "".join(r.iter_text())
    assert "[DONE]" in text
    span = receiver.wait_for(tid)
    assert span["parentSpanId"] == sid and _attrs(span)["gen_ai.request.stream"] is True


def test_without_a_traceparent_the_span_starts_a_new_trace_and_nothing_is_echoed(traced, receiver):
    before = len(receiver.spans)
    r = httpx.post(traced.url + "/v1/messages", json=BODY, headers=ANTH, timeout=30)
    assert r.status_code == 200 and "x-zgtool-trace-id" not in r.headers
    deadline = time.monotonic() + 15
    rid = r.headers["x-request-id"]
    span = None
    while span is None and time.monotonic() < deadline:
        with receiver.cond:
            span = next((s for s in receiver.spans[before:] if _attrs(s)["gen_ai.request.id"] == rid), None)
            if span is None:
                receiver.cond.wait(0.5)
    assert span is not None and "parentSpanId" not in span and len(span["traceId"]) == 32


@pytest.mark.parametrize("bad", [
    "00-" + "0" * 32 + "-" + "1" * 16 + "-01",     # all-zero trace id
    "00-" + "1" * 32 + "-" + "0" * 16 + "-01",     # all-zero span id
    "ff-" + "1" * 32 + "-" + "1" * 16 + "-01",     # version ff
    "00-" + "1" * 31 + "-" + "1" * 16 + "-01",     # short
    "00-" + "A" * 32 + "-" + "1" * 16 + "-01",     # uppercase is invalid
    "00-" + "1" * 32 + "-" + "1" * 16 + "-01-extra",  # version 00 has exactly four fields
])
def test_an_invalid_traceparent_is_ignored(server, bad: str):
    assert parse_traceparent(bad.encode()) is None
    r = httpx.post(server.url + "/v1/messages", json=BODY, headers={**ANTH, "traceparent": bad}, timeout=30)
    assert r.status_code == 200 and "x-zgtool-trace-id" not in r.headers


def test_a_future_version_traceparent_is_read_by_its_first_four_fields():
    ctx = parse_traceparent(b"01-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01-more", b" k=v ")
    assert ctx is not None and ctx.trace_id == "a" * 32 and ctx.tracestate == "k=v"


def test_the_trace_id_is_echoed_on_errors_and_without_an_exporter(server):
    tp, tid, _ = _traceparent()
    r = httpx.post(server.url + "/v1/messages", json={"model": "nope", "max_tokens": 1, "messages": []},
                   headers={**ANTH, "traceparent": tp}, timeout=30)
    assert r.status_code in (400, 404) and r.headers["x-zgtool-trace-id"] == tid


def test_a_collector_that_is_down_never_fails_a_request(start_server):
    with start_server(otlp_endpoint=f"http://127.0.0.1:{free_port()}") as s:
        tp, _, _ = _traceparent()
        for _ in range(3):
            r = httpx.post(s.url + "/v1/messages", json=BODY, headers={**ANTH, "traceparent": tp}, timeout=30)
            assert r.status_code == 200


def test_the_otlp_url_gets_the_traces_path_only_when_given_a_base():
    assert traces_url("http://c:4318") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert traces_url("http://c:4318/custom/v1/traces") == "http://c:4318/custom/v1/traces"
    with pytest.raises(ValueError):
        traces_url("c:4318")
