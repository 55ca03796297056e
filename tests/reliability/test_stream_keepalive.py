"""No silent stream (issue 37, item 2): a stream that waits for a seat gets a keepalive every
--stream-keepalive-s (Anthropic `event: ping`, an SSE comment on the OpenAI route), directly and
through pygw (which turns the upstream's ping into a comment for OpenAI clients), and zgtool's own
stream reader counts none of them as a token."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from zgtest import wait_until

from zgtool.gateway.supervisor import LocalStack, StackConfig
from zgtool.latency.wire.stream_reader import read_stream

MODEL = "dummy:small"      # ~44M parameters: a 1,500-token blocker holds the one seat for many seconds


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    cfg = StackConfig(model=MODEL, paths=("pygw",), pygw_policy="none",
                      engine_args=("--max-num-seqs", "1", "--stream-keepalive-s", "0.3"),
                      run_dir=tmp_path_factory.mktemp("run"))
    with LocalStack(cfg) as st:
        yield st


def _body(api: str, max_tokens: int, text: str) -> tuple[str, dict]:
    msgs = [{"role": "user", "content": text}]
    body = {"model": MODEL, "max_tokens": max_tokens, "stream": True, "ignore_eos": True, "messages": msgs}
    return ("/v1/messages" if api == "anthropic" else "/v1/chat/completions"), body


def _running(direct: str) -> int:
    hint = httpx.get(direct + "/health", timeout=10).headers.get("x-gpu-load-hint", "{}")
    return int(json.loads(hint).get("running", 0))


@contextlib.contextmanager
def _seat_held(direct: str, hold_s: float) -> Iterator[None]:
    """The engine's one seat held by a long stream for ``hold_s`` (several keepalive intervals),
    then given up (the hang-up aborts it)."""
    stop = threading.Event()

    def blocker() -> None:
        route, body = _body("openai", 1500, "blocker")
        with httpx.stream("POST", direct + route, json=body, timeout=300) as r:
            for _ in r.iter_raw():
                if stop.is_set():
                    return

    t = threading.Thread(target=blocker)
    t.start()
    try:
        wait_until(lambda: _running(direct) == 1, 60, "the blocker to hold the one seat")
        threading.Timer(hold_s, stop.set).start()
        yield
    finally:
        stop.set()
        t.join(120)


@pytest.mark.parametrize("path", ["direct", "pygw"])
def test_the_official_sdks_stream_a_queued_answer_with_keepalives_unharmed(stack: LocalStack, path: str) -> None:
    url, direct = stack.urls[path], stack.urls["direct"]
    msgs = [{"role": "user", "content": "queued"}]
    with _seat_held(direct, 1.5):
        client = anthropic.Anthropic(base_url=url, api_key="k", max_retries=0, timeout=300)
        with client.messages.stream(model=MODEL, max_tokens=5, messages=msgs, extra_body={"ignore_eos": True}) as s:
            kinds = [ev.type for ev in s]
            final = s.get_final_message()
    assert kinds[0] == "message_start" and "ping" not in kinds
    assert final.usage.output_tokens == 5 and final.stop_reason == "max_tokens"
    with _seat_held(direct, 1.5):
        oai = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=300)
        chunks = list(oai.chat.completions.create(model=MODEL, max_tokens=5, messages=msgs, stream=True,
                                                  extra_body={"ignore_eos": True},
                                                  stream_options={"include_usage": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5


@pytest.mark.parametrize("path", ["direct", "pygw"])
@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_a_queued_stream_gets_keepalives_that_no_reader_counts_as_tokens(stack: LocalStack, path: str,
                                                                        api: str) -> None:
    url, direct = stack.urls[path], stack.urls["direct"]
    stop = threading.Event()

    def blocker() -> None:        # holds the engine's one seat until the test is done with it
        route, body = _body("openai", 1500, "blocker")
        with httpx.stream("POST", direct + route, json=body, timeout=300) as r:
            for _ in r.iter_raw():
                if stop.is_set():
                    return       # hanging up aborts it

    t = threading.Thread(target=blocker)
    t.start()
    try:
        wait_until(lambda: _running(direct) == 1, 60, "the blocker to hold the one seat")
        route, body = _body(api, 5, "queued")
        chunks: list[bytes] = []
        before_first_token = b""
        with httpx.stream("POST", url + route, json=body, timeout=300) as r:
            assert r.status_code == 200
            for chunk in r.iter_raw():
                chunks.append(chunk)
                seen = b"".join(chunks)
                marker = b"event: ping" if api == "anthropic" else b": keepalive"
                if not stop.is_set() and marker in seen:
                    before_first_token = seen   # the keepalive came while the stream was queued
                    stop.set()
        keepalive = b"event: ping" if api == "anthropic" else b": keepalive\n\n"
        assert keepalive in before_first_token
        early: list[int] = []
        read_stream([before_first_token], api, early)
        assert early == []                          # no token had come yet: it was queued
        content_ns: list[int] = []
        error, _, tokens, _ = read_stream(chunks, api, content_ns)
        assert error is None
        assert len(content_ns) == 5 and tokens in (None, 5)   # five content tokens, no keepalive among them
    finally:
        stop.set()
        t.join(120)
