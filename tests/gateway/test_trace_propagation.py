"""What each gateway kind `zgtool gateway --kind` starts does to a client's W3C trace context,
judged from what reached the real engine (its access log's trace_id / parent_span_id) by
zgtool.gateway.propagation, with the verdict each kind is expected to get and why."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from litellm_live import front
from zgtest import poll

from zgtool.gateway.kinds import GATEWAY_KINDS
from zgtool.gateway.propagation import Propagation, TraceParent, propagation_verdict

# kind -> (verdict, how, why)
EXPECTED = {
    "nginx": ("preserved", "pass-through", "proxy_pass forwards every request header it does not rewrite"),
    "haproxy": ("preserved", "pass-through", "HTTP mode forwards request headers unchanged"),
    "caddy": ("preserved", "pass-through", "reverse_proxy forwards request headers (no tracing module on)"),
    "varnish": ("preserved", "pass-through", "a passed POST keeps the client's headers"),
    "squid": ("preserved", "pass-through", "the accelerator forwards end-to-end headers"),
    "pygw": ("preserved", "pass-through", "pygw forwards traceparent/tracestate unchanged (it records no span)"),
    "stack": ("preserved", "pass-through", "nginx and pygw both pass it through"),
    "litellm": ("dropped", "nothing arrived",
                "LiteLLM calls the upstream with its own client and forwards no client headers by default"),
}


@pytest.fixture(scope="module")
def engine(logged_null_engine: tuple[str, Path]) -> tuple[str, Path]:
    return logged_null_engine      # the session's (tests/conftest.py): LiteLLM in front of it starts once


def _generations(log: Path) -> list[dict]:
    if not log.exists():
        return []
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    return [rec for rec in lines if "prompt_tokens" in rec]


def _through(url: str, api: str, log: Path, sent: TraceParent) -> Propagation:
    """Send one request carrying `sent`; the verdict from the engine's record of it."""
    before = len(_generations(log))
    headers = {"traceparent": sent.header(), "tracestate": "zgtool=1", "authorization": "Bearer sk-test"}
    body = {"model": "null", "max_tokens": 2, "messages": [{"role": "user", "content": "trace me"}]}
    path = "/v1/chat/completions" if api == "openai" else "/v1/messages"
    r = httpx.post(url + path, json=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    assert poll(lambda: len(_generations(log)) > before, timeout_s=10), "the engine logged no request"
    rec = _generations(log)[before]
    return propagation_verdict(sent, rec.get("trace_id"), rec.get("parent_span_id"))


def test_the_verdict_reads_what_reached_the_engine() -> None:
    sent = TraceParent.fresh()
    assert propagation_verdict(sent, sent.trace_id, sent.span_id) == Propagation(
        "preserved", "pass-through", sent.trace_id, sent.span_id)
    assert propagation_verdict(sent, sent.trace_id.upper(), "1" * 16).how == "hop as parent"
    assert propagation_verdict(sent, "a" * 32, "1" * 16).verdict == "split"
    assert propagation_verdict(sent, None).verdict == "dropped"
    assert propagation_verdict(sent, sent.trace_id).how == "same trace (parent unknown)"
    assert TraceParent.parse(sent.header()) == sent
    assert TraceParent.parse("00-" + "0" * 32 + "-" + "1" * 16 + "-01") is None


def test_direct_to_the_engine_the_context_arrives_unchanged(engine: tuple[str, Path]) -> None:
    url, log = engine
    sent = TraceParent.fresh()
    assert _through(url, "anthropic", log, sent) == Propagation("preserved", "pass-through", sent.trace_id,
                                                                sent.span_id)


@pytest.mark.timeout(900)  # litellm's first start on a machine may create its venv
@pytest.mark.parametrize("kind", GATEWAY_KINDS)
def test_each_gateway_kind_gets_its_expected_propagation_verdict(
        engine: tuple[str, Path], kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    url, log = engine
    verdict, how, why = EXPECTED[kind]
    with front(kind, url, tmp_path / kind, request) as gw_url:
        got = _through(gw_url, "openai" if kind == "litellm" else "anthropic", log, TraceParent.fresh())
    assert (got.verdict, got.how) == (verdict, how), f"{kind}: expected {verdict} ({why}), got {got}"
