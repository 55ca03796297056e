"""The prefix-cache hit rate from /metrics counter deltas: vLLM's names (exposed by prometheus_client as
vLLM does, with the _total suffix, one series per engine) and zgtool's, read from a real local HTTP server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from zgtool.workload.prefix_cache import PrefixWatch, metrics_url, parse


def _vllm_registry() -> tuple[CollectorRegistry, Counter, Counter]:
    reg = CollectorRegistry()
    labels = ["model_name", "engine"]
    hits = Counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", labels,
                   registry=reg)
    queries = Counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                      labels, registry=reg)
    return reg, hits, queries


@pytest.fixture
def vllm_metrics() -> Iterator[tuple[str, Counter, Counter]]:
    reg, hits, queries = _vllm_registry()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = generate_latest(reg)
            self.send_response(200)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return None

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/metrics", hits, queries
    finally:
        srv.shutdown()
        srv.server_close()


def test_parse_vllm_counters_summed_over_engines() -> None:
    reg, hits, queries = _vllm_registry()
    for engine, (h, q) in {"0": (30, 100), "1": (10, 60)}.items():
        hits.labels("m", engine).inc(h)
        queries.labels("m", engine).inc(q)
    text = generate_latest(reg).decode()
    assert "vllm:prefix_cache_hits_total{" in text
    c = parse(text)
    assert c is not None and (c.hits, c.queries, c.source) == (40.0, 160.0, "vLLM")


def test_parse_zgtool_counters_and_absent_ones() -> None:
    text = ('# TYPE zg_prefix_cache_queries_total counter\nzg_prefix_cache_queries_total{model_name="m"} 50.0\n'
            'zg_prefix_cache_hits_total{model_name="m"} 20.0\nzg_num_requests_running{model_name="m"} 1.0\n')
    c = parse(text)
    assert c is not None and (c.hits, c.queries, c.source) == (20.0, 50.0, "zgtool")
    assert parse("zg_num_requests_running 1.0\n") is None


class _Sample:
    def __init__(self, index: int) -> None:
        self.index = index


def test_watch_attributes_each_block_to_its_target(vllm_metrics: tuple[str, Counter, Counter]) -> None:
    url, hits, queries = vllm_metrics

    def engine_sees(h: int, q: int) -> None:
        hits.labels("m", "0").inc(h)
        queries.labels("m", "0").inc(q)

    engine_sees(500, 900)                   # before the run: not counted
    w = PrefixWatch([url, "http://127.0.0.1:9/metrics"])    # one that does not answer is left out
    direct, gateway = w.hooks(None, ["direct", "gateway"], [2, 1])   # -n 3 in two rounds: blocks of 2, 1
    # round 0: direct then gateway; round 1: gateway then direct (as the runner alternates)
    for hook, indices, (h, q) in ((direct, (0, 1), (0, 40)), (gateway, (0, 1), (30, 40)),
                                  (gateway, (2,), (20, 20)), (direct, (2,), (20, 20))):
        tokens = [hook.before() for _ in indices]
        engine_sees(h, q)
        for t, i in zip(tokens, indices, strict=True):
            hook.after(t, _Sample(i))
        engine_sees(7, 7)                   # the next block's connection warm-up: between blocks, left out
    w.finish()
    (row,) = w.result()
    assert row["url"] == url and row["source"] == "vLLM"
    assert (row["hit_tokens"], row["query_tokens"]) == (70.0, 120.0)
    assert row["targets"] == {"direct": {"hit_tokens": 20.0, "query_tokens": 60.0, "hit_rate": 20 / 60},
                              "gateway": {"hit_tokens": 50.0, "query_tokens": 60.0, "hit_rate": 50 / 60}}


def test_metrics_url_of_a_target() -> None:
    assert metrics_url("http://h:8000/v1") == "http://h:8000/metrics"
    assert metrics_url("https://h/") == "https://h/metrics"
