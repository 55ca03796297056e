"""Every bad input gets the API's own error shape and documented status: never a 500,
never a leaked KV block."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

OK = {"model": "null", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def strict(start_server: Any) -> Iterator[Any]:
    """Small body limit and short read deadlines."""
    with start_server(max_body_bytes=4096, header_timeout_s=0.5, body_timeout_s=0.5) as s:
        yield s


def _post(url: str, body: Any, path: str = "/v1/messages", headers: dict[str, str] | None = None,
          **kw: Any) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + path, content=content, headers={"content-type": "application/json", **(headers or {})},
                      **kw)


def _anthropic_error(r: httpx.Response, status: int, etype: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == etype
    assert body["request_id"] == r.headers["request-id"]
    assert r.headers["x-request-id"].startswith("inference-") and "server-timing" in r.headers
    return body["error"]["message"]


@pytest.mark.parametrize(("body", "fragment"), [
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe\x00{", "not valid UTF-8"),
    (b"[]", "must be a JSON object"),
    ({**OK, "max_tokens": "4"}, "max_tokens: must be an integer"),
    ({k: v for k, v in OK.items() if k != "messages"}, "messages: field required"),
    ({k: v for k, v in OK.items() if k != "max_tokens"}, "max_tokens: field required"),
    ({**OK, "max_tokens": 0}, "max_tokens: must be at least 1"),
    ({**OK, "max_tokens": 10**6}, "maximum allowed number of output tokens"),
    ({**OK, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "not supported"),
    ({**OK, "messages": [{"role": "user", "content": [{"type": "document"}]}]}, "not supported"),
])
def test_bad_anthropic_bodies_are_400_invalid_request_error(server: Any, body: Any, fragment: str) -> None:
    assert fragment in _anthropic_error(_post(server.url, body), 400, "invalid_request_error")


def test_prompt_longer_than_the_context_names_both_counts(server: Any) -> None:
    ctx = server.engine.max_model_len
    messages = [{"role": "user", "content": "x" * (ctx + 10)}]
    n_prompt = len(server.engine.tokenizer.apply_chat_template(messages=messages))
    msg = _anthropic_error(_post(server.url, {**OK, "messages": messages}), 400, "invalid_request_error")
    assert f"prompt is {n_prompt} tokens" in msg and f"context of {ctx} tokens" in msg


def test_unknown_model_is_404_not_found_error_listing_served_models(server: Any) -> None:
    msg = _anthropic_error(_post(server.url, {**OK, "model": "claude-9"}), 404, "not_found_error")
    assert "claude-9" in msg and "null" in msg and "default" in msg


def test_unknown_route_is_404_and_wrong_method_is_405_with_allow(server: Any) -> None:
    _anthropic_error(httpx.get(server.url + "/v1/nope"), 404, "not_found_error")
    r = httpx.get(server.url + "/v1/messages")
    _anthropic_error(r, 405, "invalid_request_error")
    assert r.headers["allow"] == "POST"


def test_openai_routes_answer_in_the_openai_error_shape(server: Any) -> None:
    r = _post(server.url, {"model": "nope", "messages": [{"role": "user", "content": "x"}]}, "/v1/chat/completions")
    assert r.status_code == 404
    err = r.json()["error"]
    # OpenAI's own vocabulary: type invalid_request_error, code model_not_found, param model
    assert err["type"] == "invalid_request_error" and err["code"] == "model_not_found"
    assert "nope" in err["message"] and err["param"] == "model"
    r = _post(server.url, b"{", "/v1/chat/completions")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_body_over_the_limit_is_413_request_too_large_declared_or_chunked(strict: Any) -> None:
    big = json.dumps({**OK, "system": "x" * 8000}).encode()
    _anthropic_error(_post(strict.url, big), 413, "request_too_large")

    def chunks() -> Iterator[bytes]:          # no content-length: counted while reading
        for i in range(0, len(big), 1000):
            yield big[i:i + 1000]

    r = httpx.post(strict.url + "/v1/messages", content=chunks())
    _anthropic_error(r, 413, "request_too_large")
    assert httpx.get(strict.url + "/health").status_code == 200


def test_slowloris_headers_get_408_and_closed_while_others_are_served(strict: Any) -> None:
    with socket.create_connection(("127.0.0.1", strict.port)) as slow:
        slow.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n")
        t0 = time.monotonic()
        ok = _post(strict.url, OK)                      # the server is unaffected meanwhile
        assert ok.status_code == 200
        slow.settimeout(5)
        data = b""
        try:
            for _ in range(40):                         # trickle one header byte at a time
                slow.sendall(b"X")
                time.sleep(0.05)
        except OSError:
            pass                                        # the server closed the connection
        while chunk := slow.recv(65536):
            data += chunk
        assert data.startswith(b"HTTP/1.1 408") and b"timeout_error" in data
        assert time.monotonic() - t0 < 4


def test_slow_body_gets_408_and_closed(strict: Any) -> None:
    with socket.create_connection(("127.0.0.1", strict.port)) as slow:
        slow.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mo")
        slow.settimeout(5)
        data = b""
        while chunk := slow.recv(65536):
            data += chunk
        assert data.startswith(b"HTTP/1.1 408")
    assert _post(strict.url, OK).status_code == 200


def test_missing_or_bad_key_is_401_when_keys_are_configured(start_server: Any, keys_file: Any,
                                                            api_keys: dict[str, str]) -> None:
    with start_server(keys=keys_file) as s:
        _anthropic_error(_post(s.url, OK), 401, "authentication_error")
        _anthropic_error(_post(s.url, OK, headers={"x-api-key": "sk-wrong"}), 401, "authentication_error")
        r = httpx.post(s.url + "/v1/chat/completions", json={"model": "null", "messages": OK["messages"]},
                       headers={"authorization": "Bearer sk-wrong"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        assert _post(s.url, OK, headers={"x-api-key": api_keys["pro"]}).status_code == 200
        assert httpx.get(s.url + "/health").status_code == 200      # health stays open


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**7) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12,
)
fields = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["null", "default", "x"]) | json_values,
    "max_tokens": st.integers(-2, 5000) | json_values,
    "messages": st.lists(st.fixed_dictionaries({}, optional={
        "role": st.sampled_from(["user", "assistant", "system"]) | json_values,
        "content": st.text(max_size=30) | json_values}), max_size=3) | json_values,
    "system": json_values, "stream": json_values, "temperature": json_values, "top_p": json_values,
    "top_k": json_values, "stop_sequences": json_values, "stop": json_values, "metadata": json_values,
})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=fields, path=st.sampled_from(["/v1/messages", "/v1/chat/completions", "/v1/messages/count_tokens"]))
def test_arbitrary_json_never_gets_a_500(server: Any, body: dict, path: str) -> None:
    r = _post(server.url, body, path, timeout=10)
    assert r.status_code in (200, 400, 404), r.text
    assert r.headers["content-type"].startswith(("application/json", "text/event-stream"))


def test_no_kv_block_leaks_after_all_the_bad_input(server: Any) -> None:
    assert server.wait_idle()["kv_blocks_used"] == 0
    assert server.metric("zg_kv_blocks_used") == 0
