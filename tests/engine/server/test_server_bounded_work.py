"""One request's work on the event loop is bounded by what it costs (issue 22: 200,000 empty
messages froze the loop for 17 s because the off-loop decision counted characters). Checked by
state, not by speed: an over-cap request is refused before any per-message work, and a large
body's parsing and templating run in a worker thread while /health is answered."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import pytest

from zgtool.engine.api import anthropic as anth
from zgtool.engine.api import openai as oai
from zgtool.engine.api.common import ParamError
from zgtool.engine.server import intake

ANTH = {"anthropic-version": "2023-06-01"}


@pytest.fixture(scope="module")
def server(start_server):
    """The null model with a context that holds tens of thousands of messages."""
    with start_server(max_model_len=2_000_000) as s:
        yield s


def _on_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _body(n_messages: int, content: str = "") -> dict[str, Any]:
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": content} for i in range(n_messages)]
    return {"model": "null", "max_tokens": 2, "messages": msgs}


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions", "/v1/messages/count_tokens"])
def test_more_messages_than_the_cap_is_a_400_before_any_message_is_validated(server, monkeypatch, path: str):
    calls: list[int] = []
    for mod, name in ((anth, "parse_messages"), (oai, "parse_chat"), (anth, "parse_count_tokens")):
        real = getattr(mod, name)
        monkeypatch.setattr(mod, name, lambda *a, _r=real, **k: (calls.append(1), _r(*a, **k))[1])
    body = json.dumps(_body(intake.MAX_MESSAGES + 1)).encode()
    r = httpx.post(server.url + path, content=body, headers={**ANTH, "content-type": "application/json"},
                   timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert f"at most {intake.MAX_MESSAGES} messages" in err["message"]
    if path.startswith("/v1/chat"):
        assert err["param"] == "messages" and err["type"] == "invalid_request_error"
    else:
        assert r.json()["type"] == "error" and err["type"] == "invalid_request_error"
    assert calls == []


def test_a_large_body_is_parsed_off_the_loop_while_health_is_answered(server, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    where: list[bool] = []
    real = anth.parse_messages

    def gated(obj: dict[str, Any], max_len: int) -> Any:
        where.append(_on_loop())
        entered.set()
        release.wait(30)
        return real(obj, max_len)

    monkeypatch.setattr(anth, "parse_messages", gated)
    body = _body(20_000)              # ~600 KB of empty messages: 0 characters of content
    assert len(json.dumps(body)) > intake.OFFLOAD_BODY_BYTES
    done: list[int] = []
    t = threading.Thread(target=lambda: done.append(
        httpx.post(server.url + "/v1/messages", json=body, headers=ANTH, timeout=60).status_code))
    t.start()
    try:
        assert entered.wait(30), "the request never reached the parser"
        # the parser is blocked mid-request: the loop must still answer
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
    finally:
        release.set()
        t.join(60)
    assert where == [False]
    assert done == [200]


def test_many_empty_messages_are_templated_off_the_loop(server, monkeypatch):
    tok = server.engine.tokenizer
    where: list[bool] = []
    real = tok.apply_chat_template

    def spy(*a: Any, **k: Any) -> Any:
        where.append(_on_loop())
        return real(*a, **k)

    monkeypatch.setattr(tok, "apply_chat_template", spy)
    small = _body(600)                 # under the body cap, over the cost cap: 0 chars of content
    assert len(json.dumps(small)) < intake.OFFLOAD_BODY_BYTES
    assert intake.MESSAGE_COST_CHARS * 600 > intake.OFFLOAD_COST_CHARS
    r = httpx.post(server.url + "/v1/messages", json=small, headers=ANTH, timeout=60)
    assert r.status_code == 200
    r = httpx.post(server.url + "/v1/messages", json=_body(1, "hi"), headers=ANTH, timeout=60)
    assert r.status_code == 200
    assert where == [False, True]      # the cheap one stays on the loop (no thread hop)


def test_prompt_cost_counts_messages_not_only_characters():
    from zgtool.engine.api.common import ChatRequest
    empty = ChatRequest(api="anthropic", model="m", messages=[{"role": "user", "content": ""}] * 10_000)
    assert intake.is_heavy(empty)
    assert not intake.is_heavy(ChatRequest(api="anthropic", model="m", messages=[{"role": "user", "content": "x"}]))


def test_a_concurrent_stream_keeps_flowing_while_a_large_body_is_parsed(server, monkeypatch):
    entered, release = threading.Event(), threading.Event()
    real = anth.parse_messages

    def gated(obj: dict[str, Any], max_len: int) -> Any:
        if len(obj.get("messages", ())) > 1:      # only the big request waits
            entered.set()
            release.wait(30)
        return real(obj, max_len)

    monkeypatch.setattr(anth, "parse_messages", gated)
    stream_body = {"model": "null", "max_tokens": 1_000_000, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    big = _body(20_000)
    done: list[int] = []
    with httpx.Client(timeout=30) as client, client.stream("POST", server.url + "/v1/messages", json=stream_body,
                                                           headers=ANTH) as s:
        lines = s.iter_lines()
        assert any("content_block_delta" in ln for ln in lines)   # the stream is running
        t = threading.Thread(target=lambda: done.append(
            httpx.post(server.url + "/v1/messages", json=big, headers=ANTH, timeout=60).status_code))
        t.start()
        try:
            for _ln in lines:         # read while the big request travels and decodes (a client that
                if entered.is_set():  # stops reading leaves the null engine stepping its stream flat out)
                    break
            assert entered.wait(30), "the big request never reached the parser"
            assert server.built.app.offloads.in_flight == 1     # its parse is counted: the loop shares the GIL
            # the big request's parser is held mid-request: the stream's deltas keep arriving
            deltas = 0
            for ln in lines:
                deltas += "content_block_delta" in ln
                if deltas >= 50:
                    break
            assert deltas >= 50 and not release.is_set()
        finally:
            release.set()
    t.join(60)      # once the stream is closed: its million tokens no longer step beside the big request
    assert done == [200]
    assert server.built.app.offloads.in_flight == 0



def test_only_a_body_parsed_off_the_loop_counts_as_thread_work(server, monkeypatch):
    offloads = server.built.app.offloads
    counted: list[int] = []
    real = offloads.waiting

    def recording(work: Any) -> Any:
        counted.append(1)
        return real(work)

    monkeypatch.setattr(offloads, "waiting", recording)
    seen = []
    for n_messages in (3, 20_000):      # ~100 bytes, all on the loop; ~700 KB, parsed and templated in threads
        r = httpx.post(server.url + "/v1/messages/count_tokens", json=_body(n_messages), headers=ANTH, timeout=60)
        assert r.status_code == 200, r.text
        seen.append(len(counted))
    assert seen == [0, 2]               # the small one starts no hand-over timer; the large one's two hand-offs count


def _verdict(fn: Any, body: bytes) -> Any:
    try:
        return ("ok", fn(body))
    except Exception as exc:  # noqa: BLE001 - the verdicts are compared, whatever they are
        return ("error", type(exc).__name__, getattr(exc, "status", None), str(exc))


@pytest.mark.parametrize("body", [
    b'{"a": [1, 2.5, -3e2, true, false, null, {"b": "c"}], "d": "\\u00e9\\ud83d\\ude00 \\n"}',
    b'{"x": NaN, "y": Infinity, "z": 1e400}',
    '{"k": "caf\u00e9 \u2062"}'.encode(),
    b'{"a": "\\ud800"}',                   # a lone surrogate escape
    b'{"a": 1',                            # truncated
    b'[1, 2]',                             # not an object
    b'{"a": "\xff"}',                      # not UTF-8
    b'{"a": ' + b'[' * 5000 + b']' * 5000 + b'}',
    b'{"n": ' + b'9' * 5000 + b'}',        # an integer over 4,300 digits
    b'',
])
def test_the_yielding_decoder_gives_load_jsons_verdict(body: bytes):
    from zgtool.http.body import load_json_object
    assert _verdict(intake.decode_yielding, body) == _verdict(load_json_object, body)


def test_a_structure_heavy_body_is_decoded_while_other_threads_run(monkeypatch):
    body = json.dumps(_body(200_000)).encode()        # 6.6 MB: over the message cap once decoded
    assert body.count(b",") > intake.STRUCTURE_HEAVY_SEPARATORS
    real = intake.decode_yielding
    ticks = [0]
    during: list[int] = []

    def spy(b: bytes) -> Any:
        start = ticks[0]
        try:
            return real(b)
        finally:
            during.append(ticks[0] - start)

    monkeypatch.setattr(intake, "decode_yielding", spy)
    stop = threading.Event()

    def ticker() -> None:
        while not stop.is_set():
            ticks[0] += 1
            stop.wait(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    try:
        with pytest.raises(ParamError, match="at most 100000 messages"):
            intake.decode(anth.parse_messages, body, 2_000_000)
    finally:
        stop.set()
        t.join()
    # the other thread kept running while the body was decoded (a C decoder holds the GIL
    # throughout: it would see no tick at all)
    assert len(during) == 1 and during[0] >= 3, during


def test_count_tokens_parses_a_large_body_off_the_loop_too(server, monkeypatch):
    where: list[bool] = []
    real = anth.parse_count_tokens
    monkeypatch.setattr(anth, "parse_count_tokens", lambda obj: (where.append(_on_loop()), real(obj))[1])
    body = _body(20_000)
    r = httpx.post(server.url + "/v1/messages/count_tokens", json=body, headers=ANTH, timeout=60)
    assert r.status_code == 200 and r.json()["input_tokens"] > 20_000
    assert where == [False]


def test_more_messages_than_the_context_holds_is_refused_before_the_body_is_decoded(start_server, monkeypatch):
    """200,000 empty messages (6.6 MB): refused from a byte count, the JSON never decoded."""
    decoded: list[int] = []
    real = intake.load_json_object
    monkeypatch.setattr(intake, "load_json_object", lambda b: (decoded.append(len(b)), real(b))[1])
    monkeypatch.setattr(intake, "decode_yielding", lambda b: (decoded.append(len(b)), real(b))[1])
    with start_server(max_model_len=4096) as s:
        body = json.dumps(_body(200_000)).encode()
        r = httpx.post(s.url + "/v1/messages", content=body, headers={**ANTH, "content-type": "application/json"},
                       timeout=60)
        assert r.status_code == 400 and "at most 4096 messages" in r.json()["error"]["message"]
        assert decoded == []
        small = httpx.post(s.url + "/v1/messages", json=_body(3, "hi"), headers=ANTH, timeout=30)
        assert small.status_code == 200
