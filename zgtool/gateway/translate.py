"""OpenAI chat completions <-> Anthropic messages for pygw.

pygw accepts either API at the front and always calls the upstream's Anthropic API.
Error bodies, the SSE parser and finish reasons come from the shared kit (zgtool.http).

OpenAI parameters and what pygw does with them:
    n                       1 or null (the default); anything else is a 400
    max_tokens /            an integer >= 1 is forwarded; 0 or a negative number is a 400 (the
    max_completion_tokens   engine's own OpenAI API answers the same); absent: DEFAULT_MAX_TOKENS,
                            which zgtool's engine replaces with the rest of the context (pygw says so
                            in x-zgtool-max-tokens-default)
    temperature             OpenAI's 0..2; the Anthropic API takes 0..1, so values above 1
                            are clamped to 1.0 (the answer says so in x-gateway-adjusted)
    top_p                   0..1, forwarded
    stop                    a string or a list of up to 4 strings (else 400)
    seed                    a 64-bit integer, forwarded as `seed` (zgtool's engine honours it)
    stream_options          an object (null allowed) with a boolean include_usage (else 400)
    user                    forwarded as metadata.user_id
    top_k                   an integer >= 0, forwarded (the Anthropic API has it)
    ignore_eos              a boolean (else 400, as the engine answers); true is forwarded as the
                            zgtool extension `ignore_eos`
    tools, logprobs, response_format, penalties, logit_bias, ... (UNTRANSLATED): no Anthropic
                            form here. At a value that changes nothing they are accepted; at any
                            other a 400 in the engine's own words (code unsupported_parameter),
                            never silently dropped (the client would get an answer it did not ask for)
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from zgtool.http.body import type_name
from zgtool.http.errors import ApiError, error_payload, parse_error_body
from zgtool.http.finish import openai_from_anthropic
from zgtool.http.openai_params import UNSUPPORTED as OPENAI_UNSUPPORTED
from zgtool.http.sse import SSEParser, comment

DEFAULT_MAX_TOKENS = 1024
ANTHROPIC_MAX_TEMPERATURE = 1.0
SEED_MAX = 2**63 - 1


class TranslationError(ApiError):
    """The front request cannot be expressed upstream (400 invalid_request_error)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(400, "invalid_request_error", message, param=param, code=code)


UNTRANSLATED = OPENAI_UNSUPPORTED  # zgtool/http/openai_params.py: one table for the engine and pygw


def _reject_untranslated(req: dict[str, Any]) -> None:
    for param, ok in UNTRANSLATED.items():
        if param in req and not ok(req[param]):
            raise TranslationError(f"{param}: this parameter is not supported by this server; "
                                   f"remove it or leave it at its default", param, "unsupported_parameter")


def upstream_error_to_openai(body: bytes, status: int) -> bytes:
    """Re-shape an upstream Anthropic error body for an OpenAI client."""
    return json.dumps(error_payload(parse_error_body(body, status), "openai", "")).encode()


def _text_of(content: Any, where: str) -> str:
    """Text of an OpenAI content value (string or list of parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if not isinstance(p, dict) or p.get("type") != "text":
                raise TranslationError("only text content parts are supported", where)
            text = p.get("text", "")
            if not isinstance(text, str):
                raise TranslationError("a text part's text must be a string", where)
            parts.append(text)
        return "".join(parts)
    raise TranslationError("message content must be a string or a list of text parts", where)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(req: dict[str, Any], key: str, lo: float, hi: float) -> float | None:
    v = req.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not lo <= v <= hi:
        raise TranslationError(f"{key}: must be a number between {lo:g} and {hi:g}, got {v!r}", key)
    return float(v) if isinstance(v, float) else v


def _max_tokens(req: dict[str, Any]) -> int:
    key = "max_completion_tokens" if req.get("max_completion_tokens") is not None else "max_tokens"
    v = req.get(key)
    if v is None:
        return DEFAULT_MAX_TOKENS
    if not _is_int(v) or v < 1:
        raise TranslationError(f"{key}: must be an integer >= 1, got {v!r}", key)
    return int(v)


def _stop(req: dict[str, Any]) -> list[str] | None:
    stop = req.get("stop")
    if stop is None:
        return None
    if isinstance(stop, str):
        return [stop] if stop else None
    if isinstance(stop, list) and len(stop) <= 4 and all(isinstance(s, str) for s in stop):
        return [s for s in stop if s] or None
    raise TranslationError("stop: must be a string or an array of up to 4 strings", "stop")


def _stream_options(req: dict[str, Any]) -> dict[str, Any]:
    opts = req.get("stream_options")
    if opts is None:
        return {}
    if not isinstance(opts, dict):
        raise TranslationError("stream_options: must be an object", "stream_options")
    if opts.get("include_usage") is not None and not isinstance(opts["include_usage"], bool):
        raise TranslationError("stream_options.include_usage: must be a boolean", "stream_options.include_usage")
    return opts


def include_usage(req: dict[str, Any]) -> bool:
    """Whether an OpenAI stream asked for the final usage chunk (validated by openai_to_anthropic)."""
    opts = req.get("stream_options")
    return bool(isinstance(opts, dict) and opts.get("include_usage"))


def openai_to_anthropic(req: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """An OpenAI chat.completions request -> (an Anthropic messages request, the adjustments made)."""
    msgs = req.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise TranslationError("messages: must be a non-empty array", "messages")
    n = req.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise TranslationError(f"n: only 1 choice is supported, got {n!r}", "n")
    system: list[str] = []
    out: list[dict[str, Any]] = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise TranslationError("each message must be an object", f"messages.{i}")
        role = m.get("role")
        if role in ("system", "developer"):
            system.append(_text_of(m.get("content"), f"messages.{i}.content"))
        elif role in ("user", "assistant"):
            out.append({"role": role, "content": _text_of(m.get("content"), f"messages.{i}.content")})
        else:
            raise TranslationError(f"message role {role!r} is not supported", f"messages.{i}.role")
    model = req.get("model", "default")
    if not isinstance(model, str):
        raise TranslationError("model: must be a string", "model")
    body: dict[str, Any] = {"model": model, "messages": out, "max_tokens": _max_tokens(req)}
    _reject_untranslated(req)
    adjusted: list[str] = []
    if system:
        body["system"] = "\n\n".join(system)
    temperature = _number(req, "temperature", 0.0, 2.0)
    if temperature is not None:
        if temperature > ANTHROPIC_MAX_TEMPERATURE:
            adjusted.append(f"temperature={temperature:g}->{ANTHROPIC_MAX_TEMPERATURE:g}")
            temperature = ANTHROPIC_MAX_TEMPERATURE
        body["temperature"] = temperature
    top_p = _number(req, "top_p", 0.0, 1.0)
    if top_p is not None:
        body["top_p"] = top_p
    stop = _stop(req)
    if stop:
        body["stop_sequences"] = stop
    seed = req.get("seed")
    if seed is not None:
        if not _is_int(seed) or not -SEED_MAX - 1 <= seed <= SEED_MAX:
            raise TranslationError("seed: must be a 64-bit integer", "seed")
        body["seed"] = seed
    top_k = req.get("top_k")
    if top_k is not None:
        if not _is_int(top_k) or top_k < 0:
            raise TranslationError(f"top_k: must be an integer >= 0, got {top_k!r}", "top_k")
        body["top_k"] = top_k
    ignore_eos = req.get("ignore_eos")
    if ignore_eos is not None:
        if not isinstance(ignore_eos, bool):
            raise TranslationError(f"ignore_eos: must be a boolean, not {type_name(ignore_eos)}", "ignore_eos")
        if ignore_eos:
            body["ignore_eos"] = True
    _stream_options(req)
    stream = req.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise TranslationError("stream: must be a boolean", "stream")
    if stream:
        body["stream"] = True
    if req.get("user"):
        body["metadata"] = {"user_id": str(req["user"])}
    return body, adjusted


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
    # Anthropic's input_tokens leaves out the prompt-cache reads and writes; OpenAI's prompt_tokens
    # counts the whole prompt
    p = sum(int(u.get(k) or 0) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
    c = int(u.get("output_tokens") or 0)
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
                "finish_reason": openai_from_anthropic(resp.get("stop_reason")),
                "logprobs": None,
            }
        ],
        "usage": _usage(resp.get("usage") or {}),
    }


def anthropic_models_to_openai(resp: dict[str, Any], created: int) -> dict[str, Any]:
    """An Anthropic models list -> OpenAI's (what openai's client.models.list() parses)."""
    data = []
    for m in resp.get("data") or []:
        if isinstance(m, dict) and m.get("id"):
            data.append({"id": str(m["id"]), "object": "model", "created": int(m.get("created") or created),
                         "owned_by": str(m.get("owned_by") or "pygw")})
    return {"object": "list", "data": data}


class StreamWatch:
    """Follows an upstream Anthropic SSE stream: its usage, whether it ended properly
    (message_stop, no error event) and, for OpenAI clients, the chunks to send instead."""

    def __init__(self, openai_model: str | None, include_usage: bool = False) -> None:
        self.parser = SSEParser()
        self.conv = OpenAIStream(openai_model, include_usage) if openai_model is not None else None
        self.usage: dict[str, Any] = {}
        self.complete = False
        self.errored = False

    def feed(self, chunk: bytes) -> bytes:
        """The bytes to send the client for this upstream chunk."""
        out: list[bytes] = []
        for ev in self.parser.feed(chunk):
            if self.conv is not None and ev.comments:  # e.g. the engine's timing: kept for OpenAI clients too
                out.extend(comment(c) for c in ev.comments)
            if not ev.data:
                continue
            try:
                obj = json.loads(ev.data)
            except ValueError:
                continue
            if not isinstance(obj, dict):
                continue
            typ = obj.get("type", ev.event)
            if typ == "message_start":
                self.usage.update((obj.get("message") or {}).get("usage") or {})
            elif typ == "message_delta":
                self.usage.update(obj.get("usage") or {})
            elif typ == "message_stop":
                self.complete = not self.errored
            elif typ == "error" or ev.event == "error":
                self.errored, self.complete = True, False
            if self.conv is not None:
                out.append(self.conv.feed(typ, obj))
        return chunk if self.conv is None else b"".join(out)

    @property
    def tokens(self) -> int:
        return int(self.usage.get("input_tokens") or 0) + int(self.usage.get("output_tokens") or 0)


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

    def feed(self, typ: str, ev: dict[str, Any]) -> bytes:
        """The bytes to send for one upstream event (b"" for events OpenAI has no form of)."""
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
            return self._chunk({}, openai_from_anthropic((ev.get("delta") or {}).get("stop_reason")))
        if typ == "message_stop":
            tail = b""
            if self.include_usage:
                obj = {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                       "model": self.model, "choices": [], "usage": _usage(self.usage)}
                tail = b"data: " + json.dumps(obj).encode() + b"\n\n"
            return tail + b"data: [DONE]\n\n"
        if typ == "error":
            err = ev.get("error") or {}
            return (b"data: " + upstream_error_to_openai(json.dumps({"error": err}).encode(), 500) + b"\n\n"
                    + b"data: [DONE]\n\n")
        if typ == "ping":  # the upstream's keepalive: an SSE comment, OpenAI's clients drop it
            return b": keepalive\n\n"
        return b""  # content_block_start/stop, timing
