"""OpenAI chat completions <-> Anthropic messages, and the error shapes of both APIs.

pygw accepts either API at the front and always calls the upstream's Anthropic API.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

DEFAULT_MAX_TOKENS = 1024

# Anthropic error type -> (OpenAI type, OpenAI code)
_OPENAI_ERR = {
    "invalid_request_error": ("invalid_request_error", None),
    "authentication_error": ("invalid_request_error", "invalid_api_key"),
    "permission_error": ("invalid_request_error", "permission_denied"),
    "not_found_error": ("invalid_request_error", "not_found"),
    "request_too_large": ("invalid_request_error", "request_too_large"),
    "rate_limit_error": ("requests", "rate_limit_exceeded"),
    "api_error": ("server_error", None),
    "overloaded_error": ("server_error", "overloaded"),
    "timeout_error": ("server_error", "timeout"),
}
_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "refusal": "content_filter"}


class TranslationError(ValueError):
    """The front request cannot be expressed upstream (400 invalid_request_error)."""


def error_body(front: str, err_type: str, message: str, request_id: str) -> bytes:
    """An error in the front API's own shape."""
    if front == "openai":
        typ, code = _OPENAI_ERR.get(err_type, ("server_error", None))
        return json.dumps({"error": {"message": message, "type": typ, "param": None, "code": code}}).encode()
    return json.dumps(
        {"type": "error", "error": {"type": err_type, "message": message}, "request_id": request_id}
    ).encode()


def upstream_error_to_openai(body: bytes, status: int) -> bytes:
    """Re-shape an upstream Anthropic error body for an OpenAI client."""
    try:
        err = json.loads(body)["error"]
        err_type, message = str(err.get("type", "api_error")), str(err.get("message", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        err_type = "api_error" if status >= 500 else "invalid_request_error"
        message = body[:500].decode(errors="replace") or f"upstream answered {status}"
    return error_body("openai", err_type, message, "")


def _text_of(content: Any) -> str:
    """Text of an OpenAI content value (string or list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text":
                raise TranslationError("only text content parts are supported")
            parts.append(str(p.get("text", "")))
        return "".join(parts)
    raise TranslationError("message content must be a string or a list of text parts")


def openai_to_anthropic(req: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat.completions request -> an Anthropic messages request."""
    msgs = req.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise TranslationError("messages must be a non-empty list")
    if req.get("n", 1) != 1:
        raise TranslationError("n > 1 is not supported")
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for m in msgs:
        if not isinstance(m, dict):
            raise TranslationError("each message must be an object")
        role = m.get("role")
        if role in ("system", "developer"):
            system.append(_text_of(m.get("content")))
        elif role in ("user", "assistant"):
            out.append({"role": role, "content": _text_of(m.get("content"))})
        else:
            raise TranslationError(f"message role {role!r} is not supported")
    body: dict[str, Any] = {
        "model": req.get("model", "default"),
        "messages": out,
        "max_tokens": req.get("max_completion_tokens") or req.get("max_tokens") or DEFAULT_MAX_TOKENS,
    }
    if system:
        body["system"] = "\n\n".join(system)
    for key in ("temperature", "top_p"):
        if req.get(key) is not None:
            body[key] = req[key]
    stop = req.get("stop")
    if stop:
        body["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    if req.get("stream"):
        body["stream"] = True
    if req.get("user"):
        body["metadata"] = {"user_id": str(req["user"])}
    return body


def anthropic_input_text(req: dict[str, Any]) -> str:
    """All input text of an Anthropic request (system + messages), for moderation."""
    parts: list[str] = []
    system = req.get("system")
    if isinstance(system, str):
        parts.append(system)
    elif isinstance(system, list):
        parts.extend(str(b.get("text", "")) for b in system if isinstance(b, dict))
    for m in req.get("messages") or []:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return "\n".join(parts)


def _usage(u: dict[str, Any]) -> dict[str, int]:
    p, c = int(u.get("input_tokens", 0)), int(u.get("output_tokens", 0))
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def anthropic_to_openai(resp: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic message -> an OpenAI chat.completion."""
    text = "".join(b.get("text", "") for b in resp.get("content") or [] if b.get("type") == "text")
    return {
        "id": "chatcmpl-" + str(resp.get("id", "")).removeprefix("msg_"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": resp.get("model", ""),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": _FINISH.get(resp.get("stop_reason") or "", "stop"),
                "logprobs": None,
            }
        ],
        "usage": _usage(resp.get("usage") or {}),
    }


def iter_sse(buf: bytearray) -> Iterator[tuple[str, str]]:
    """Pop complete SSE events (event name, data) off the front of `buf`."""
    while True:
        end = buf.find(b"\n\n")
        sep = 2
        crlf = buf.find(b"\r\n\r\n")
        if crlf != -1 and (end == -1 or crlf < end):
            end, sep = crlf, 4
        if end == -1:
            return
        raw = bytes(buf[:end]).decode("utf-8", errors="replace")
        del buf[: end + sep]
        event, data = "message", []
        for line in raw.splitlines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
        yield event, "\n".join(data)


class OpenAIStream:
    """Turns Anthropic SSE events into OpenAI chat.completion.chunk lines."""

    def __init__(self, model: str, include_usage: bool) -> None:
        self.id = "chatcmpl-"
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage
        self.usage: dict[str, Any] = {}

    def _chunk(self, delta: dict[str, Any], finish: str | None) -> bytes:
        obj = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    def feed(self, event: str, data: str) -> bytes:
        """The bytes to send for one upstream event (b"" for events OpenAI has no form of)."""
        if not data:
            return b""
        try:
            ev = json.loads(data)
        except ValueError:
            return b""
        typ = ev.get("type", event)
        if typ == "message_start":
            msg = ev.get("message") or {}
            self.id = "chatcmpl-" + str(msg.get("id", "")).removeprefix("msg_")
            self.model = msg.get("model") or self.model
            self.usage.update(msg.get("usage") or {})
            return self._chunk({"role": "assistant", "content": ""}, None)
        if typ == "content_block_delta":
            d = ev.get("delta") or {}
            return self._chunk({"content": d.get("text", "")}, None) if d.get("type") == "text_delta" else b""
        if typ == "message_delta":
            self.usage.update(ev.get("usage") or {})
            reason = (ev.get("delta") or {}).get("stop_reason")
            return self._chunk({}, _FINISH.get(reason or "", "stop"))
        if typ == "message_stop":
            tail = b""
            if self.include_usage:
                obj = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                       "model": self.model, "choices": [], "usage": _usage(self.usage)}
                tail = b"data: " + json.dumps(obj).encode() + b"\n\n"
            return tail + b"data: [DONE]\n\n"
        if typ == "error":
            err = ev.get("error") or {}
            return b"data: " + upstream_error_to_openai(json.dumps({"error": err}).encode(), 500) + b"\n\n"
        return b""  # ping, content_block_start/stop, the engine's timing event
