"""Server-sent events: the response headers every stream carries and token grouping.

The event bytes themselves are built by the API modules (zgtool.engine.api.anthropic /
openai), where the per-token event is a byte template.
"""

from __future__ import annotations

SSE_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    # nginx (and similar proxies) buffer responses unless told not to.
    (b"x-accel-buffering", b"no"),
]


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
