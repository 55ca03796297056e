"""A real local server that answers with crafted SSE streams, one write (one loopback segment) per piece,
GAP_MS apart, and says when it sent each: for the first-byte/first-token points of latency-split.

    python sse_script_server.py [GAP_MS]

Binds 127.0.0.1 port 0 and prints "PORT <n>". POST /s/NAME/v1/chat/completions (or /v1/messages) is
answered with SCRIPTS[NAME]: the response head, then each event as one HTTP chunk, then the last chunk.
After each answer it prints "SENT NAME [ns, ...]": perf_counter_ns (CLOCK_MONOTONIC, the client's clock
too) just before each write, the head's first.

Two paths stand in for servers that drop requests on a kept-alive connection:
    /closing/NAME/...   answered as /s/NAME/..., after which the connection is closed when the next request
                        on it arrives, unanswered ("DROPPED NAME"): as llama-server (llama-cpp-python 0.3.36's
                        vendored build, run here) closes its connection after every streamed answer while it
                        advertises "Keep-Alive: timeout=5, max=100", so a client that sends before the FIN arrives
                        gets no answer byte; here deterministically, not by the race
    /drop/NAME/...      every request is closed unanswered ("DROPPED NAME"), on a new connection too
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
        b"transfer-encoding: chunked\r\n\r\n")


def oa(delta: dict[str, Any] | None = None, finish: str | None = None, usage: dict[str, int] | None = None,
       choices: bool = True) -> bytes:
    doc: dict[str, Any] = {"id": "c1", "object": "chat.completion.chunk", "model": "m",
                           "choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}] if choices else []}
    if usage is not None:
        doc["usage"] = usage
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


def an(name: str, doc: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **doc})}\n\n".encode()


USAGE = {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
TAIL_OA = [oa(finish="stop"), oa(usage=USAGE, choices=False), b"data: [DONE]\n\n"]
TOOL = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
START = an("message_start", {"message": {"id": "m1", "type": "message", "role": "assistant", "content": [],
                                         "usage": {"input_tokens": 5, "output_tokens": 1}}})
STOP_AN = [an("message_delta", {"delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}}),
           an("message_stop", {})]

# each script: its pieces in order; the tests name which piece each point must land on
SCRIPTS: dict[str, list[bytes]] = {
    "role_first": [oa({"role": "assistant", "content": ""}), oa({"content": "Hi"}), oa({"content": " there"}),
                   *TAIL_OA],
    "empty_content": [oa({"content": ""}), oa({"content": ""}), oa({"content": "x"}), *TAIL_OA],
    "reasoning_first": [oa({"role": "assistant"}), oa({"reasoning_content": "Let me think"}),
                        oa({"reasoning_content": " more"}), oa({"content": "A"}), *TAIL_OA],
    "tool_only": [oa({"role": "assistant", "content": None}), oa({"tool_calls": [TOOL]}),
                  oa({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\": \"Oslo\"}"}}]}),
                  oa(finish="tool_calls"), oa(usage=USAGE, choices=False), b"data: [DONE]\n\n"],
    "keepalive_first": [b": keep-alive\n\n", b": keep-alive\n\n", oa({"role": "assistant", "content": ""}),
                        oa({"content": "K"}), *TAIL_OA],
    "anthropic_ping": [START, an("ping", {}),
                       an("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
                       an("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
                       an("content_block_stop", {"index": 0}), *STOP_AN],
    "anthropic_thinking_tool": [
        START,
        an("content_block_start", {"index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
        an("content_block_delta", {"index": 0, "delta": {"type": "thinking_delta", "thinking": "Weather?"}}),
        an("content_block_delta", {"index": 0, "delta": {"type": "signature_delta", "signature": "c2ln"}}),
        an("content_block_stop", {"index": 0}),
        an("content_block_start", {"index": 1, "content_block": {"type": "tool_use", "id": "t1",
                                                                 "name": "get_weather", "input": {}}}),
        an("content_block_delta", {"index": 1, "delta": {"type": "input_json_delta", "partial_json": ""}}),
        an("content_block_delta", {"index": 1, "delta": {"type": "input_json_delta",
                                                         "partial_json": "{\"city\": \"Oslo\"}"}}),
        an("content_block_stop", {"index": 1}),
        an("message_delta", {"delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
        an("message_stop", {})],
}


def chunk(piece: bytes) -> bytes:
    return f"{len(piece):x}\r\n".encode() + piece + b"\r\n"


class Server:
    def __init__(self, gap_s: float) -> None:
        self.gap_s = gap_s

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        closing = False
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                prefix = path.split("/")[1]
                name = path.split("/")[2] if prefix in ("s", "closing", "drop") else ""
                if closing or prefix == "drop":
                    print(f"DROPPED {name}", flush=True)
                    return                                  # closed unanswered, the body left unread
                closing = prefix == "closing"
                length = next((int(v) for k, _, v in (ln.partition(":") for ln in lines[1:])
                               if k.strip().lower() == "content-length"), 0)
                await reader.readexactly(length)
                if name not in SCRIPTS:
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    await writer.drain()
                    continue
                sent = []
                for i, piece in enumerate([HEAD, *(chunk(p) for p in SCRIPTS[name]), b"0\r\n\r\n"]):
                    if i:
                        await asyncio.sleep(self.gap_s)     # the scenario's pacing, not a wait
                    sent.append(time.perf_counter_ns())
                    writer.write(piece)
                    await writer.drain()
                print(f"SENT {name} {json.dumps(sent)}", flush=True)
        finally:
            writer.close()


async def main(gap_ms: float) -> None:
    import socket

    srv = await asyncio.start_server(Server(gap_ms / 1e3).handle, "127.0.0.1", 0)
    for s in srv.sockets:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    print(f"PORT {srv.sockets[0].getsockname()[1]}", flush=True)
    async with srv:
        await srv.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0))
