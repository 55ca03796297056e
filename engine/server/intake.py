"""Request bytes -> ChatRequest -> prompt ids, with the event loop's share of the work bounded.

A request's cost is measured by what it makes the server do, not by its characters of text:
200,000 empty messages are 7 MB of JSON, 200,000 validations and a 200,000-turn template with
0 characters of content (issue 22: that request froze the loop for 17 s). So:

- message counts are capped (``MAX_MESSAGES``) before any per-message work: 400 beyond;
- a body over ``OFFLOAD_BODY_BYTES`` is decoded and validated in a worker thread;
- a prompt whose cost (characters + ``MESSAGE_COST_CHARS`` per message) is over
  ``OFFLOAD_COST_CHARS`` is safety-checked and templated in a worker thread.

The loop awaits that work; other streams and /health keep being served meanwhile. (The
worker holds the GIL in C code for at most one JSON decode of ``max_body_bytes``.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from zgtool.engine.api.common import ChatRequest, ParamError
from zgtool.http.body import load_json_object

# Anthropic documents "a limit of 100,000 messages in a single request"; OpenAI documents none,
# so both APIs get the same cap.
MAX_MESSAGES = 100_000
OFFLOAD_BODY_BYTES = 256 * 1024
OFFLOAD_COST_CHARS = 32_768
MESSAGE_COST_CHARS = 64     # a message costs validation + template work even when empty

Parse = Callable[[dict[str, Any], int], ChatRequest]


def check_message_count(obj: dict[str, Any]) -> None:
    """400 before any per-message work when ``messages`` has more entries than the cap."""
    msgs = obj.get("messages")
    if isinstance(msgs, list) and len(msgs) > MAX_MESSAGES:
        raise ParamError(f"messages: at most {MAX_MESSAGES} messages per request, got {len(msgs)}",
                         param="messages", code="array_above_max_length")


def _decode(parse: Parse, body: bytes, max_model_len: int) -> ChatRequest:
    obj = load_json_object(body)
    check_message_count(obj)
    return parse(obj, max_model_len)


async def parse_body(parse: Parse, body: bytes, max_model_len: int) -> ChatRequest:
    """The request parsed by ``parse`` (an API's parser); off the loop for a large body."""
    if len(body) > OFFLOAD_BODY_BYTES:
        return await asyncio.to_thread(_decode, parse, body, max_model_len)
    return _decode(parse, body, max_model_len)


def prompt_cost(req: ChatRequest) -> int:
    """Characters of text plus a fixed cost per message (empty messages are not free)."""
    n = len(req.system or "") + MESSAGE_COST_CHARS * len(req.messages)
    for m in req.messages:
        n += len(m["content"])
    return n


def is_heavy(req: ChatRequest) -> bool:
    return prompt_cost(req) > OFFLOAD_COST_CHARS
