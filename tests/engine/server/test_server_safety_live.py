"""In-pipeline safety against a live server: input rejected before scheduling, output stopped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest


@pytest.fixture(scope="module")
def guarded(start_server: Any, policy_file: Any) -> Iterator[Any]:
    with start_server(safety_policy=policy_file) as s:
        yield s


def _body(text: str, **kw: Any) -> dict[str, Any]:
    return {"model": "null", "max_tokens": 40, "messages": [{"role": "user", "content": text}], **kw}


def test_input_hit_is_400_content_policy_violation_and_never_scheduled(guarded: Any) -> None:
    before = guarded.metric("zg_prompt_tokens_total", 0.0)
    r = httpx.post(guarded.url + "/v1/messages", json=_body("please say the forbidden input now"))
    assert r.status_code == 400
    err = r.json()["error"]
    assert err == {"type": "content_policy_violation", "message": err["message"], "suggestion": "rephrase"}
    assert "blocked by test policy" in err["message"]
    r = httpx.post(guarded.url + "/v1/chat/completions", json=_body("my secret-42"))
    err = r.json()["error"]
    assert r.status_code == 400 and (err["type"], err["code"]) == ("invalid_request_error", "content_policy_violation")
    assert guarded.metric("zg_prompt_tokens_total", 0.0) == before


def test_output_hit_non_stream_is_400_and_frees_the_blocks(guarded: Any) -> None:
    # the null model says "Hello from the zgtool ..." and the policy denies "from the zgtool"
    r = httpx.post(guarded.url + "/v1/messages", json=_body("hi"))
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "content_policy_violation"
    st = {k: float(v.split("=")[1]) for k, v in (p.strip().split(";") for p in r.headers["server-timing"].split(","))}
    assert st["safety"] > 0
    assert guarded.wait_idle()["kv_blocks_used"] == 0


def test_output_hit_in_a_stream_is_an_error_event_and_the_text_is_withheld(guarded: Any) -> None:
    r = httpx.post(guarded.url + "/v1/messages", json=_body("hi", stream=True))
    assert r.status_code == 200
    blocks = [b for b in r.text.split("\n\n") if b]
    assert blocks[-1].startswith("event: error")
    payload = json.loads(blocks[-1].split("data: ", 1)[1])
    assert payload["error"]["type"] == "content_policy_violation" and payload["error"]["suggestion"] == "rephrase"
    text = "".join(json.loads(b.split("data: ", 1)[1])["delta"]["text"]
                   for b in blocks if b.startswith("event: content_block_delta"))
    assert "from the zgtool" not in text and "message_stop" not in r.text
    r = httpx.post(guarded.url + "/v1/chat/completions", json=_body("hi", stream=True))
    chunks = [c for c in r.text.split("\n\n") if c]
    assert '"content_policy_violation"' in chunks[-2] and chunks[-1] == "data: [DONE]"
    assert '"finish_reason":"stop"' not in r.text
    assert guarded.wait_idle()["kv_blocks_used"] == 0


def test_openai_sdk_raises_on_the_stream_error_event(guarded: Any) -> None:
    import openai

    client = openai.OpenAI(base_url=guarded.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIError, match="blocked by test policy"):
        for _ in client.chat.completions.create(model="null", max_tokens=40, stream=True,
                                                messages=[{"role": "user", "content": "hi"}]):
            pass


def test_anthropic_sdk_raises_on_the_stream_error_event(guarded: Any) -> None:
    import anthropic

    client = anthropic.Anthropic(base_url=guarded.url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.APIStatusError, match="content_policy_violation"):
        with client.messages.stream(model="null", max_tokens=40, messages=[{"role": "user", "content": "hi"}]) as s:
            for _ in s.text_stream:
                pass
