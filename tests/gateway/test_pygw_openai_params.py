"""pygw answers OpenAI parameters it cannot translate the way the engine's own OpenAI API does
(a 400 naming the parameter, code unsupported_parameter), never dropping them silently; judged
against the real engine (`--model null`) answering the same body directly. And pygw's OpenAI
stream error endings end with `data: [DONE]`, as the engine's do."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from gw_fake_upstream import FakeUpstream

from zgtool.gateway.supervisor import LocalStack, StackConfig

MSGS = [{"role": "user", "content": "hi"}]
HDRS = {"authorization": "Bearer k"}

# (parameter, a value the engine refuses): every OpenAI parameter pygw has no translation for,
# plus malformed values of the ones it forwards
REFUSED: list[tuple[str, Any]] = [
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]),
    ("tool_choice", "required"),
    ("functions", [{"name": "f", "parameters": {}}]),
    ("function_call", {"name": "f"}),
    ("logprobs", True),
    ("top_logprobs", 3),
    ("response_format", {"type": "json_object"}),
    ("presence_penalty", 0.5),
    ("frequency_penalty", -1.0),
    ("logit_bias", {"50256": -100}),
    ("audio", {"voice": "alloy", "format": "wav"}),
    ("modalities", ["text", "audio"]),
    ("prediction", {"type": "content", "content": "x"}),
    ("web_search_options", {}),
    ("ignore_eos", "yes"),
    ("ignore_eos", 1),
    ("top_k", -1),
]
# values that change nothing: accepted by both
HARMLESS: list[tuple[str, Any]] = [
    ("tools", []), ("tool_choice", "none"), ("logprobs", False), ("top_logprobs", 0),
    ("response_format", {"type": "text"}), ("presence_penalty", 0), ("frequency_penalty", 0.0),
    ("logit_bias", {}), ("modalities", ["text"]), ("parallel_tool_calls", True), ("ignore_eos", False),
    ("top_k", 0),
]


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    with LocalStack(StackConfig(model="null", paths=("pygw",))) as st:
        yield st


def _post(base: str, extra: dict[str, Any], stream: bool = False) -> httpx.Response:
    body = {"model": "null", "max_tokens": 3, "messages": MSGS, "stream": stream, **extra}
    return httpx.post(base + "/v1/chat/completions", json=body, headers=HDRS, timeout=60)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(("param", "value"), REFUSED, ids=[f"{p}={v!r}"[:40] for p, v in REFUSED])
def test_a_parameter_the_engine_refuses_is_refused_through_pygw_in_the_engines_shape(
        stack: LocalStack, param: str, value: Any, stream: bool) -> None:
    direct = _post(stack.urls["direct"], {param: value}, stream)
    via = _post(stack.urls["pygw"], {param: value}, stream)
    assert direct.status_code == 400, direct.text  # the reference: what the engine itself answers
    assert via.status_code == 400, via.text
    d, v = direct.json()["error"], via.json()["error"]
    assert (v["type"], v["code"]) == (d["type"], d["code"])
    assert v["param"] == param and v["message"].startswith(param + ":")


@pytest.mark.parametrize(("param", "value"), HARMLESS, ids=[f"{p}={v!r}"[:40] for p, v in HARMLESS])
def test_a_parameter_at_a_value_that_changes_nothing_is_accepted_like_the_engine_does(
        stack: LocalStack, param: str, value: Any) -> None:
    direct = _post(stack.urls["direct"], {param: value})
    via = _post(stack.urls["pygw"], {param: value})
    assert (direct.status_code, via.status_code) == (200, 200), (direct.text, via.text)
    assert via.json()["choices"][0]["message"]["content"] == direct.json()["choices"][0]["message"]["content"]


def test_top_k_is_forwarded_to_the_engine(stack: LocalStack) -> None:
    # an out-of-range top_k only the engine checks after translation would be a 400 from upstream
    r = _post(stack.urls["pygw"], {"top_k": 5})
    assert r.status_code == 200, r.text


def test_an_openai_stream_that_ends_in_an_upstream_error_ends_with_done(start_pygw: Any) -> None:
    up = FakeUpstream().start()
    try:
        gw = start_pygw(up.url)
        body = {"model": "null", "max_tokens": 3, "stream": True,
                "messages": [{"role": "user", "content": f"STREAMERR {uuid.uuid4().hex}"}]}
        r = httpx.post(gw + "/v1/chat/completions", json=body, headers=HDRS, timeout=30)
        events = [line.removeprefix("data: ") for line in r.text.split("\n") if line.startswith("data: ")]
        assert '"error"' in events[-2] and events[-1] == "[DONE]", r.text
    finally:
        up.stop()
