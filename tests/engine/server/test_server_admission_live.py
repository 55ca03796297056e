"""Admission against a live server: 429 with retry-after and rate-limit headers, 529 when saturated."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

MSGS = [{"role": "user", "content": "hello"}]


@contextmanager
def held_stream(srv: Any, key: str | None, max_tokens: int = 900) -> Iterator[None]:
    """A long stream that is running (first tokens read) until the block exits (disconnect)."""
    body = json.dumps({"model": srv.built.config.model, "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True, "messages": MSGS}).encode()
    auth = b"Authorization: Bearer " + key.encode() + b"\r\n" if key else b""
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + auth
                  + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        got = b""
        while got.count(b'"content"') < 2:
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        assert got.startswith(b"HTTP/1.1 200")
        yield


@pytest.fixture(scope="module")
def keyed(start_server: Any, keys_file: Any) -> Iterator[Any]:
    with start_server(model="dummy:tiny", keys=keys_file) as s:
        yield s


def _msg(srv: Any, key: str) -> httpx.Response:
    return httpx.post(srv.url + "/v1/messages", headers={"x-api-key": key},
                      json={"model": "default", "max_tokens": 2, "messages": MSGS})


def test_tier_concurrency_exceeded_is_429_with_retry_after_and_ratelimit_headers(
        keyed: Any, api_keys: dict[str, str]) -> None:
    with held_stream(keyed, api_keys["free"]):
        r = _msg(keyed, api_keys["free"])
        assert r.status_code == 429
        body = r.json()
        assert body["error"]["type"] == "rate_limit_error" and "concurrency limit of 1" in body["error"]["message"]
        assert int(r.headers["retry-after"]) >= 1
        assert r.headers["anthropic-ratelimit-requests-limit"] == "1000"
        assert int(r.headers["anthropic-ratelimit-requests-remaining"]) < 1000
        assert "anthropic-ratelimit-requests-reset" in r.headers
        assert _msg(keyed, api_keys["pro"]).status_code == 200       # other keys are not affected
    keyed.wait_idle()
    assert _msg(keyed, api_keys["free"]).status_code == 200            # the slot came back


def test_requests_per_minute_exceeded_is_429_until_the_window_slides(keyed: Any, api_keys: dict[str, str]) -> None:
    codes = [_msg(keyed, api_keys["tiny"]).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    r = _msg(keyed, api_keys["tiny"])
    assert r.headers["anthropic-ratelimit-requests-remaining"] == "0"
    assert 1 <= int(r.headers["retry-after"]) <= 60


def test_admin_endpoints_need_an_admin_key(keyed: Any, api_keys: dict[str, str]) -> None:
    r = httpx.get(keyed.url + "/admin/kv", headers={"x-api-key": api_keys["pro"]})
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    r = httpx.get(keyed.url + "/admin/kv", headers={"x-api-key": api_keys["admin"]})
    assert r.status_code == 200 and r.json()["kv_blocks_total"] == keyed.engine.num_kv_blocks
    r = httpx.post(keyed.url + "/admin/defrag", headers={"x-api-key": api_keys["admin"]},
                   json={"dry_run": True, "drop_prefix_cache": False})
    assert r.status_code == 200 and isinstance(r.json(), dict)
    r = httpx.post(keyed.url + "/admin/defrag", headers={"x-api-key": api_keys["admin"]}, json={"dry_run": "yes"})
    assert r.status_code == 400


def test_saturated_engine_answers_529_overloaded_error(start_server: Any) -> None:
    with start_server(model="dummy:tiny", max_num_seqs=1, max_waiting=1) as srv:
        with held_stream(srv, None):
            waiting = httpx.AsyncClient  # noqa: F841 - documents intent: the 2nd request waits
            body = json.dumps({"model": "default", "max_tokens": 3, "stream": True, "messages": MSGS}).encode()
            with socket.create_connection(("127.0.0.1", srv.port)) as s2:
                s2.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                           b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                assert s2.recv(65536).startswith(b"HTTP/1.1 200")       # admitted, queued
                r = httpx.post(srv.url + "/v1/messages", json={"model": "default", "max_tokens": 2,
                                                               "messages": MSGS})
                assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
        assert srv.wait_idle()["kv_blocks_used"] == 0
        assert srv.wait_metric("zg_request_errors_total", 1, error_type="overloaded_error") == 1
