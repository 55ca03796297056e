"""Read deadlines hold on keep-alive connections, whichever of the two deadlines is the
shorter (the connection's one timer re-arms itself or is moved earlier)."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from engine_live import read_all

OK = json.dumps({"model": "null", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}).encode()
REQUEST = (b"POST /v1/messages HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
           b"content-length: " + str(len(OK)).encode() + b"\r\n\r\n" + OK)


def _read_answer(sock: socket.socket) -> bytes:
    """One complete answer (head + content-length body) from a keep-alive connection."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_a_second_request_stalled_in_its_headers_gets_408_on_a_kept_alive_connection(start_server: Any) -> None:
    with start_server(header_timeout_s=0.5, body_timeout_s=30.0) as s, \
            socket.create_connection(("127.0.0.1", s.port)) as sock:
        sock.settimeout(10)    # far beyond the header deadline, far below the body deadline
        for _ in range(3):
            assert _read_answer(_send(sock, REQUEST)).startswith(b"HTTP/1.1 200")
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\n")
        data = read_all(sock)
        assert data.startswith(b"HTTP/1.1 408") and b"headers not received in time" in data


def test_a_body_deadline_shorter_than_the_header_deadline_cuts_a_slow_body(start_server: Any) -> None:
    with start_server(header_timeout_s=30.0, body_timeout_s=0.5) as s, \
            socket.create_connection(("127.0.0.1", s.port)) as sock:
        sock.settimeout(10)
        assert _read_answer(_send(sock, REQUEST)).startswith(b"HTTP/1.1 200")
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mo")
        data = read_all(sock)
        assert data.startswith(b"HTTP/1.1 408") and b"body not received in time" in data


def _send(sock: socket.socket, data: bytes) -> socket.socket:
    sock.sendall(data)
    return sock


def test_an_idle_kept_alive_connection_is_closed_after_keep_alive_s_without_a_408(start_server: Any) -> None:
    """The keep-alive deadline rides the connection's one timer (no timer per answer): after its
    answers an idle connection is closed quietly, the header deadline far away."""
    with start_server(header_timeout_s=30.0, body_timeout_s=30.0, keep_alive_s=1.0) as s, \
            socket.create_connection(("127.0.0.1", s.port)) as sock:
        sock.settimeout(20)
        for _ in range(3):
            assert _read_answer(_send(sock, REQUEST)).startswith(b"HTTP/1.1 200")
        assert read_all(sock) == b""        # closed, nothing written


def test_a_kept_alive_connection_busy_past_keep_alive_s_is_not_closed(start_server: Any) -> None:
    """The keep-alive deadline holds only while idle: a request arriving before it replaces it
    (the header deadline), and the answer after it re-arms it from then."""
    with start_server(header_timeout_s=30.0, body_timeout_s=30.0, keep_alive_s=1.0) as s, \
            socket.create_connection(("127.0.0.1", s.port)) as sock:
        sock.settimeout(20)
        assert _read_answer(_send(sock, REQUEST)).startswith(b"HTTP/1.1 200")
        head = REQUEST.split(b"\r\n\r\n")[0]
        sock.sendall(head[:20])                      # a request begins within the keep-alive time
        sock.settimeout(1.5)                         # past keep_alive_s: still open, nothing written
        with pytest.raises(TimeoutError):
            sock.recv(1)
        sock.settimeout(20)
        assert _read_answer(_send(sock, REQUEST[20:])).startswith(b"HTTP/1.1 200")
