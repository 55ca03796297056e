"""Real local servers for latency-split tests: a tiny Anthropic/OpenAI origin and a gateway in front.

    python fixture_server.py origin  [--certfile C --keyfile K] [--fail-every N] [--token-delay-ms D]
    python fixture_server.py gateway --upstream http://127.0.0.1:P

Binds 127.0.0.1 port 0 and prints "PORT <n>" once listening. The origin reports measured
(not invented) Server-Timing parts; the gateway appends gw_* parts as pygw does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
from typing import Any

import uvicorn

TOKENS = ["Hello", ",", " world", "!", " This", " is", " a", " fixture", " stream", "."]


def _timing_header(parts: dict[str, float]) -> bytes:
    return ", ".join(f"{k};dur={v:.3f}" for k, v in parts.items()).encode()


async def _read_body(receive: Any) -> bytes:
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            return body


async def _send_json(send: Any, status: int, doc: dict[str, Any], extra: list[tuple[bytes, bytes]]) -> None:
    raw = json.dumps(doc).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()), *extra]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": raw})


def _sse(name: str, doc: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(doc)}\n\n".encode()


class Origin:
    def __init__(self, fail_every: int, token_delay_ms: float) -> None:
        self.fail_every = fail_every
        self.token_delay_s = token_delay_ms / 1e3
        self.count = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        arrival = time.perf_counter()
        body = await _read_body(receive)
        self.count += 1
        rid = [(b"request-id", f"req_fixture_{self.count}".encode())]
        if self.fail_every and self.count % self.fail_every == 0:
            await _send_json(send, 529, {"type": "error", "error": {"type": "overloaded_error",
                                                                    "message": "Overloaded"}}, rid)
            return
        try:
            req = json.loads(body)
            n = int(req.get("max_tokens", 8))
        except (ValueError, TypeError):
            await _send_json(send, 400, {"type": "error", "error": {"type": "invalid_request_error",
                                                                    "message": "body is not JSON"}}, rid)
            return
        api = "openai" if scope["path"].endswith("/chat/completions") else "anthropic"
        tokens = [TOKENS[i % len(TOKENS)] for i in range(max(1, min(n, 64)))]
        t_sched = time.perf_counter()
        await asyncio.sleep(0.001)            # "prefill"
        t_prefill = time.perf_counter()
        if req.get("stream"):
            await self._stream(send, api, tokens, arrival, t_sched, t_prefill, rid)
        else:
            await asyncio.sleep(self.token_delay_s * len(tokens))
            parts = self._parts(arrival, t_sched, t_prefill, time.perf_counter())
            text = "".join(tokens)
            if api == "anthropic":
                doc = {"id": "msg_1", "type": "message", "role": "assistant", "model": "fixture",
                       "content": [{"type": "text", "text": text}], "stop_reason": "max_tokens",
                       "usage": {"input_tokens": 5, "output_tokens": len(tokens)}}
            else:
                doc = {"id": "c1", "object": "chat.completion", "model": "fixture",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                    "finish_reason": "length"}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": len(tokens)}}
            await _send_json(send, 200, doc, [*rid, (b"server-timing", _timing_header(parts))])

    @staticmethod
    def _parts(arrival: float, t_sched: float, t_prefill: float, t_end: float) -> dict[str, float]:
        ms = 1e3
        return {"queue": (t_sched - arrival) * ms, "prefill": (t_prefill - t_sched) * ms,
                "decode": (t_end - t_prefill) * ms, "detok": 0.0, "safety": 0.0,
                "total": (time.perf_counter() - arrival) * ms}

    async def _stream(self, send: Any, api: str, tokens: list[str], arrival: float, t_sched: float,
                      t_prefill: float, rid: list[tuple[bytes, bytes]]) -> None:
        head = {"queue": (t_sched - arrival) * 1e3}
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream"), *rid, (b"server-timing", _timing_header(head))]})

        async def chunk(b: bytes) -> None:
            await send({"type": "http.response.body", "body": b, "more_body": True})

        if api == "anthropic":
            await chunk(_sse("message_start", {"type": "message_start", "message": {
                "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "fixture",
                "usage": {"input_tokens": 5, "output_tokens": 1}}}))
            await chunk(_sse("content_block_start", {"type": "content_block_start", "index": 0,
                                                     "content_block": {"type": "text", "text": ""}}))
            await chunk(_sse("ping", {"type": "ping"}))
        for tok in tokens:
            await asyncio.sleep(self.token_delay_s)
            if api == "anthropic":
                await chunk(_sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                         "delta": {"type": "text_delta", "text": tok}}))
            else:
                await chunk(b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": tok}}]})
                            .encode() + b"\n\n")
        parts = self._parts(arrival, t_sched, t_prefill, time.perf_counter())
        if api == "anthropic":
            tail = (_sse("content_block_stop", {"type": "content_block_stop", "index": 0})
                    + _sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                                             "usage": {"output_tokens": len(tokens)}})
                    + _sse("zgtool_timing", {"type": "zgtool_timing", "server_timing": _timing_header(parts)
                                             .decode()})
                    + _sse("message_stop", {"type": "message_stop"}))
        else:
            tail = (b"data: " + json.dumps({"choices": [], "usage": {"completion_tokens": len(tokens)},
                                            "zgtool_timing": {f"{k}_ms": v for k, v in parts.items()}})
                    .encode() + b"\n\ndata: [DONE]\n\n")
        await send({"type": "http.response.body", "body": tail, "more_body": False})


class Gateway:
    """Forwards to the upstream (keep-alive), appending its own gw_* Server-Timing parts."""

    def __init__(self, upstream: str) -> None:
        import httpx

        self.client = httpx.AsyncClient(base_url=upstream, trust_env=False, timeout=30)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        arrival = time.perf_counter()
        body = await _read_body(receive)
        json.loads(body)                      # the gateway's own parse + "auth": real work, timed
        auth_ms = (time.perf_counter() - arrival) * 1e3
        req = self.client.build_request("POST", scope["path"], content=body,
                                        headers={"content-type": "application/json"})
        resp = await self.client.send(req, stream=True)
        timing = resp.headers.get("server-timing", "")
        keep = [(k.encode(), v.encode()) for k, v in resp.headers.items()
                if k.lower() in ("content-type", "request-id")]
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            st = f"{timing}, gw_auth;dur={auth_ms:.3f}".lstrip(", ")
            await send({"type": "http.response.start", "status": resp.status_code,
                        "headers": [*keep, (b"server-timing", st.encode())]})
            async for part in resp.aiter_raw():
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await resp.aclose()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        raw = await resp.aread()
        await resp.aclose()
        total_ms = (time.perf_counter() - arrival) * 1e3
        st = f"{timing}, gw_auth;dur={auth_ms:.3f}, gw_total;dur={total_ms:.3f}".lstrip(", ")
        await send({"type": "http.response.start", "status": resp.status_code, "headers": [
            *keep, (b"content-length", str(len(raw)).encode()), (b"server-timing", st.encode())]})
        await send({"type": "http.response.body", "body": raw})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=("origin", "gateway"))
    ap.add_argument("--upstream")
    ap.add_argument("--certfile")
    ap.add_argument("--keyfile")
    ap.add_argument("--fail-every", type=int, default=0)
    ap.add_argument("--token-delay-ms", type=float, default=1.0)
    args = ap.parse_args()
    app: Any = Gateway(args.upstream) if args.mode == "gateway" else Origin(args.fail_every, args.token_delay_ms)
    # proto must be IPPROTO_TCP: asyncio only sets TCP_NODELAY on accepted sockets whose proto says
    # TCP, and without it Nagle + delayed ACK hold a body write behind its headers for ~40 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(app, http="httptools", loop="asyncio", log_level="warning", access_log=False,
                            ssl_certfile=args.certfile, ssl_keyfile=args.keyfile, lifespan="off")
    server = uvicorn.Server(config)
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])
    sys.exit(0)


if __name__ == "__main__":
    main()
