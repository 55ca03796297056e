"""A tiny Anthropic-compatible upstream for the gateway's own unit tests (errors, retries,
caching, limits): Messages JSON and an SSE stream token by token, with request-id,
X-Request-ID and Server-Timing headers like the engine's. Served by a real uvicorn on
a free loopback port, in a thread of the test process.

Behaviour is chosen by the last user message:
    "FAIL529 n=<k> <tag>"   the first k calls with that text answer 529 + retry-after: 0
    "FAIL529 long <tag>"    always 529 + retry-after: 60
    "FAIL500 always"        always 500
    "FAIL413 <tag>"         413 request_too_large (a 4xx: never retried)
    "STREAMERR <tag>"       a stream that sends one delta, then `event: error` (no message_stop)
    "HANG <tag>"            no answer (streamed: no event after ping) until the client (pygw)
                            hangs up; recorded in `hung_up`
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from collections import Counter
from typing import Any

import uvicorn
from zgtest import stop_uvicorn_thread

from zgtool.gateway.procs import free_port

TIMING = "queue;dur=0.100, prefill;dur=1.000, decode;dur=2.000, total;dur=3.300"


class FakeUpstream:
    def __init__(self, *, token_delay_s: float = 0.03) -> None:
        self.token_delay_s = token_delay_s
        self.calls: Counter[str] = Counter()
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.hung_up: set[str] = set()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._n = 0

    # --- ASGI -------------------------------------------------------------------------
    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        self._n += 1
        rid = f"{self._n:06d}"
        hdrs = [(b"request-id", f"req_{rid}".encode()), (b"x-request-id", f"inference-{rid}".encode()),
                (b"server", b"fake-upstream")]
        path = scope["path"]
        if path == "/health":
            return await _send(send, 200, {"status": "ok"}, hdrs)
        if path == "/v1/models":  # like the engine: Anthropic's shape when anthropic-version is sent
            if any(k == b"anthropic-version" for k, _ in scope["headers"]):
                return await _send(send, 200, {"data": [{"type": "model", "id": "null", "display_name": "null",
                                                         "created_at": "2026-01-01T00:00:00Z"}],
                                               "has_more": False, "first_id": "null", "last_id": "null"}, hdrs)
            return await _send(send, 200, {"object": "list", "data": [{"id": "null", "object": "model"}]}, hdrs)
        if path != "/v1/messages":
            return await _send(send, 404, _err("not_found_error", "no such route"), hdrs)
        req = json.loads(body)
        self.requests.append(req)
        self.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        text = _last_user_text(req)
        self.calls[text] += 1
        m = re.search(r"FAIL529 n=(\d+)", text)
        if m and self.calls[text] <= int(m.group(1)):
            return await _send(send, 529, _err("overloaded_error", "overloaded"), [*hdrs, (b"retry-after", b"0")])
        if "FAIL529 long" in text:
            return await _send(send, 529, _err("overloaded_error", "overloaded"), [*hdrs, (b"retry-after", b"60")])
        if "FAIL500 always" in text:
            return await _send(send, 500, _err("api_error", "boom"), hdrs)
        if "FAIL413" in text:
            return await _send(send, 413, _err("request_too_large", "request body too large"), hdrs)
        if "HANG" in text and not req.get("stream"):
            with contextlib.suppress(TimeoutError):
                while (await asyncio.wait_for(receive(), 60))["type"] != "http.disconnect":
                    pass
                self.hung_up.add(text)
            return None
        n = int(req.get("max_tokens", 5))
        tokens = [f"tok{i} " for i in range(n)]
        if not req.get("stream"):
            msg = _message(rid, req, "".join(tokens), n)
            return await _send(send, 200, msg, [*hdrs, (b"server-timing", TIMING.encode())])
        await send({"type": "http.response.start", "status": 200, "headers": [
            *hdrs, (b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache"),
            (b"server-timing", TIMING.encode())]})
        start = _message(rid, req, "", 0)
        start["content"] = []
        events = [("message_start", {"type": "message_start", "message": start}),
                  ("content_block_start", {"type": "content_block_start", "index": 0,
                                           "content_block": {"type": "text", "text": ""}}),
                  ("ping", {"type": "ping"})]
        for name, ev in events:
            await _sse(send, name, ev)
        if "HANG" in text:  # a stream that goes silent after its first events
            with contextlib.suppress(TimeoutError):
                while (await asyncio.wait_for(receive(), 60))["type"] != "http.disconnect":
                    pass
                self.hung_up.add(text)
            return None
        if "STREAMERR" in text:
            await _sse(send, "content_block_delta", {"type": "content_block_delta", "index": 0,
                                                     "delta": {"type": "text_delta", "text": "partial "}})
            await _sse(send, "error", {"type": "error", "error": {"type": "overloaded_error", "message": "cut"}})
            return await send({"type": "http.response.body", "body": b"", "more_body": False})
        for tok in tokens:
            await asyncio.sleep(self.token_delay_s)
            await _sse(send, "content_block_delta", {"type": "content_block_delta", "index": 0,
                                                     "delta": {"type": "text_delta", "text": tok}})
        await _sse(send, "content_block_stop", {"type": "content_block_stop", "index": 0})
        await _sse(send, "message_delta", {"type": "message_delta", "delta": {"stop_reason": "max_tokens",
                                           "stop_sequence": None}, "usage": {"output_tokens": n}})
        await _sse(send, "zg_timing", {"type": "zg_timing", "server_timing": TIMING})
        await _sse(send, "message_stop", {"type": "message_stop"})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # --- lifecycle ----------------------------------------------------------------------
    def start(self) -> FakeUpstream:
        config = uvicorn.Config(self, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="off", access_log=False)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("fake upstream did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            stop_uvicorn_thread(self._server, self._thread)


def _last_user_text(req: dict) -> str:
    for m in reversed(req.get("messages") or []):
        if m.get("role") == "user":
            c = m.get("content")
            return c if isinstance(c, str) else "".join(b.get("text", "") for b in c or [])
    return ""


def _message(rid: str, req: dict, text: str, n: int) -> dict:
    return {"id": f"msg_{rid}", "type": "message", "role": "assistant", "model": req.get("model", "null"),
            "content": [{"type": "text", "text": text}], "stop_reason": "max_tokens", "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": n}}


def _err(typ: str, msg: str) -> dict:
    return {"type": "error", "error": {"type": typ, "message": msg}}


async def _send(send: Any, status: int, obj: dict, hdrs: list) -> None:
    body = json.dumps(obj).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        *hdrs, (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def _sse(send: Any, name: str, obj: dict) -> None:
    data = f"event: {name}\ndata: {json.dumps(obj)}\n\n".encode()
    await send({"type": "http.response.body", "body": data, "more_body": True})
