"""What both wire formats parse into (ChatRequest) and the small validators they share.

Validation failures raise zgtool.engine.errors.InvalidRequest with a message that names
the offending field (``messages.0.content: ...``); the server maps it to a 400 once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from zgtool.engine.errors import InvalidRequest


@dataclass
class ChatRequest:
    """One chat request, independent of the API it arrived through."""

    api: str                                  # "anthropic" | "openai"
    model: str
    messages: list[dict[str, str]]            # [{"role": ..., "content": str}]
    system: str | None = None
    max_tokens: int | None = None             # None: fill the remaining context (OpenAI)
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    stream: bool = False
    include_usage: bool = False               # OpenAI stream_options.include_usage
    metadata: dict[str, Any] = field(default_factory=dict)

    def input_text(self) -> str:
        """Everything the client sent as text, for the input safety check."""
        parts = [m["content"] for m in self.messages]
        if self.system:
            parts.append(self.system)
        return "\n".join(parts)


def load_json_object(body: bytes) -> dict[str, Any]:
    """Decode a request body; bad UTF-8 and bad JSON are client errors, never 500s."""
    if not body:
        raise InvalidRequest("request body is empty; send a JSON object")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"request body is not valid UTF-8 (byte {exc.start})") from exc
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from exc
    if not isinstance(obj, dict):
        raise InvalidRequest(f"request body must be a JSON object, not {_type_name(obj)}")
    return obj


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def req_str(obj: dict[str, Any], key: str, where: str = "") -> str:
    if key not in obj:
        raise InvalidRequest(f"{where}{key}: field required")
    value = obj[key]
    if not isinstance(value, str):
        raise InvalidRequest(f"{where}{key}: must be a string, not {_type_name(value)}")
    return value


def opt_int(obj: dict[str, Any], key: str, default: int | None) -> int | None:
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{key}: must be an integer, not {_type_name(value)}")
    return value


def opt_float(obj: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = obj.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequest(f"{key}: must be a number, not {_type_name(value)}")
    if not lo <= value <= hi:
        raise InvalidRequest(f"{key}: must be between {lo:g} and {hi:g}, got {value!r}")
    return float(value)


def opt_bool(obj: dict[str, Any], key: str, default: bool = False) -> bool:
    value = obj.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"{key}: must be a boolean, not {_type_name(value)}")
    return value


def str_list(value: Any, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise InvalidRequest(f"{key}: must be an array of strings")
    if any(not s for s in value):
        raise InvalidRequest(f"{key}: stop sequences must not be empty strings")
    return tuple(value)


def text_content(content: Any, where: str, text_types: tuple[str, ...] = ("text",)) -> str:
    """A message's content as one string: a plain string or a list of text blocks.

    Non-text blocks (images, documents, tools) get a clear "not supported" instead of
    being silently dropped, so a client never gets an answer to half its prompt.
    """
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}: must be a string or an array of content blocks, not {_type_name(content)}")
    parts: list[str] = []
    for i, block in enumerate(content):
        if not isinstance(block, dict):
            raise InvalidRequest(f"{where}.{i}: must be a content block object, not {_type_name(block)}")
        btype = block.get("type")
        if btype not in text_types:
            raise InvalidRequest(
                f"{where}.{i}.type: {btype!r} content blocks are not supported by this server; "
                "only text content is supported"
            )
        text = block.get("text")
        if not isinstance(text, str):
            raise InvalidRequest(f"{where}.{i}.text: must be a string, not {_type_name(text)}")
        parts.append(text)
    return "".join(parts)
