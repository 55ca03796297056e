"""The runner's block layout as a server sees it (issue 25): every block arrives on connections of its
own, so per-connection effects are resampled with the rounds instead of riding one path all run."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from zgtool.latency.config import SplitConfig
from zgtool.latency.schedule.runner import measure_targets
from zgtool.targets import Target

ANSWER = json.dumps({"id": "m", "type": "message", "role": "assistant", "model": "m",
                     "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                     "usage": {"input_tokens": 3, "output_tokens": 1}}).encode()


class _Counting(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.lock = threading.Lock()
        self.requests_by_conn: dict[int, int] = {}     # client port -> requests it carried, in order seen
        self.order: list[int] = []                      # client port of every request, in arrival order


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Counting

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers.get("content-length", 0)))
        with self.server.lock:
            port = self.client_address[1]
            self.server.requests_by_conn[port] = self.server.requests_by_conn.get(port, 0) + 1
            self.server.order.append(port)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def counting() -> Iterator[_Counting]:
    srv = _Counting()
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def _run(srv: _Counting, **kw: object) -> SplitConfig:
    cfg = SplitConfig(**{"num_requests": 12, "stream": False, "warmup": 0, "rounds": 4,  # type: ignore[arg-type]
                         "resamples": 100, **kw})
    (samples,) = measure_targets([Target("t", f"http://127.0.0.1:{srv.server_address[1]}")], cfg)
    assert len(samples) == 12 and all(s.ok for s in samples), [s.error for s in samples]
    return cfg


def test_every_block_arrives_on_a_fresh_connection_warmed_by_one_unmeasured_request(counting: _Counting) -> None:
    _run(counting)
    # 4 blocks of 3 at c=1: 4 connections, each carrying its warm-up request and its block's 3
    assert sorted(counting.requests_by_conn.values()) == [4, 4, 4, 4]
    # and never interleaved: one block's connection is done before the next block's starts
    runs = [p for i, p in enumerate(counting.order) if i == 0 or counting.order[i - 1] != p]
    assert len(runs) == 4


def test_concurrent_workers_each_get_a_fresh_connection_per_block(counting: _Counting) -> None:
    _run(counting, concurrency=3)
    # 4 blocks x 3 workers: 12 connections, each warmed once; 12 measured + 12 warm-up requests
    assert len(counting.requests_by_conn) == 12
    assert sum(counting.requests_by_conn.values()) == 24


def test_the_earlier_design_keeps_one_connection_for_the_whole_run(counting: _Counting) -> None:
    _run(counting, fresh_connections=False)
    assert list(counting.requests_by_conn.values()) == [12]


def test_new_connection_mode_sends_no_warm_up_requests(counting: _Counting) -> None:
    _run(counting, new_connection=True)
    assert sorted(counting.requests_by_conn.values()) == [1] * 12
