"""pygw's own /metrics (Prometheus text, parsed with prometheus_client's parser): requests by
route and status, the upstream latency and pygw overhead histograms, and the retries it made,
counted against what was sent to a real pygw in front of the fake upstream."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from gw_fake_upstream import FakeUpstream
from prometheus_client.parser import text_string_to_metric_families

A_HDRS = {"x-api-key": "sk-anything", "anthropic-version": "2023-06-01"}


def _msg(text: str, **kw: Any) -> dict:
    return {"model": "null", "max_tokens": 3, "messages": [{"role": "user", "content": text}], **kw}


def _samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def test_metrics_count_requests_latencies_and_retries(start_pygw: Any, upstream: FakeUpstream) -> None:
    gw = start_pygw(upstream.url, "--max-retries", "2")
    for i in range(2):
        assert httpx.post(gw + "/v1/messages", json=_msg(f"ok {i} {uuid.uuid4().hex}"), headers=A_HDRS).status_code == 200
    retried = httpx.post(gw + "/v1/messages", json=_msg(f"FAIL529 n=1 {uuid.uuid4().hex}"), headers=A_HDRS)
    assert retried.status_code == 200 and retried.headers["x-gateway-retries"] == "1"
    chat = {"model": "null", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(gw + "/v1/chat/completions", json=chat, headers=A_HDRS).status_code == 200
    assert httpx.get(gw + "/no/such/route").status_code == 404
    m = _samples(gw)
    assert m[("pygw_requests_total", (("route", "/v1/messages"), ("status", "200")))] == 3
    assert m[("pygw_requests_total", (("route", "/v1/chat/completions"), ("status", "200")))] == 1
    assert m[("pygw_requests_total", (("route", "other"), ("status", "404")))] == 1
    assert m[("pygw_upstream_latency_seconds_count", ())] == 4
    assert m[("pygw_overhead_seconds_count", ())] == 4
    assert m[("pygw_overhead_seconds_sum", ())] > 0 and m[("pygw_upstream_latency_seconds_sum", ())] > 0
    assert m[("pygw_upstream_retries_total", ())] == 1


def test_retries_stay_at_zero_by_default(start_pygw: Any, upstream: FakeUpstream) -> None:
    gw = start_pygw(upstream.url)
    text = f"FAIL529 n=1 {uuid.uuid4().hex}"
    assert httpx.post(gw + "/v1/messages", json=_msg(text), headers=A_HDRS).status_code == 529
    m = _samples(gw)
    assert m[("pygw_upstream_retries_total", ())] == 0 and upstream.calls[text] == 1
    assert m[("pygw_requests_total", (("route", "/v1/messages"), ("status", "529")))] == 1
