"""Pipelining keeps every accepted answer (issue 37, item 3): requests parsed before a protocol
error (a 40 KB header, a garbage request line, Transfer-Encoding with Content-Length) are answered
in order, then the error, then the connection closes, with no traceback in the log; on the
engine's port and through pygw. Raw sockets: no client library pipelines."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator

import pytest

from zgtool.gateway.supervisor import LocalStack, StackConfig

GOOD = 10


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    with LocalStack(StackConfig(model="null", paths=("pygw",), pygw_policy="none",
                                run_dir=tmp_path_factory.mktemp("run"))) as st:
        yield st


def _good(i: int) -> bytes:
    body = json.dumps({"model": "null", "max_tokens": 3, "messages": [{"role": "user", "content": f"req {i}"}]})
    return (f"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-api-key: k\r\n"
            f"content-length: {len(body)}\r\n\r\n{body}").encode()


BAD = {
    "header_40kb": b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 40_000 + b"\r\n\r\n",
    "garbage_line": b"\x00\x01 NOT HTTP AT ALL\r\n\r\n",
    "te_and_cl": (b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n"
                  b"0\r\n\r\n"),
}


def _responses(data: bytes) -> list[tuple[int, bytes]]:
    """(status, body) of each complete answer in a byte stream of content-length answers."""
    out = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            break
        status = int(head.split(b" ", 2)[1])
        m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        n = int(m.group(1)) if m else 0
        out.append((status, rest[:n]))
        data = rest[n:]
    return out


def _pipeline(port: int, bad: bytes) -> tuple[list[tuple[int, bytes]], bool]:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"".join(_good(i) for i in range(GOOD)) + bad)
        chunks = []
        while chunk := s.recv(65536):      # until the server closes
            chunks.append(chunk)
        return _responses(b"".join(chunks)), True


# pygw (uvicorn) has no header cap: a 40 KB header is a valid request there
CASES = [(front, kind) for front in ("direct", "pygw") for kind in sorted(BAD)
         if (front, kind) != ("pygw", "header_40kb")]


@pytest.mark.parametrize(("front", "kind"), CASES)
def test_answers_before_a_protocol_error_arrive_in_order_then_the_error_then_the_close(
        stack: LocalStack, front: str, kind: str) -> None:
    port = int(stack.urls[front].rsplit(":", 1)[1])
    answers, closed = _pipeline(port, BAD[kind])
    statuses = [s for s, _ in answers]
    assert closed and statuses[:GOOD] == [200] * GOOD and len(statuses) == GOOD + 1, statuses
    assert statuses[-1] in (400, 431)
    texts = [json.loads(b)["content"][0]["text"] for _, b in answers[:GOOD]]
    assert all(texts)
    for log in stack.logs().values():
        assert "Traceback" not in log.read_text(errors="replace"), log
