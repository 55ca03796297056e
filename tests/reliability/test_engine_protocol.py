"""Protocol promises against a live engine: timing invisible to the official SDKs, true
prefix-cache counts in Anthropic streams, 529 with retry-after, a keyed /metrics
(issue 16 items 8, 9, 11, 15)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from engine_live import ADMIN_KEY, USER_KEY, Live, connect, in_process, raw_request, write_keys

from zgtool.http.sse import SSEParser

MSGS = [{"role": "user", "content": "hi"}]
OFFICIAL = {"message_start", "content_block_start", "content_block_delta", "content_block_stop",
            "message_delta", "message_stop", "text"}


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with in_process(tmp_path_factory.mktemp("proto")) as s:
        yield s


def test_anthropic_stream_helpers_see_only_official_events(live: Live) -> None:
    client = anthropic.Anthropic(base_url=live.url, api_key=USER_KEY, max_retries=0)
    with client.messages.stream(model="null", max_tokens=12, messages=MSGS) as stream:
        kinds = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert set(kinds) <= OFFICIAL and kinds[0] == "message_start" and kinds[-1] == "message_stop"
    with client.messages.stream(model="null", max_tokens=12, messages=MSGS) as stream:
        text = "".join(stream.text_stream)
    assert text == final.content[0].text and len(text) == 12
    assert final.usage.output_tokens == 12 and final.stop_reason == "max_tokens"


def test_openai_stream_chunks_carry_no_extra_fields(live: Live) -> None:
    client = openai.OpenAI(base_url=live.url + "/v1", api_key=USER_KEY, max_retries=0)
    chunks = list(client.chat.completions.create(model="null", max_tokens=6, messages=MSGS, stream=True,
                                                 stream_options={"include_usage": True}))
    assert all(not c.model_extra for c in chunks)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6


def test_timing_rides_in_an_sse_comment_for_zgtool_readers(live: Live) -> None:
    for path in ("/v1/messages", "/v1/chat/completions"):
        r = httpx.post(live.url + path, json={"model": "null", "max_tokens": 3, "stream": True, "messages": MSGS},
                       headers={"x-api-key": USER_KEY})
        assert b"\n: zgtool-timing {" in r.content and b"zgtool_timing" not in r.content
        timing = next(e.timing for e in SSEParser().feed(r.content) if e.timing)
        assert timing["total_ms"] >= timing["ttft_ms"] > 0 and len(timing["token_times_ms"]) == 3


def test_anthropic_stream_reports_the_real_prefix_cache_hit(live: Live) -> None:
    prompt = [{"role": "user", "content": "a shared prefix that fills several KV blocks " * 8}]
    client = anthropic.Anthropic(base_url=live.url, api_key=USER_KEY, max_retries=0)
    client.messages.create(model="null", max_tokens=2, messages=prompt)             # warms the cache
    plain = client.messages.create(model="null", max_tokens=2, messages=prompt).usage
    assert plain.cache_read_input_tokens and plain.cache_read_input_tokens > 0
    r = httpx.post(live.url + "/v1/messages", json={"model": "null", "max_tokens": 2, "stream": True,
                                                    "messages": prompt}, headers={"x-api-key": USER_KEY})
    start = next(json.loads(e.data) for e in SSEParser().feed(r.content) if e.event == "message_start")
    assert start["message"]["usage"]["cache_read_input_tokens"] == plain.cache_read_input_tokens
    assert start["message"]["usage"]["input_tokens"] == plain.input_tokens
    with client.messages.stream(model="null", max_tokens=2, messages=prompt) as stream:
        final = stream.get_final_message()
    assert final.usage.cache_read_input_tokens == plain.cache_read_input_tokens


def test_overloaded_529_carries_retry_after(tmp_path: Path) -> None:
    with in_process(tmp_path, max_num_seqs=1, max_waiting=1, max_model_len=300_000) as live:
        # the null model now steps 250,000 tokens in well under a second: hold each step 1 ms so that the
        # two streams keep their seat and their queue place for the whole test
        runner = live.built.engine.runner  # type: ignore[union-attr]
        step = runner.execute
        runner.execute = lambda batch: (time.sleep(0.001), step(batch))[1]
        socks = []
        body = {"model": "null", "max_tokens": 250_000, "stream": True, "messages": MSGS}
        for _ in range(2):                    # one running, one waiting: the queue is full
            s = connect(live.port)
            s.sendall(raw_request(live.port, "/v1/messages", body, headers={"x-api-key": USER_KEY}))
            s.recv(64)
            socks.append(s)
        r = httpx.post(live.url + "/v1/messages", json={**body, "stream": False}, headers={"x-api-key": USER_KEY})
        assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
        assert int(r.headers["retry-after"]) >= 1
        r = httpx.post(live.url + "/v1/chat/completions", json={**body, "stream": False},
                       headers={"x-api-key": USER_KEY})
        assert r.status_code == 529 and r.json()["error"]["type"] == "server_error"
        for s in socks:
            s.close()
        assert live.wait_kv_free() == 0


@pytest.mark.parametrize("how", ["flag", "keys-file"])
def test_metrics_can_be_keyed(tmp_path: Path, how: str) -> None:
    opts: dict[str, object] = {"metrics_require_key": True} if how == "flag" else {
        "keys": write_keys(tmp_path, "\n[metrics]\nrequire_key = true\n")}
    with in_process(tmp_path, **opts) as live:        # type: ignore[arg-type]
        r = httpx.get(live.url + "/metrics")
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        for key in (USER_KEY, ADMIN_KEY):
            r = httpx.get(live.url + "/metrics", headers={"authorization": f"Bearer {key}"})
            assert r.status_code == 200 and "zg_num_requests_running" in r.text
        assert httpx.get(live.url + "/health").status_code == 200       # health stays open


def test_metrics_stay_open_by_default(live: Live) -> None:
    assert httpx.get(live.url + "/metrics").status_code == 200


def test_many_concurrent_sdk_streams_leave_no_blocks(live: Live) -> None:
    client = anthropic.Anthropic(base_url=live.url, api_key=USER_KEY, max_retries=0)
    errors: list[BaseException] = []

    def one() -> None:
        try:
            with client.messages.stream(model="null", max_tokens=30, messages=MSGS) as st:
                assert len(st.get_final_message().content[0].text) == 30
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and live.wait_kv_free() == 0
