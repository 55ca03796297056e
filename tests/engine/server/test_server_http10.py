"""An HTTP/1.0 client has no chunked encoding: a stream's answer to it is close-delimited (no
transfer-encoding, connection: close, the events then EOF), and a JSON answer carries its length."""

from __future__ import annotations

import json
import socket
from typing import Any

from engine_live import read_all


def _request(stream: bool) -> bytes:
    body = json.dumps({"model": "null", "max_tokens": 4, "stream": stream,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()
    return (b"POST /v1/messages HTTP/1.0\r\nHost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body))


def test_a_stream_to_an_http10_client_is_close_delimited(start_server: Any) -> None:
    with start_server() as s, socket.create_connection(("127.0.0.1", s.port)) as sock:
        sock.settimeout(20)
        sock.sendall(_request(stream=True))
        data = read_all(sock)                      # until the server closes
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    assert lines[0].startswith(b"http/1.1 200")
    assert b"connection: close" in lines and not any(x.startswith(b"transfer-encoding") for x in lines)
    assert body.startswith(b"event: message_start") and body.rstrip().endswith(b'{"type":"message_stop"}')


def test_a_json_answer_to_an_http10_client_carries_its_length(start_server: Any) -> None:
    with start_server() as s, socket.create_connection(("127.0.0.1", s.port)) as sock:
        sock.settimeout(20)
        sock.sendall(_request(stream=False))
        data = read_all(sock)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert length == len(body) and json.loads(body)["type"] == "message"
