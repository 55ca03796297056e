"""OpenAI chat parameters that neither zgtool's engine nor pygw (translating to Anthropic) can honour:
accepted only at a value that changes nothing, else a 400 unsupported_parameter (as vLLM and
OpenAI answer). One table for both sides, so the engine and the gateway refuse the same bodies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _zero(v: Any) -> bool:
    return v is None or (isinstance(v, int | float) and not isinstance(v, bool) and v == 0)


UNSUPPORTED: dict[str, Callable[[Any], bool]] = {
    "tools": lambda v: not v,
    "tool_choice": lambda v: v in (None, "none", "auto"),
    "functions": lambda v: not v,
    "function_call": lambda v: v in (None, "none", "auto"),
    "parallel_tool_calls": lambda v: True,
    "logprobs": lambda v: v in (None, False),
    "top_logprobs": lambda v: v in (None, 0),
    "response_format": lambda v: v is None or (isinstance(v, dict) and v.get("type") == "text"),
    "presence_penalty": _zero,
    "frequency_penalty": _zero,
    "logit_bias": lambda v: not v,
    "audio": lambda v: v is None,
    "modalities": lambda v: v is None or v == ["text"],
    "prediction": lambda v: v is None,
    "web_search_options": lambda v: v is None,
}
