"""Request bodies of 1 KB..1 MB, each sent in one write (head and body together, the case that
got 431 from the engine), are answered by the engine through every gateway kind `zgtool gateway`
starts, and one pipelined batch of small requests through nginx is answered in full.

The bodies are valid requests padded with JSON whitespace, so every hop parses (and pygw and
LiteLLM re-serialise) the whole body, and the engine answers 200 whatever the model's context.
Limits stated by the configs: nginx client_max_body_size 32m, pygw --max-body-bytes 8 MiB (the
engine's default), HAProxy/Caddy/Varnish/Squid/LiteLLM: no body limit set (their defaults)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from urllib.parse import urlsplit

import h11
import pytest
from litellm_live import front

from zgtool.gateway.kinds import GATEWAY_KINDS, start_gateway

SIZES_KB = (1, 16, 33, 42, 64, 128, 512, 1024)
PIPELINED = 90


def _body(size_bytes: int, tag: str) -> bytes:
    msgs = [{"role": "user", "content": tag}]
    head = {"model": "null", "max_tokens": 2, "messages": msgs}  # the same shape in both APIs
    raw = json.dumps(head).encode()
    pad = max(0, size_bytes - len(raw))
    return raw[:-1] + b" " * pad + b"}"  # whitespace inside the object: valid JSON of exactly that size


def _request_bytes(host: str, path: str, body: bytes) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\ncontent-type: application/json\r\n"
            f"authorization: Bearer sk-test\r\nanthropic-version: 2023-06-01\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


@pytest.fixture(scope="module")
def engine(null_engine: str) -> str:
    return null_engine      # the session's (tests/conftest.py): LiteLLM in front of it starts once


def _send_sizes(url: str, api: str) -> dict[int, tuple[int, bytes]]:
    host = urlsplit(url).netloc
    path = "/v1/chat/completions" if api == "openai" else "/v1/messages"
    answers = {}
    for kb in SIZES_KB:
        payload = _request_bytes(host, path, _body(kb * 1024, f"size {kb}"))
        answers[kb] = _one(url, payload)
    return answers


def _one(url: str, payload: bytes) -> tuple[int, bytes]:
    got = _exchange_raw(url, payload, 1)
    return got[0] if got else (0, b"no answer")


def _exchange_raw(url: str, payload: bytes, count: int) -> list[tuple[int, bytes]]:
    """Send payload (`count` requests) in one sendall; read up to `count` responses in order (h11
    parses a response only after its request was "sent", hence the placeholder requests)."""
    parts = urlsplit(url)
    conn = h11.Connection(h11.CLIENT)
    results: list[tuple[int, bytes]] = []
    with socket.create_connection((parts.hostname, parts.port), timeout=120) as s:
        s.sendall(payload)
        for _ in range(count):
            conn.send(h11.Request(method="POST", target="/", headers=[("host", "x"), ("content-length", "0")]))
            conn.send(h11.EndOfMessage())
            status, body = 0, b""
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = s.recv(65536)
                    if not data:
                        return results
                    conn.receive_data(data)
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    body += bytes(event.data)
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    break
            results.append((status, body))
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                break
            conn.start_next_cycle()
    return results


def test_the_engine_itself_answers_every_size_in_one_write(engine: str) -> None:
    for api in ("anthropic", "openai"):
        got = _send_sizes(engine, api)
        assert {kb: s for kb, (s, _) in got.items()} == dict.fromkeys(SIZES_KB, 200), got


@pytest.mark.timeout(900)  # litellm's first start on a machine may create its venv
@pytest.mark.parametrize("kind", GATEWAY_KINDS)
def test_every_body_size_in_one_write_is_answered_through_each_gateway(engine: str, kind: str, tmp_path: Path,
                                                                       request: pytest.FixtureRequest) -> None:
    api = "openai" if kind == "litellm" else "anthropic"
    with front(kind, engine, tmp_path / kind, request) as gw_url:
        got = _send_sizes(gw_url, api)
    bad = {kb: (s, b[:200]) for kb, (s, b) in got.items() if s != 200}
    assert not bad, f"{kind}: {bad}"


def test_a_pipelined_batch_through_nginx_is_answered_in_full(engine: str, tmp_path: Path) -> None:
    with start_gateway("nginx", engine, tmp_path / "nginx") as gw:
        host = urlsplit(gw.url).netloc
        batch = b"".join(_request_bytes(host, "/v1/messages", _body(480, f"pipelined {i}"))
                         for i in range(PIPELINED))
        got = _exchange_raw(gw.url, batch, PIPELINED)
    assert len(got) == PIPELINED and {s for s, _ in got} == {200}, got[-3:]
