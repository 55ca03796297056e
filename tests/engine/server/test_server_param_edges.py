"""Every sampling parameter pushed to its edge gets a 400 in that API's own error shape, or is
served (issue 22: temperature 1e-300 killed every in-flight request). Values the arithmetic
cannot serve are refused; a temperature below the floor is greedy, as in vLLM."""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest

from zgtool.engine.config import MAX_STOP_CHARS, MAX_STOP_SEQUENCES

ANTH_HEADERS = {"anthropic-version": "2023-06-01", "content-type": "application/json"}
NAN, INF = "NaN", "Infinity"          # bare JSON tokens, written into the body as sent by a JS client


def _post(server: Any, api: str, params: dict[str, Any], raw: dict[str, str] | None = None) -> httpx.Response:
    msgs = '[{"role":"user","content":"hi"}]'
    fields = {"model": '"null"', "max_tokens": "2", "messages": msgs}
    import json
    fields.update({k: json.dumps(v) for k, v in params.items()})
    fields.update(raw or {})
    body = "{" + ",".join(f'"{k}":{v}' for k, v in fields.items()) + "}"
    path = "/v1/messages" if api == "anthropic" else "/v1/chat/completions"
    return httpx.post(server.url + path, content=body.encode(), headers=ANTH_HEADERS, timeout=30)


def _assert_400_shape(r: httpx.Response, api: str, name: str) -> None:
    assert r.status_code == 400, (r.status_code, r.text)
    doc = r.json()
    if api == "anthropic":
        assert doc["type"] == "error" and doc["error"]["type"] == "invalid_request_error"
    else:
        assert doc["error"]["type"] == "invalid_request_error" and "message" in doc["error"]
    assert name.split(".")[0] in doc["error"]["message"] or "JSON" in doc["error"]["message"] \
        or "number" in doc["error"]["message"], doc


BAD = [
    ("temperature", {"temperature": -0.1}, None),
    ("temperature", {"temperature": 2.5}, None),
    ("temperature", None, {"temperature": NAN}),
    ("temperature", None, {"temperature": INF}),
    ("temperature", None, {"temperature": "-" + INF}),
    ("temperature", None, {"temperature": "1e400"}),
    ("temperature", {"temperature": "0.5"}, None),
    ("top_p", {"top_p": 0}, None),
    ("top_p", {"top_p": -0.5}, None),
    ("top_p", {"top_p": 1.5}, None),
    ("top_p", None, {"top_p": NAN}),
    ("max_tokens", {"max_tokens": 0}, None),
    ("max_tokens", {"max_tokens": -1}, None),
    ("max_tokens", {"max_tokens": 10**30}, None),
    ("max_tokens", {"max_tokens": 2.5}, None),
    ("max_tokens", {"max_tokens": True}, None),
]


@pytest.mark.parametrize("api", ["anthropic", "openai"])
@pytest.mark.parametrize(("name", "params", "raw"), BAD)
def test_an_unservable_parameter_is_a_400_in_the_apis_shape(server, api: str, name: str, params: Any, raw: Any):
    r = _post(server, api, params or {}, raw)
    _assert_400_shape(r, api, name)


@pytest.mark.parametrize("api", ["anthropic", "openai"])
@pytest.mark.parametrize("temperature", [0, 1e-300, 5e-324, 1e-38, 1e-6])
def test_a_temperature_at_or_below_the_floor_is_served_greedily(server, api: str, temperature: float):
    assert math.isfinite(temperature)
    assert _post(server, api, {"temperature": temperature}).status_code == 200


@pytest.mark.parametrize("top_k", [-1, 2.5])
def test_a_negative_or_fractional_top_k_is_a_400(server, top_k: Any):
    _assert_400_shape(_post(server, "anthropic", {"top_k": top_k}), "anthropic", "top_k")


def test_stop_caps_per_api(server):
    ok = ["x" * MAX_STOP_CHARS] * 4
    assert _post(server, "openai", {"stop": ok}).status_code == 200
    _assert_400_shape(_post(server, "openai", {"stop": ok + ["y"]}), "openai", "stop")     # OpenAI: 4
    assert _post(server, "anthropic", {"stop_sequences": ["s"] * MAX_STOP_SEQUENCES}).status_code == 200
    _assert_400_shape(_post(server, "anthropic", {"stop_sequences": ["s"] * (MAX_STOP_SEQUENCES + 1)}),
                      "anthropic", "stop")
    _assert_400_shape(_post(server, "anthropic", {"stop_sequences": ["z" * (MAX_STOP_CHARS + 1)]}), "anthropic", "stop")
    _assert_400_shape(_post(server, "openai", {"stop": "z" * (MAX_STOP_CHARS + 1)}), "openai", "stop")
    _assert_400_shape(_post(server, "anthropic", {"stop_sequences": [""]}), "anthropic", "stop")


@pytest.mark.parametrize(("api", "param", "value"), [
    ("openai", "logprobs", True), ("openai", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("openai", "n", 2), ("openai", "response_format", {"type": "json_object"}),
    ("openai", "frequency_penalty", 0.5), ("openai", "logit_bias", {"1": 5}),
    ("anthropic", "thinking", {"type": "enabled", "budget_tokens": 1024}),
])
def test_parameters_already_refused_stay_refused(server, api: str, param: str, value: Any):
    _assert_400_shape(_post(server, api, {param: value}), api, param)


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_a_request_that_can_never_fit_the_kv_pool_is_a_400_not_a_hang(start_server, api: str):
    with start_server(kv_memory_mb=1, max_model_len=100_000) as s:     # null: 16 blocks of 16 tokens
        total = s.engine.stats()["kv_blocks_total"] * s.engine.block_size
        body = {"model": "null", "max_tokens": 10, "messages": [{"role": "user", "content": "a" * (total + 50)}]}
        path = "/v1/messages" if api == "anthropic" else "/v1/chat/completions"
        r = httpx.post(s.url + path, json=body, headers=ANTH_HEADERS, timeout=30)
        assert r.status_code == 400 and "KV blocks" in r.json()["error"]["message"], r.text
        if api == "anthropic":
            assert r.json()["type"] == "error"
        small = {**body, "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(s.url + path, json=small, headers=ANTH_HEADERS, timeout=30).status_code == 200
