"""Anthropic Messages API: request parsing, the response body and the exact SSE sequence.

SSE order (official): message_start, content_block_start, ping, content_block_delta*,
content_block_stop, message_delta, message_stop. The per-request timing rides as an SSE
comment line (``: zgtool-timing {json}``) just before message_stop: SSE clients, the
official SDKs included, drop comments, so user code never sees it.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii as _json_str
from typing import Any

from zgtool.engine.api.common import (
    ChatRequest,
    opt_bool,
    opt_float,
    opt_int,
    opt_seed,
    reject_unsupported,
    req_str,
    str_list,
    text_content,
    unsupported,
)
from zgtool.engine.errors import InvalidRequest
from zgtool.http.finish import anthropic_stop_reason
from zgtool.http.sse import timing_comment

ROLES = ("user", "assistant")
_dumps = json.dumps

# Parameters this server cannot honour: accepted only at values that change nothing.
UNSUPPORTED = {
    "thinking": lambda v: v is None or (isinstance(v, dict) and v.get("type") == "disabled"),
    "tool_choice": lambda v: v is None or (isinstance(v, dict) and v.get("type") in ("auto", "none")),
    "mcp_servers": lambda v: not v,
    "container": lambda v: v is None,
}


def _messages(obj: dict[str, Any]) -> list[dict[str, str]]:
    if "messages" not in obj:
        raise InvalidRequest("messages: field required")
    raw = obj["messages"]
    if not isinstance(raw, list):
        raise InvalidRequest("messages: must be an array of messages")
    if not raw:
        raise InvalidRequest("messages: at least one message is required")
    out: list[dict[str, str]] = []
    for i, msg in enumerate(raw):
        if not isinstance(msg, dict):
            raise InvalidRequest(f"messages.{i}: must be an object with role and content")
        role = req_str(msg, "role", f"messages.{i}.")
        if role not in ROLES:
            raise InvalidRequest(f"messages.{i}.role: must be 'user' or 'assistant', got {role!r}")
        if "content" not in msg:
            raise InvalidRequest(f"messages.{i}.content: field required")
        out.append({"role": role, "content": text_content(msg["content"], f"messages.{i}.content")})
    return out


def _system(obj: dict[str, Any]) -> str | None:
    system = obj.get("system")
    if system is None:
        return None
    return text_content(system, "system")


def parse_messages(obj: dict[str, Any], max_tokens_limit: int) -> ChatRequest:
    """POST /v1/messages body -> ChatRequest (raises InvalidRequest naming the field)."""
    model = req_str(obj, "model")
    messages = _messages(obj)
    if "max_tokens" not in obj:
        raise InvalidRequest("max_tokens: field required")
    max_tokens = opt_int(obj, "max_tokens", None)
    if max_tokens is None or max_tokens < 1:
        raise InvalidRequest(f"max_tokens: must be at least 1, got {obj['max_tokens']!r}")
    if max_tokens > max_tokens_limit:
        raise InvalidRequest(
            f"max_tokens: {max_tokens} > {max_tokens_limit}, which is the maximum allowed "
            f"number of output tokens for {model}"
        )
    top_p = opt_float(obj, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise InvalidRequest("top_p: must be greater than 0")
    top_k = opt_int(obj, "top_k", 0)
    if top_k is not None and top_k < 0:
        raise InvalidRequest(f"top_k: must be >= 0, got {top_k}")
    reject_unsupported(obj, UNSUPPORTED)
    if obj.get("tools"):
        raise unsupported("tools", "tool use")
    metadata = obj.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise InvalidRequest("metadata: must be an object")
    return ChatRequest(
        api="anthropic",
        model=model,
        messages=messages,
        system=_system(obj),
        max_tokens=max_tokens,
        temperature=opt_float(obj, "temperature", 1.0, 0.0, 1.0),
        top_p=top_p,
        top_k=top_k or 0,
        stop=str_list(obj.get("stop_sequences"), "stop_sequences"),
        stream=opt_bool(obj, "stream"),
        metadata=metadata,
        seed=opt_seed(obj),  # a zgtool extension (OpenAI's seed; pygw forwards it)
        ignore_eos=opt_bool(obj, "ignore_eos"),  # a zgtool extension too (vLLM's; pygw forwards it)
    )


def parse_count_tokens(obj: dict[str, Any]) -> ChatRequest:
    """POST /v1/messages/count_tokens: model, messages, system (max_tokens not needed)."""
    return ChatRequest(api="anthropic", model=req_str(obj, "model"), messages=_messages(obj), system=_system(obj))


stop_reason = anthropic_stop_reason


def usage_obj(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached_tokens,
        "output_tokens": completion_tokens,
    }


def message_body(
    msg_id: str, model: str, text: str, finish_reason: str | None, stop_sequence: str | None,
    usage: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop_reason(finish_reason, stop_sequence),
        "stop_sequence": stop_sequence,
        "usage": usage,
    }


# --- SSE ------------------------------------------------------------------------------
# The per-token event is built by concatenation: it runs once per token on the I/O loop.

_DELTA_HEAD = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":'
_DELTA_TAIL = b"}}\n\n"
PING = b'event: ping\ndata: {"type":"ping"}\n\n'
BLOCK_START = (
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    b'"content_block":{"type":"text","text":""}}\n\n'
)
BLOCK_STOP = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}\n\n'
MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


def event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _dumps(data, separators=(",", ":")).encode() + b"\n\n"


def stream_head(msg_id: str, model: str, prompt_tokens: int, cached_tokens: int) -> bytes:
    """message_start + content_block_start + ping, sent together right after admission."""
    start = {
        "type": "message_start",
        "message": {
            "id": msg_id, "type": "message", "role": "assistant", "content": [], "model": model,
            "stop_reason": None, "stop_sequence": None,
            "usage": usage_obj(prompt_tokens, 1, cached_tokens),
        },
    }
    return event("message_start", start) + BLOCK_START + PING


def text_delta(text: str) -> bytes:
    # json.dumps(text) is this C function behind two Python calls: the same bytes
    return _DELTA_HEAD + _json_str(text).encode() + _DELTA_TAIL


def stream_tail(
    finish_reason: str | None, stop_sequence: str | None, usage: dict[str, Any], timing: dict[str, Any],
) -> bytes:
    """content_block_stop, message_delta, the timing comment, message_stop."""
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason(finish_reason, stop_sequence), "stop_sequence": stop_sequence},
        "usage": usage,        # cumulative, as the API sends it: input and cache counts too
    }
    return (
        BLOCK_STOP + event("message_delta", delta)
        + timing_comment(timing) + MESSAGE_STOP
    )


def stream_error(payload: dict[str, Any]) -> bytes:
    """An error after the 200 went out: ``event: error`` with the API's error body."""
    return event("error", payload)
