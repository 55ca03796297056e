"""Read an SSE answer to its end: content deltas stamped with their bytes' arrival, the first token of any
kind and the first content token located in the read that brought them, usage and the engine's timing.

Which events are tokens:
  * content (ttft_ms, itl_ms): OpenAI `choices[].delta.content` non-empty; Anthropic `content_block_delta`
    with a non-empty `text_delta` (a text block's first text in `content_block_start` too);
  * any kind (ttft_any_ms): content, or reasoning (OpenAI `reasoning_content` / `reasoning`, Anthropic
    `thinking_delta`), a tool call (OpenAI `tool_calls` / `function_call`, Anthropic `tool_use` block start
    and non-empty `input_json_delta`) or a refusal.
Not tokens: a role-only first delta, an empty "" content, usage-only and finish chunks, keep-alive
comments, Anthropic `message_start` / `ping` / `content_block_start` of a text or thinking block.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

from zgtool.http.sse import Event, SSEParser
from zgtool.latency.attribution.adapters import Evidence
from zgtool.latency.attribution.servertiming import TIMING_KEYS, parse_timing_event
from zgtool.latency.wire.pktclock import CURRENT
from zgtool.latency.wire.transport import MARKS

CONTENT, ANY = "content", "any"
_OPENAI_OTHER_TOKENS = ("reasoning_content", "reasoning", "tool_calls", "function_call", "refusal")
_BLOCK_END = (b"\n\n", b"\r\n\r\n", b"\r\r")


@dataclass
class Seen:
    """Where a token arrived: the response read that brought it (0-based), whether its event ended that read
    (its time is then the read's own, whatever else the read merged before it) and, when the packet clock
    runs, the decoded body offset of the event's last byte (its own segment's time is then looked up)."""

    read: int
    ns: int
    at_end: bool
    dec_end: int | None = None


class Points:
    """The first token of any kind and the first content token of one answer."""

    def __init__(self) -> None:
        self.any: Seen | None = None
        self.content: Seen | None = None
        self.tokens: list[Seen] = []        # every content event, in order (ITL)

    def note(self, kind: str, read: int, ns: int, at_end: bool, dec_end: int | None = None) -> None:
        seen = Seen(read, ns, at_end, dec_end)
        if self.any is None:
            self.any = seen
        if kind == CONTENT:
            self.tokens.append(seen)
            if self.content is None:
                self.content = seen

    def more_bytes(self, read: int) -> None:
        """More body bytes came in `read`: a token seen in it did not end it."""
        for seen in (self.any, self.content, self.tokens[-1] if self.tokens else None):
            if seen is not None and seen.read == read:
                seen.at_end = False


def read_stream(chunks: Iterable[bytes], api: str, content_ns: list[int], points: Points | None = None,
                ev: Evidence | None = None, *, compressed: bool = False
                ) -> tuple[str | None, dict[str, float], int | None, int | None]:
    """Read SSE to the end, stamping each content delta with the time its bytes arrived: the receive
    loop (transport.py) stamps every read before h11 or this parser see it. Events are cut by the http
    kit's parser, which keeps a CRLF split between two reads one line end."""
    parts: dict[str, float] = {}
    state: dict[str, Any] = {"tokens": None, "input": None, "done": False, "finished": False, "error": None}
    points = points if points is not None else Points()
    parser = SSEParser()
    # with the packet clock, each event's own last byte is located (the parser is fed line by line); a
    # compressed body's decoded offsets are not the wire's, so its events take their read's time
    decoded: int | None = 0 if CURRENT.clock is not None and not compressed else None
    for chunk in chunks:
        read = MARKS.reads - 1
        now = MARKS.last_read_ns or perf_counter_ns()
        if chunk:
            points.more_bytes(read)
        ends = chunk.endswith(_BLOCK_END)
        for events, end, last in _pieces(parser, chunk, decoded is not None):
            for i, event in enumerate(events):
                kind = handle_event(event, api, now, content_ns, parts, state, ev)
                if kind is not None:
                    points.note(kind, read, now, ends and last and i == len(events) - 1,
                                None if decoded is None else decoded + end - 1)
        if decoded is not None:
            decoded += len(chunk)
    if MARKS.reads and MARKS.reads - 1 in {s.read for s in (points.any, points.content) if s is not None}:
        points.more_bytes(MARKS.reads - 1)    # the body's end (chunked terminator) came in that read too
    if state["error"]:
        return state["error"], parts, state["tokens"], state["input"]
    # OpenAI ends with [DONE]; a server that ends the body cleanly after a finish_reason (transformers
    # serve) finished too: an unclean end raises in the read loop instead
    if not (state["done"] or state["finished"]):
        return "stream_incomplete", parts, state["tokens"], state["input"]
    return None, parts, state["tokens"], state["input"]


def _pieces(parser: SSEParser, chunk: bytes, by_line: bool) -> Iterable[tuple[list[Event], int, bool]]:
    """(events, end offset in the chunk of the piece that completed them, whether it is the chunk's last piece):
    the whole chunk at once, or line by line so that each event's last byte is known."""
    if not by_line:
        yield parser.feed(chunk), len(chunk), True
        return
    start, n = 0, len(chunk)
    while start < n:
        cut = min((i for i in (chunk.find(b"\n", start), chunk.find(b"\r", start)) if i >= 0), default=n - 1) + 1
        if chunk[cut - 1:cut] == b"\r" and chunk[cut:cut + 1] == b"\n":
            cut += 1                                  # a CRLF is one line end
        yield parser.feed(chunk[start:cut]), cut, cut >= n
        start = cut


def handle_event(event: Event, api: str, now: int, content_ns: list[int], parts: dict[str, float],
                 state: dict[str, Any], ev: Evidence | None = None) -> str | None:
    """Fold one event into the answer's state; returns CONTENT, ANY (a token, not content) or None."""
    timing = event.timing                 # the engine's timing rides in an SSE comment
    if timing is not None:
        parts.update(parse_timing_event(timing))
    if not event.event:
        return None                       # a block of comments only
    name = event.event.encode()
    data = event.data.encode()
    if api == "anthropic":
        kind = _anthropic_event(name, data, parts, state, ev)
    else:
        kind = _openai_event(name, data, parts, state, ev)
    if kind == CONTENT:
        content_ns.append(now)
    return kind


def _anthropic_event(name: bytes, data: bytes, parts: dict[str, float], state: dict[str, Any],
                     ev: Evidence | None) -> str | None:
    # The event name equals data.type in the Messages API.
    if name == b"content_block_delta":
        delta = _json(data).get("delta") or {}
        kind = delta.get("type")
        if kind in ("text_delta", None) and delta.get("text"):
            return CONTENT
        if (kind == "thinking_delta" and delta.get("thinking")) or (
                kind == "input_json_delta" and delta.get("partial_json")):
            return ANY
        return None
    if name == b"content_block_start":
        block = _json(data).get("content_block") or {}
        if block.get("type") in ("tool_use", "server_tool_use"):
            return ANY                    # the tool's name was generated
        return CONTENT if block.get("type") == "text" and block.get("text") else None
    if name == b"message_delta":
        doc = _json(data)
        if ev is not None:
            ev.note_doc(doc)
        usage = doc.get("usage") or {}
        if isinstance(usage.get("output_tokens"), int):
            state["tokens"] = usage["output_tokens"]
        if isinstance(usage.get("input_tokens"), int):
            state["input"] = anthropic_prompt_tokens(usage)
    elif name == b"message_start" and state["input"] is None:
        usage = (_json(data).get("message") or {}).get("usage") or {}
        if isinstance(usage.get("input_tokens"), int):
            state["input"] = anthropic_prompt_tokens(usage)
    elif name == b"message_stop":
        state["done"] = True
        if ev is not None:
            ev.note_doc(_json(data))
    elif name == b"error":
        err = _json(data).get("error") or {}
        state["error"] = f"stream_error:{err.get('type', 'unknown')}"
    elif b"timing" in name:
        parts.update(parse_timing_event(data.decode(errors="replace")))
    return None


def _openai_event(name: bytes, data: bytes, parts: dict[str, float], state: dict[str, Any],
                  ev: Evidence | None) -> str | None:
    if data == b"[DONE]":
        state["done"] = True
        return None
    doc = _json(data)
    if b"timing" in name:
        parts.update(parse_timing_event(doc))
        return None
    if ev is not None:
        ev.note_doc(doc)
    for key in TIMING_KEYS:
        val = doc.get(key)
        if isinstance(val, dict) and ("prompt_ms" in val or "predicted_ms" in val):
            continue                      # llama.cpp's timings: its adapter reads them, they are not parts
        if isinstance(val, dict | str):
            parts.update(parse_timing_event({key: val}))
    if isinstance(doc.get("error"), dict):
        state["error"] = f"stream_error:{doc['error'].get('type') or doc['error'].get('code') or 'unknown'}"
        return None
    kind = None
    for choice in doc.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("finish_reason"):
            state["finished"] = True
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            continue
        if delta.get("content"):
            kind = CONTENT
        elif kind is None and any(delta.get(k) for k in _OPENAI_OTHER_TOKENS):
            kind = ANY
    usage = doc.get("usage") or {}
    if isinstance(usage.get("completion_tokens"), int):
        state["tokens"] = usage["completion_tokens"]
    if isinstance(usage.get("prompt_tokens"), int):
        state["input"] = usage["prompt_tokens"]
    return kind


def anthropic_prompt_tokens(usage: dict[str, Any]) -> int:
    """The whole prompt's tokens of an Anthropic usage: input_tokens counts only the uncached part, so the
    cache reads and writes are added (OpenAI's prompt_tokens already includes cached tokens)."""
    parts = (usage.get(k) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
    return sum(v for v in parts if isinstance(v, int) and not isinstance(v, bool))


def _json(data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}
