"""latency-split --otlp-listen: an OpenAI server that reports its timing only as OTLP spans (as vLLM with
--otlp-traces-endpoint does) gets every request's engine phases joined by trace id."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.server.tracing import export_body, make_span, parse_traceparent
from zgtool.commands.latency import run
from zgtool.commands.latency_options import parse_split_options


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _SpanOnlyServer(BaseHTTPRequestHandler):
    """Chat completions without any in-band timing; one OTLP/JSON span per request, posted after it."""

    protocol_version = "HTTP/1.1"
    otlp_url = ""
    seen_traces: list[str] = []

    def do_POST(self) -> None:  # noqa: N802
        t0 = time.time_ns()
        self.rfile.read(int(self.headers["Content-Length"]))
        ctx = parse_traceparent(self.headers.get("traceparent", "").encode() or None)
        body = json.dumps({"id": "x", "object": "chat.completion", "model": "m", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()
        time.sleep(0.002)
        t1 = time.time_ns()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        if ctx is None:
            return
        self.seen_traces.append(ctx.trace_id)
        e2e = (t1 - t0) / 1e9
        span = make_span(ctx, "llm_request", t0, t1, {
            "gen_ai.latency.time_in_queue": 0.0, "gen_ai.latency.time_in_model_prefill": e2e / 2,
            "gen_ai.latency.time_in_model_decode": e2e / 2, "gen_ai.latency.e2e": e2e,
            "gen_ai.latency.time_to_first_token": e2e / 2})
        import urllib.request

        req = urllib.request.Request(self.otlp_url, data=export_body([span], "t"), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()

    def log_message(self, *a: object) -> None:
        pass


@pytest.fixture
def span_only_server() -> Iterator[tuple[str, int]]:
    otlp_port = _free_port()
    handler = type("H", (_SpanOnlyServer,), {"otlp_url": f"http://127.0.0.1:{otlp_port}/v1/traces",
                                              "seen_traces": []})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", otlp_port
    srv.shutdown()
    srv.server_close()
    t.join()


def test_every_request_gets_the_engine_phases_of_the_span_in_its_trace(span_only_server: tuple[str, int]) -> None:
    url, otlp_port = span_only_server
    result = run(parse_split_options([url], requests=6, warmup=0, stream=False, api="openai", model="m",
                                     as_json=True, otlp_listen=str(otlp_port)))
    (target,) = result["data"]["targets"]
    ok = [s for s in target["samples"] if s["ok"]]
    assert len(ok) == 6
    for s in ok:
        assert s["engine"]["source"] == "vLLM OTLP span", s
        assert s["engine"]["total_ms"] <= s["total_ms"]
        assert s["trace_id"] and len(s["trace_id"]) == 32
    path = result["data"]["join"]["paths"][target["name"]]
    assert path["engine_sources"] == {"vLLM OTLP span": 6}
    assert path["remainder_ms"]["n"] == 6 and path["flagged"] == 0
    rows = result["data"]["join"]["requests"][target["name"]]
    assert all(r["engine_source"] == "vLLM OTLP span" and r["remainder_ms"] is not None for r in rows)


def test_a_taken_port_is_a_usage_error(span_only_server: tuple[str, int]) -> None:
    from zgtool.errors import UsageError

    url, _ = span_only_server
    port = int(url.rsplit(":", 1)[1])
    with pytest.raises(UsageError, match="--otlp-listen"):
        run(parse_split_options([url], requests=1, warmup=0, stream=False, api="openai", model="m",
                                as_json=True, otlp_listen=str(port)))
