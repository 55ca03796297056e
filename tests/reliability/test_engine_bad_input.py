"""Bad input against a live engine: exact 4xx status and error shape, never a 500, no leaked
KV blocks, the process keeps serving (issue 16 items 5, 6, 7, 9)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from engine_live import (
    MSGS,
    USER_KEY,
    Live,
    anthropic_error,
    connect,
    in_process,
    openai_error,
    raw_request,
    read_all,
)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with in_process(tmp_path_factory.mktemp("bad"), max_header_bytes=8192, max_headers=50,
                    header_timeout_s=1.0) as s:
        yield s


def _post(live: Live, path: str, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(live.url + path, content=content, timeout=30,
                      headers={"x-api-key": USER_KEY, "content-type": "application/json", **(headers or {})})


SURROGATE = b'"hi \\ud800 there"'
ANTH = b'{"model":"null","max_tokens":4,"messages":[{"role":"user","content":%s}]}'
CHAT = b'{"model":"null","max_tokens":4,"messages":[{"role":"user","content":%s}]}'


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_lone_surrogate_in_anthropic_routes_is_400_invalid_request(live: Live, path: str) -> None:
    body = anthropic_error(_post(live, path, ANTH % SURROGATE), 400, "invalid_request_error")
    assert "surrogate" in body["error"]["message"] and "messages.0.content" in body["error"]["message"]


def test_lone_surrogate_in_chat_is_400_with_openai_shape(live: Live) -> None:
    err = openai_error(_post(live, "/v1/chat/completions", CHAT % SURROGATE), 400, "invalid_request_error")
    assert err["param"] == "messages.0.content"


@pytest.mark.parametrize(("body", "what"), [
    (b"[" * 3000 + b"]" * 3000, "too deeply"),
    (b'{"model":"null","max_tokens":' + b"7" * 4400 + b',"messages":[]}', "4300 digits"),
])
def test_pathological_json_is_400_not_500(live: Live, body: bytes, what: str) -> None:
    for path in ("/v1/messages", "/v1/chat/completions"):
        r = _post(live, path, body)
        assert r.status_code == 400 and what in r.text, r.text


@pytest.mark.parametrize("seed", [b"1e23", b"100000000000000000000000", b"-99999999999999999999"])
def test_openai_seed_out_of_range_is_400_naming_seed(live: Live, seed: bytes) -> None:
    body = b'{"model":"null","seed":' + seed + b',"messages":[{"role":"user","content":"x"}]}'
    err = openai_error(_post(live, "/v1/chat/completions", body), 400, "invalid_request_error")
    assert err["param"] == "seed" or err["message"].startswith("seed")


OPENAI_UNSUPPORTED = [
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("tool_choice", "required"), ("logprobs", True), ("top_logprobs", 3),
    ("response_format", {"type": "json_object"}), ("presence_penalty", 0.5), ("frequency_penalty", -1),
    ("n", 2), ("logit_bias", {"42": 5}),
]


@pytest.mark.parametrize(("param", "value"), OPENAI_UNSUPPORTED)
def test_unsupported_openai_parameters_are_400_naming_the_parameter(live: Live, param: str, value: Any) -> None:
    body = {"model": "null", "max_tokens": 4, "messages": MSGS, param: value}
    err = openai_error(_post(live, "/v1/chat/completions", body), 400, "invalid_request_error",
                       code="unsupported_parameter")
    assert err["param"] == param and param in err["message"]


def test_openai_parameters_at_their_defaults_are_accepted(live: Live) -> None:
    body = {"model": "null", "max_tokens": 4, "messages": MSGS, "tools": [], "logprobs": False, "n": 1,
            "presence_penalty": 0, "frequency_penalty": 0.0, "response_format": {"type": "text"},
            "logit_bias": None, "seed": 2**63 - 1}
    assert _post(live, "/v1/chat/completions", body).status_code == 200


@pytest.mark.parametrize(("param", "value"), [
    ("thinking", {"type": "enabled", "budget_tokens": 1024}),
    ("tools", [{"name": "f", "input_schema": {"type": "object"}}]),
    ("tool_choice", {"type": "any"}),
])
def test_unsupported_anthropic_parameters_are_400_naming_the_parameter(live: Live, param: str, value: Any) -> None:
    body = anthropic_error(_post(live, "/v1/messages", {"model": "null", "max_tokens": 4, "messages": MSGS,
                                                        param: value}), 400, "invalid_request_error")
    assert body["error"]["message"].startswith(param + ":")


def test_anthropic_version_missing_is_accepted_and_malformed_is_400(live: Live) -> None:
    ok = {"model": "null", "max_tokens": 2, "messages": MSGS}
    assert _post(live, "/v1/messages", ok).status_code == 200
    assert _post(live, "/v1/messages", ok, {"anthropic-version": "2023-06-01"}).status_code == 200
    body = anthropic_error(_post(live, "/v1/messages", ok, {"anthropic-version": "latest"}), 400,
                           "invalid_request_error")
    assert "anthropic-version" in body["error"]["message"]


def test_too_many_headers_is_431_in_the_api_shape(live: Live) -> None:
    headers = {f"x-h{i}": "v" for i in range(60)}
    r = _post(live, "/v1/messages", {"model": "null", "max_tokens": 2, "messages": MSGS}, headers)
    anthropic_error(r, 431, "invalid_request_error")
    assert r.headers["connection"] == "close"


def test_an_oversized_head_arriving_in_one_read_is_431(live: Live) -> None:
    s = connect(live.port)
    s.sendall(raw_request(live.port, "/v1/messages", {"model": "null", "max_tokens": 2, "messages": MSGS},
                          headers={"x-api-key": USER_KEY, "x-big": "b" * 20_000}))
    reply = read_all(s)
    s.close()
    assert reply.startswith(b"HTTP/1.1 431 ") and b'"type":"invalid_request_error"' in reply


def test_oversized_headers_are_431_and_memory_does_not_grow(live: Live) -> None:
    rss0 = live.rss_kb()
    for _ in range(4):                    # 4 x 16 MB of one header, sent as fast as the server reads
        s = connect(live.port)
        s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-big: ")
        reply = b""
        try:
            for _ in range(1024):
                s.sendall(b"a" * 16384)
        except (BrokenPipeError, ConnectionResetError):
            pass
        try:
            reply = read_all(s)
        except (ConnectionResetError, TimeoutError):
            pass
        s.close()
        if reply:
            assert reply.startswith(b"HTTP/1.1 431 "), reply[:200]
            assert b'"type":"error"' in reply and b'"request_id":"req_' in reply
    assert live.rss_kb() - rss0 < 32 * 1024, "headers were buffered"
    assert live.alive()


def test_malformed_http_gets_a_400_in_the_api_shape(live: Live) -> None:
    s = connect(live.port)
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-length: zz\r\n\r\n")
    reply = read_all(s)
    s.close()
    assert reply.startswith(b"HTTP/1.1 400 "), reply[:200]
    body = json.loads(reply.split(b"\r\n\r\n", 1)[1])
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert body["request_id"].startswith("req_")


def test_header_timeout_408_body_carries_request_id(live: Live) -> None:
    s = connect(live.port)
    s.sendall(b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n")       # never finishes its headers
    reply = read_all(s)
    s.close()
    assert reply.startswith(b"HTTP/1.1 408 ")
    head, body = reply.split(b"\r\n\r\n", 1)
    err = json.loads(body)
    assert err["error"]["type"] == "timeout_error" and err["request_id"].startswith("req_")
    assert err["request_id"].encode() in head          # same id in the request-id header


def test_http_1_0_stream_is_close_delimited_not_chunked(live: Live) -> None:
    s = connect(live.port)
    s.sendall(raw_request(live.port, "/v1/messages", {"model": "null", "max_tokens": 5, "stream": True,
                                                      "messages": MSGS},
                          headers={"x-api-key": USER_KEY}, version="1.0"))
    reply = read_all(s)                  # the server closes: that is the end of the body
    s.close()
    head, body = reply.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 200 ")
    lower = head.lower()
    assert b"transfer-encoding" not in lower and b"connection: close" in lower
    assert body.startswith(b"event: ") and body.rstrip().endswith(b'{"type":"message_stop"}')


def test_get_model_by_id_in_both_shapes(live: Live) -> None:
    import anthropic
    import openai

    assert openai.OpenAI(base_url=live.url + "/v1", api_key=USER_KEY).models.retrieve("null").id == "null"
    got = anthropic.Anthropic(base_url=live.url, api_key=USER_KEY).models.retrieve("null")
    assert got.id == "null" and got.type == "model"
    r = httpx.get(live.url + "/v1/models/nope", headers={"x-api-key": USER_KEY})
    openai_error(r, 404, "invalid_request_error", code="model_not_found")


def test_nothing_leaked_and_still_serving(live: Live) -> None:
    assert live.wait_kv_free() == 0
    assert live.metric("zg_request_errors", error_type="api_error") == 0
    assert live.alive()


def test_slow_tls_handshake_is_cut_at_the_header_timeout(tmp_path: Path) -> None:
    with in_process(tmp_path, tls="self-signed", tls_dir=tmp_path / "tls", header_timeout_s=1.0) as tls:
        s = socket.create_connection(("127.0.0.1", tls.port), timeout=15)
        t0 = time.monotonic()
        assert s.recv(1) == b""          # no ClientHello sent: the server hangs up
        assert time.monotonic() - t0 < 8
        s.close()
        assert httpx.get(tls.url + "/health", verify=False).status_code == 200
