"""pygw's default max_tokens follows the engine's (issue 37, item 6): an OpenAI client that sets
none gets the rest of the context through pygw, as on the engine's own OpenAI route, instead of
pygw's fixed 1,024 (a 400 on a 1,024-token model)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from zgtool.gateway.supervisor import LocalStack, StackConfig

CONTEXT = 1024


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with LocalStack(StackConfig(model="null", paths=("pygw",), pygw_policy="none",
                                engine_args=("--max-model-len", str(CONTEXT)),
                                run_dir=tmp_path_factory.mktemp("run"))) as st:
        yield st


@pytest.mark.parametrize("stream", [False, True])
def test_an_openai_client_without_max_tokens_gets_the_rest_of_the_context_through_pygw(
        stack: LocalStack, stream: bool) -> None:
    body = {"model": "null", "ignore_eos": True, "stream": stream, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hello " * 20}]}
    if not stream:
        body.pop("stream_options")
    usages = []
    for front in ("direct", "pygw"):
        r = httpx.post(stack.urls[front] + "/v1/chat/completions", json=body, timeout=120)
        assert r.status_code == 200, (front, r.text)
        if stream:
            chunks = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")]
            usage = chunks[-1]["usage"]
        else:
            usage = r.json()["usage"]
        assert usage["prompt_tokens"] + usage["completion_tokens"] == CONTEXT, (front, usage)
        usages.append((usage["prompt_tokens"], usage["completion_tokens"]))
    assert usages[0] == usages[1]


def test_an_anthropic_client_still_chooses_its_own_max_tokens_through_pygw(stack: LocalStack) -> None:
    body = {"model": "null", "max_tokens": 7, "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(stack.urls["pygw"] + "/v1/messages", json=body, timeout=60,
                   headers={"x-zgtool-max-tokens-default": "no"})
    assert r.status_code == 200 and r.json()["usage"]["output_tokens"] == 7
