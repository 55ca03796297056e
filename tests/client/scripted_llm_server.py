"""A real scripted HTTP server for client tests: it answers each request with the next scripted Step.

It speaks just enough Anthropic (/v1/messages) and OpenAI (/v1/chat/completions) to satisfy
the official SDKs, and can delay, fail with any status and headers, or cut a stream.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from zgtool.http.net import free_port as free_port  # re-exported: other modules import it from here


@dataclass
class Step:
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: Any = None                      # JSON body; None: a success (or the error body for >= 400)
    events: list[tuple[str, dict[str, Any]]] | None = None  # SSE events; None: default for streams
    cut_after: int | None = None          # send this many SSE events, then drop the connection
    close_after: int | None = None        # send this many SSE events, then end the body cleanly
    delay_s: float = 0.0                  # wait before answering (drives client timeouts)
    content_type: str = "application/json"  # e.g. text/html for a proxy's error page (body as bytes)


@dataclass
class Seen:
    at_s: float
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def anthropic_message(model: str, text: str = "hello there") -> dict[str, Any]:
    return {"id": "msg_test", "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": 2}}


def anthropic_events(model: str, pieces: tuple[str, ...] = ("Hel", "lo", "!")) -> list[tuple[str, dict]]:
    msg = anthropic_message(model, "") | {"content": [], "stop_reason": None}
    evs: list[tuple[str, dict]] = [
        ("message_start", {"type": "message_start", "message": msg}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("ping", {"type": "ping"}),
    ]
    evs += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                     "delta": {"type": "text_delta", "text": p}}) for p in pieces]
    evs += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                           "usage": {"output_tokens": len(pieces)}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return evs


def openai_completion(model: str, text: str = "hello there") -> dict[str, Any]:
    return {"id": "chatcmpl-test", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}


def openai_events(model: str, pieces: tuple[str, ...] = ("Hel", "lo", "!")) -> list[tuple[str, dict]]:
    def chunk(delta: dict, finish: str | None) -> tuple[str, dict]:
        return ("", {"id": "chatcmpl-test", "object": "chat.completion.chunk", "created": 0, "model": model,
                     "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    return [chunk({"role": "assistant", "content": ""}, None)] + [chunk({"content": p}, None) for p in pieces] \
        + [chunk({}, "stop")]


ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 408: "timeout_error",
               409: "conflict_error", 429: "rate_limit_error", 500: "api_error", 503: "api_error",
               504: "timeout_error", 529: "overloaded_error"}


class ScriptedServer:
    def __init__(self) -> None:
        self.steps: deque[Step] = deque()
        self.seen: list[Seen] = []
        self.stop = threading.Event()
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with server._lock:
                    server.seen.append(Seen(time.monotonic(), self.path, {k.lower(): v for k, v in
                                                                            self.headers.items()}, body))
                    step = server.steps.popleft() if server.steps else Step()
                if step.delay_s and server.stop.wait(step.delay_s):
                    return
                try:
                    server._answer(self, step, body)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client gave up (timeout): nothing to tell it

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), name="scripted-server", daemon=True)
        self._thread.start()

    def script(self, *steps: Step) -> ScriptedServer:
        with self._lock:
            self.steps.extend(steps)
        return self

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    def _answer(self, h: BaseHTTPRequestHandler, step: Step, req: dict[str, Any]) -> None:
        is_openai = h.path.endswith("/chat/completions")
        model = str(req.get("model", "?"))
        if step.status >= 400 or not req.get("stream"):
            if step.body is not None:
                payload = step.body
            elif step.status >= 400:
                etype = ERROR_TYPES.get(step.status, "api_error")
                payload = ({"error": {"message": f"scripted {step.status}", "type": etype}} if is_openai else
                           {"type": "error", "error": {"type": etype, "message": f"scripted {step.status}"}})
            else:
                payload = openai_completion(model) if is_openai else anthropic_message(model)
            data = json.dumps(payload).encode() if not isinstance(payload, bytes) else payload
            h.send_response(step.status)
            h.send_header("content-type", step.content_type)
            h.send_header("content-length", str(len(data)))
            for k, v in step.headers.items():
                h.send_header(k, v)
            h.end_headers()
            h.wfile.write(data)
            return
        events = step.events if step.events is not None else (openai_events(model) if is_openai
                                                                else anthropic_events(model))
        h.send_response(step.status)
        h.send_header("content-type", "text/event-stream")
        h.send_header("transfer-encoding", "chunked")
        for k, v in step.headers.items():
            h.send_header(k, v)
        h.end_headers()
        limit = step.cut_after if step.cut_after is not None else step.close_after
        for i, (name, data) in enumerate(events):
            if limit is not None and i >= limit:
                break
            frame = (f"event: {name}\n" if name else "") + f"data: {json.dumps(data)}\n\n"
            self._chunk(h, frame.encode())
        if step.cut_after is not None:
            # Drop the connection mid-body: no terminating chunk, as a crashed upstream would.
            h.wfile.flush()
            h.connection.shutdown(socket.SHUT_RDWR)
            h.close_connection = True
            return
        if is_openai and step.close_after is None:
            self._chunk(h, b"data: [DONE]\n\n")
        self._chunk(h, b"")

    @staticmethod
    def _chunk(h: BaseHTTPRequestHandler, data: bytes) -> None:
        h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        h.wfile.flush()


