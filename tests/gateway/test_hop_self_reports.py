"""Each gateway zgtool configures reports its own hop times the way vendors do, beside the engine's
Server-Timing (kept whole, appended to): checked on the real gateways in front of the real engine
(`--model null`), non-streamed, against the client's own clock and the engine's own total.

    nginx    Server-Timing nginx-upstream-header ($upstream_header_time), nginx ($request_time)
    haproxy  Server-Timing haproxy-request (%TR), -queue (%Tw), -connect (%Tc), -upstream-header (%Tr)
    caddy    Server-Timing caddy-upstream-header (upstream latency_ms), caddy (request duration_ms)
    varnish  Server-Timing varnish-upstream-header (bereq.time -> beresp.time), varnish (req.time -> now)
    pygw     Server-Timing gw_* phases; gw_upstream holds the upstream call
    stack    nginx's entries and pygw's
    litellm  x-litellm-overhead-duration-ms (LiteLLM's own header; it excludes the upstream call)
    squid    nothing per response: its access log's response time (%tr) is the only self-report
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from zgtool.gateway.kinds import Gateway, start_gateway
from zgtool.latency.attribution.servertiming import server_timing_ms

ENGINE_PARTS = {"queue", "prefill", "decode", "total"}
# kind -> (its entry that spans the upstream call, its other entries, the resolution of its figures in ms)
SELF = {
    "nginx": ("nginx-upstream-header", {"nginx"}, 1.0),
    "haproxy": ("haproxy-upstream-header", {"haproxy-request", "haproxy-queue", "haproxy-connect"}, 1.0),
    "caddy": ("caddy-upstream-header", {"caddy"}, 0.001),
    "varnish": ("varnish-upstream-header", {"varnish"}, 0.001),
    "pygw": ("gw_upstream", {"gw_total", "gw_auth"}, 0.001),
    "stack": ("nginx-upstream-header", {"nginx", "gw_upstream", "gw_total"}, 1.0),
}
BODY = {"model": "null", "max_tokens": 16, "messages": [{"role": "user", "content": "time me"}]}


@pytest.fixture(scope="module")
def engine(null_engine: str) -> str:
    return null_engine      # the session's (tests/conftest.py): LiteLLM in front of it starts once


def _timed_post(client: httpx.Client, url: str, body: dict) -> tuple[httpx.Response, float]:
    t0 = time.perf_counter()
    r = client.post(url, json=body, headers={"authorization": "Bearer sk-test"})
    return r, (time.perf_counter() - t0) * 1e3


@pytest.mark.parametrize("kind", sorted(SELF))
def test_each_gateway_reports_its_hop_within_the_clients_total_and_around_the_engines(
        engine: str, kind: str, tmp_path: Path) -> None:
    spans, others, res_ms = SELF[kind]
    with start_gateway(kind, engine, tmp_path / kind) as gw, httpx.Client(timeout=60) as client:
        client.post(gw.url + "/v1/messages", json=BODY)  # warm: connections open on every hop
        for _ in range(5):
            r, client_ms = _timed_post(client, gw.url + "/v1/messages", BODY)
            assert r.status_code == 200, r.text
            values = r.headers.get_list("server-timing")
            timing = server_timing_ms(values)
            assert ENGINE_PARTS <= set(timing), values  # the engine's own parts kept
            assert values[0].split(",")[0].split(";")[0].strip() in ENGINE_PARTS, values  # and first
            assert {spans, *others} <= set(timing), values
            hop = timing[spans]
            assert hop <= client_ms + res_ms, (values, client_ms)
            assert hop >= timing["total"] - res_ms, values  # the upstream call holds the engine's work
            for name in others:
                assert timing[name] <= client_ms + res_ms, (name, values, client_ms)


def test_litellm_states_its_own_overhead_within_the_clients_total(litellm_before_null: Gateway) -> None:
    gw = litellm_before_null
    with httpx.Client(timeout=60) as client:
        body = {"model": "null", "max_tokens": 16, "messages": [{"role": "user", "content": "time me"}]}
        client.post(gw.url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer sk"})
        r, client_ms = _timed_post(client, gw.url + "/v1/chat/completions", body)
        assert r.status_code == 200, r.text
        assert 0 <= float(r.headers["x-litellm-overhead-duration-ms"]) <= client_ms
