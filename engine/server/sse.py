"""Token grouping for streams (--stream-interval). SSE framing lives in zgtool.http.sse; the
per-token event bytes are templates in the API modules (zgtool.engine.api.anthropic / openai).
"""

from __future__ import annotations


class TokenGrouper:
    """Groups deltas into events of ``interval`` tokens; the first token always goes alone,
    so --stream-interval never delays time to first token."""

    __slots__ = ("interval", "parts", "tokens", "sent_first")

    def __init__(self, interval: int) -> None:
        self.interval = max(1, interval)
        self.parts: list[str] = []
        self.tokens = 0
        self.sent_first = False

    def add(self, text: str, num_tokens: int) -> str | None:
        """Add one delta; the text to emit now, or None to keep accumulating."""
        if text:
            self.parts.append(text)
        self.tokens += num_tokens
        if not self.parts:
            return None
        if self.sent_first and self.tokens < self.interval:
            return None
        return self.flush()

    def flush(self) -> str | None:
        if not self.parts:
            return None
        text = self.parts[0] if len(self.parts) == 1 else "".join(self.parts)
        self.parts.clear()
        self.tokens = 0
        self.sent_first = True
        return text
