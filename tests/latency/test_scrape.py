"""The one Prometheus scraper (zgtool.latency.attribution.scrape): prometheus_client's own exposition parsed
as it wrote it, and a /metrics that is slow or huge bounded in time and bytes, the run going on."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from zgtool.latency.attribution.scrape import Limits, Scraper, parse


def _exposition() -> bytes:
    reg = CollectorRegistry()
    h = Histogram("vllm:e2e_request_latency_seconds", "e2e", ("model_name",), registry=reg)
    h.labels("m").observe(0.25)
    h.labels('quote"d\\').observe(0.5)
    Gauge("vllm:num_requests_running", "running", ("model_name",), registry=reg).labels("m").set(3)
    Counter("vllm:prompt_tokens", "prompt", registry=reg).inc(7)
    Histogram("vllm:request_queue_time_seconds", "queue", registry=reg)      # declared, never observed
    return generate_latest(reg)


class _Handler(BaseHTTPRequestHandler):
    mode = "ok"

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        mode = type(self).mode
        self.send_response(200)
        self.send_header("content-type", "text/plain; version=0.0.4")
        self.end_headers()
        if mode == "ok":
            self.wfile.write(_exposition())
        elif mode == "slow":                         # a line every 0.2 s, for ever
            for i in range(10_000):
                try:
                    self.wfile.write(f"slow_metric {i}\n".encode())
                    self.wfile.flush()
                except OSError:
                    return
                time.sleep(0.2)
        elif mode == "huge":
            line = b"huge_metric{a=\"" + b"x" * 200 + b"\"} 1\n"
            try:
                for _ in range(200_000):
                    self.wfile.write(line)
            except OSError:
                return

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def metrics_server() -> Iterator[tuple[str, type[_Handler]]]:
    handler = type("H", (_Handler,), {})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/metrics", handler
    finally:
        srv.shutdown()
        srv.server_close()


def test_prometheus_clients_exposition_reads_back_as_written(metrics_server: tuple[str, type[_Handler]]) -> None:
    url, _ = metrics_server
    s = Scraper(url).scrape()
    assert s.ok and s.elapsed_s < 2.0
    assert s.histogram("vllm:e2e_request_latency_seconds") == (0.75, 2.0)
    assert s.value("vllm:e2e_request_latency_seconds_count", model_name='quote"d\\') == 1.0
    assert s.value("vllm:num_requests_running", model_name="m") == 3.0
    assert s.value("vllm:prompt_tokens_total") == 7.0
    assert s.histogram("vllm:request_queue_time_seconds") == (0.0, 0.0)
    assert s.histogram("vllm:absent") is None and s.value("vllm:absent") is None


def test_a_slow_metrics_page_is_cut_at_the_time_limit_and_the_caller_goes_on(
        metrics_server: tuple[str, type[_Handler]]) -> None:
    url, handler = metrics_server
    handler.mode = "slow"
    t0 = time.perf_counter()
    s = Scraper(url, Limits(timeout_s=0.5)).scrape()
    assert not s.ok and s.error is not None and "timed out after 0.5 s" in s.error and s.samples == ()
    assert time.perf_counter() - t0 < 1.5


def test_a_huge_metrics_page_is_cut_at_the_byte_limit(metrics_server: tuple[str, type[_Handler]]) -> None:
    url, handler = metrics_server
    handler.mode = "huge"
    s = Scraper(url, Limits(timeout_s=10.0, max_bytes=1 << 20)).scrape()
    assert not s.ok and s.error == f"over {1 << 20} bytes"


def test_an_unreachable_metrics_page_is_an_error_not_an_exception() -> None:
    from zgtool.http.net import free_port

    s = Scraper(f"http://127.0.0.1:{free_port()}/metrics", Limits(timeout_s=1.0)).scrape()
    assert not s.ok and s.error is not None and s.error.startswith("unreachable")


def test_malformed_lines_are_skipped() -> None:
    samples, types = parse("# TYPE a counter\na_total 1\nno_value\nb{x=\"1\"} notanumber\nc 2 1700000000\n")
    assert [(x.name, x.value) for x in samples] == [("a_total", 1.0), ("c", 2.0)] and types == {"a": "counter"}
