"""A small Anthropic-shaped ASGI app (JSON and SSE) for k6 tests; run by uvicorn in a fixture.

Not the engine: it lets the k6 plumbing be tested without the model stack. A request
whose body contains "fail-me" gets a 500 so failure counting can be checked; "slow-me"
waits 300 ms, so a small VU pool cannot keep an arrival rate; "close-me" is answered with
`connection: close`, so uvicorn closes the kept-alive connection after the answer (as llama-server
closes after every streamed answer); "gzip-me" is answered gzip-compressed when the request accepts gzip
(as a compressing gateway does) and 406 when it does not.
"""

from __future__ import annotations

import asyncio
import gzip
import json

MESSAGE = {"id": "msg_test", "type": "message", "role": "assistant", "model": "test",
           "content": [{"type": "text", "text": "hello"}], "stop_reason": "end_turn",
           "usage": {"input_tokens": 3, "output_tokens": 1}}
EVENTS = [
    ("message_start", {"type": "message_start", "message": {**MESSAGE, "content": []}}),
    ("content_block_start", {"type": "content_block_start", "index": 0,
                             "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0,
                             "delta": {"type": "text_delta", "text": "hello"}}),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
    ("message_stop", {"type": "message_stop"}),
]


async def _body(receive) -> bytes:
    chunks = []
    while True:
        msg = await receive()
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body"):
            return b"".join(chunks)


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = await _body(receive)
    if scope["path"] == "/health":
        await _json(send, 200, {"status": "ok"})
        return
    if scope["method"] != "POST" or scope["path"] != "/v1/messages":
        await _json(send, 404, {"type": "error", "error": {"type": "not_found_error", "message": "no route"}})
        return
    if b"fail-me" in body:
        await _json(send, 500, {"type": "error", "error": {"type": "api_error", "message": "asked to fail"}})
        return
    if b"slow-me" in body:
        await asyncio.sleep(0.3)
    req = json.loads(body)
    if b"gzip-me" in body:
        accepts = dict(scope["headers"]).get(b"accept-encoding", b"")
        if b"gzip" not in accepts:
            await _json(send, 406, {"type": "error", "error": {"type": "invalid_request_error",
                                                                "message": f"accept-encoding {accepts!r}"}})
            return
        raw = gzip.compress(json.dumps(MESSAGE).encode())
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-encoding", b"gzip")]})
        await send({"type": "http.response.body", "body": raw})
        return
    if not req.get("stream"):
        await _json(send, 200, MESSAGE, close=b"close-me" in body)
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    for name, data in EVENTS:
        await asyncio.sleep(0.001)  # a token gap, so the body really arrives in pieces
        await send({"type": "http.response.body", "more_body": True,
                    "body": f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()})
    await send({"type": "http.response.body", "body": b""})


async def _json(send, status: int, obj, close: bool = False) -> None:
    raw = json.dumps(obj).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")] + ([(b"connection", b"close")] if close else [])})
    await send({"type": "http.response.body", "body": raw})
