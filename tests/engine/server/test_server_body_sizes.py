"""Header caps count header bytes, never body bytes (issue 22: 42 KB prompts got 431 whenever the
head and the body arrived in one read, and a pipelined batch lost 89 of 90 answers)."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import pytest


@pytest.fixture(scope="module")
def server(start_server):
    """The null model with a context that holds a 1 MB prompt (bytes are its tokens)."""
    with start_server(max_model_len=2_000_000, max_body_bytes=4 * 1024 * 1024) as s:
        yield s


def _request(body: bytes, path: str = "/v1/messages", extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            f"anthropic-version: 2023-06-01\r\n{extra}content-length: {len(body)}\r\n\r\n").encode() + body


def _body(size: int) -> bytes:
    base = {"model": "null", "max_tokens": 2, "messages": [{"role": "user", "content": ""}]}
    pad = size - len(json.dumps(base).encode())
    base["messages"][0]["content"] = "a" * max(0, pad)
    return json.dumps(base).encode()


def _read_responses(sock: socket.socket, count: int) -> list[int]:
    """Status codes of `count` whole responses (Content-Length framed) read off one connection."""
    buf = b""
    statuses: list[int] = []
    sock.settimeout(30)
    while len(statuses) < count:
        while b"\r\n\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                return statuses
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        length = next(int(v) for k, _, v in (ln.partition(":") for ln in lines[1:]) if k.lower() == "content-length")
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                return statuses
            rest += chunk
        statuses.append(int(lines[0].split()[1]))
        buf = rest[length:]
    return statuses


def _send(url: str, data: bytes, split_at: int | None = None, expect: int = 1) -> list[int]:
    u = urlsplit(url)
    with socket.create_connection((u.hostname, u.port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if split_at is None:
            s.sendall(data)
        else:
            s.sendall(data[:split_at])
            s.sendall(data[split_at:])
        return _read_responses(s, expect)


@pytest.mark.parametrize("kib", [1, 16, 31, 32, 33, 42, 64, 100, 128, 512, 1024])
def test_a_body_of_any_size_in_one_write_is_answered_not_431(server, kib: int):
    assert _send(server.url, _request(_body(kib * 1024))) == [200]


def test_a_42kb_request_split_at_many_boundaries_is_answered(server):
    data = _request(_body(42 * 1024))
    head_end = data.index(b"\r\n\r\n") + 4
    points = sorted({1, 10, head_end - 3, head_end - 1, head_end, head_end + 1, 32 * 1024, 33 * 1024,
                     len(data) - 1, *range(0, len(data), 4099)} - {0})
    for at in points:
        assert _send(server.url, data, split_at=at) == [200], at


def test_every_split_point_of_a_small_request_is_answered(server):
    data = _request(_body(300))
    for at in range(1, len(data)):
        assert _send(server.url, data, split_at=at) == [200], at


def test_a_pipelined_batch_of_90_requests_in_one_write_gets_90_answers_in_order(server):
    batch = b"".join(_request(_body(400)) for _ in range(90))
    assert len(batch) > 32 * 1024
    assert _send(server.url, batch, expect=90) == [200] * 90


def test_headers_over_the_cap_still_get_431(server):
    big = "x-pad: " + "p" * (40 * 1024) + "\r\n"
    assert _send(server.url, _request(_body(100), extra=big)) == [431]
    spread = "".join(f"x-h{i}: {'q' * 1000}\r\n" for i in range(40))
    assert _send(server.url, _request(_body(100), extra=spread), split_at=20_000) == [431]
