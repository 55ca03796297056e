"""Finish reasons: the engine's (stop, length, content_filter, abort) in each API's words."""

from __future__ import annotations

# Anthropic stop_reason -> OpenAI finish_reason
_ANTHROPIC_TO_OPENAI = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
                        "refusal": "content_filter", "pause_turn": "stop", "tool_use": "tool_calls"}


def anthropic_stop_reason(reason: str | None, stop_sequence: str | None = None) -> str | None:
    """Engine finish reason -> Anthropic stop_reason."""
    if reason == "length":
        return "max_tokens"
    if reason == "stop":
        return "stop_sequence" if stop_sequence is not None else "end_turn"
    if reason == "content_filter":
        return "refusal"
    return None


def openai_finish_reason(reason: str | None) -> str | None:
    """Engine finish reason -> OpenAI finish_reason."""
    if reason in ("stop", "length", "content_filter"):
        return reason
    return "stop" if reason else None


def openai_from_anthropic(stop_reason: str | None) -> str:
    """Anthropic stop_reason -> OpenAI finish_reason (a translating gateway's mapping)."""
    return _ANTHROPIC_TO_OPENAI.get(stop_reason or "", "stop")
