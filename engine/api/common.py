"""What both wire formats parse into (ChatRequest) and the small validators they share.

Validation failures raise zgtool.engine.errors.InvalidRequest with a message that names
the offending field (``messages.0.content: ...``); the server maps it to a 400 once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zgtool.engine.errors import InvalidRequest
from zgtool.http.body import type_name as _type_name

SEED_MAX = 2**63 - 1          # what torch.Generator.manual_seed and numpy accept


class ParamError(InvalidRequest):
    """A 400 that names its parameter (OpenAI's ``param``) and, optionally, an OpenAI ``code``."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


def unsupported(param: str, what: str = "") -> ParamError:
    return ParamError(f"{param}: {what or 'this parameter'} is not supported by this server; "
                      f"remove it or leave it at its default", param=param, code="unsupported_parameter")


def reject_unsupported(obj: dict[str, Any], checks: dict[str, Any]) -> None:
    """400 for each parameter set to something other than a harmless default. ``checks`` maps a
    parameter to a predicate ``ok(value) -> bool`` (or a tuple of accepted values)."""
    for param, ok in checks.items():
        if param not in obj:
            continue
        value = obj[param]
        accepted = ok(value) if callable(ok) else value in ok
        if not accepted:
            raise unsupported(param)


def opt_seed(obj: dict[str, Any], key: str = "seed") -> int | None:
    seed = opt_int(obj, key, None)
    if seed is not None and not -SEED_MAX - 1 <= seed <= SEED_MAX:
        raise ParamError(f"{key}: must be a 64-bit integer, got a {len(str(abs(seed)))}-digit number", param=key)
    return seed


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
