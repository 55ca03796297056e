"""OpenAI Chat Completions: request parsing, response body and stream chunks.

Streams end with ``data: [DONE]``. The per-request timing rides as an SSE comment line
(``: zgtool-timing {json}``) just before it, which SSE clients (the official SDK too) drop.
"""

from __future__ import annotations

import json
import time
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any

from zgtool.engine.api.common import (
    ChatRequest,
    ParamError,
    opt_bool,
    opt_float,
    opt_int,
    opt_seed,
    reject_unsupported,
    req_str,
    str_list,
    text_content,
)
from zgtool.engine.errors import InvalidRequest
from zgtool.http.finish import openai_finish_reason
from zgtool.http.openai_params import UNSUPPORTED as OPENAI_UNSUPPORTED
from zgtool.http.sse import DONE, timing_comment

ROLES = ("system", "developer", "user", "assistant")
_dumps = json.dumps


UNSUPPORTED = OPENAI_UNSUPPORTED  # zgtool/http/openai_params.py: one table for the engine and pygw


def _messages(obj: dict[str, Any]) -> tuple[list[dict[str, str]], str | None]:
    if "messages" not in obj:
        raise InvalidRequest("messages: field required")
    raw = obj["messages"]
    if not isinstance(raw, list) or not raw:
        raise InvalidRequest("messages: must be a non-empty array of messages")
    out: list[dict[str, str]] = []
    system: list[str] = []
    for i, msg in enumerate(raw):
        if not isinstance(msg, dict):
            raise InvalidRequest(f"messages.{i}: must be an object with role and content")
        role = req_str(msg, "role", f"messages.{i}.")
        if role not in ROLES:
            raise InvalidRequest(f"messages.{i}.role: {role!r} is not supported; use one of {', '.join(ROLES)}")
        if "content" not in msg or msg["content"] is None:
            raise InvalidRequest(f"messages.{i}.content: field required (tool calls are not supported)")
        text = text_content(msg["content"], f"messages.{i}.content")
        if role in ("system", "developer"):
            system.append(text)
        else:
            out.append({"role": role, "content": text})
    if not out:
        raise InvalidRequest("messages: at least one user or assistant message is required")
    return out, ("\n".join(system) if system else None)


OPENAI_MAX_STOP = 4  # OpenAI's documented limit for `stop` (up to 4 sequences)


def _stop(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,) if value else ()
    stops = str_list(value, "stop")
    if len(stops) > OPENAI_MAX_STOP:
        raise InvalidRequest(f"stop: at most {OPENAI_MAX_STOP} sequences, got {len(stops)}")
    return stops


def parse_chat(obj: dict[str, Any], max_tokens_limit: int) -> ChatRequest:
    """POST /v1/chat/completions body -> ChatRequest (raises InvalidRequest naming the field)."""
    model = req_str(obj, "model")
    messages, system = _messages(obj)
    key = "max_completion_tokens" if obj.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = opt_int(obj, key, None)
    if max_tokens is not None and max_tokens < 1:
        raise InvalidRequest(f"{key}: must be at least 1, got {max_tokens}")
    if max_tokens is not None and max_tokens > max_tokens_limit:
        raise InvalidRequest(f"{key}: {max_tokens} is above this model's limit of {max_tokens_limit}")
    n = opt_int(obj, "n", 1)
    if n != 1:
        raise ParamError(f"n: only n=1 is supported, got {n}", param="n", code="unsupported_parameter")
    reject_unsupported(obj, UNSUPPORTED)
    top_p = opt_float(obj, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise InvalidRequest("top_p: must be greater than 0")
    top_k = opt_int(obj, "top_k", 0)
    if top_k is not None and top_k < 0:
        raise InvalidRequest(f"top_k: must be >= 0, got {top_k}")
    options = obj.get("stream_options") or {}
    if not isinstance(options, dict):
        raise InvalidRequest("stream_options: must be an object")
    stream = opt_bool(obj, "stream")
    return ChatRequest(
        api="openai",
        model=model,
        messages=messages,
        system=system,
        max_tokens=max_tokens,
        temperature=opt_float(obj, "temperature", 1.0, 0.0, 2.0),
        top_p=top_p,
        top_k=top_k or 0,
        stop=_stop(obj.get("stop")),
        seed=opt_seed(obj),
        ignore_eos=opt_bool(obj, "ignore_eos"),
        stream=stream,
        include_usage=stream and opt_bool(options, "include_usage"),
    )


finish_reason = openai_finish_reason


def usage_obj(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def completion_body(
    cmpl_id: str, model: str, text: str, reason: str | None, usage: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": cmpl_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason(reason),
        }],
        "usage": usage,
    }


class ChunkWriter:
    """Builds the ``data:`` lines of one stream; the per-token line is a byte template."""

    def __init__(self, cmpl_id: str, model: str) -> None:
        self.created = int(time.time())
        self.cmpl_id = cmpl_id
        self.model = model
        self._head = (
            b'data: {"id":' + _dumps(cmpl_id).encode() + b',"object":"chat.completion.chunk","created":'
            + str(self.created).encode() + b',"model":' + _dumps(model).encode()
        )

    def _chunk(self, extra: dict[str, Any]) -> bytes:
        obj = {"id": self.cmpl_id, "object": "chat.completion.chunk", "created": self.created, "model": self.model}
        obj.update(extra)
        return b"data: " + _dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    def role(self) -> bytes:
        return self._head + (
            b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            b'"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def content(self, text: str) -> bytes:
        return (
            self._head + b',"choices":[{"index":0,"delta":{"content":' + _json_str(text).encode()
            + b'},"logprobs":null,"finish_reason":null}]}\n\n'
        )

    def tail(self, reason: str | None, usage: dict[str, Any] | None, timing: dict[str, Any]) -> bytes:
        """finish chunk, optional usage chunk (choices: []), the timing comment, then [DONE]."""
        finish: dict[str, Any] = {
            "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason(reason)}]
        }
        out = self._chunk(finish)
        if usage is not None:
            out += self._chunk({"choices": [], "usage": usage})
        return out + timing_comment(timing) + DONE

    def error(self, payload: dict[str, Any]) -> bytes:
        """An error after the 200: one error chunk (the SDK raises APIError on a data object
        with "error", as vLLM sends it), then [DONE]."""
        return b"data: " + _dumps(payload, separators=(",", ":")).encode() + b"\n\n" + DONE
