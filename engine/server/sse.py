"""Token grouping for streams (--stream-interval) and keepalives (--stream-keepalive-s). SSE framing
lives in zgtool.http.sse; the per-token event bytes are templates in the API modules
(zgtool.engine.api.anthropic / openai).
"""

from __future__ import annotations

import asyncio
from typing import Any


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
        if text and not self.parts and (not self.sent_first or self.tokens + num_tokens >= self.interval):
            self.tokens = 0          # flush() of this one part, without the list (every token at interval 1)
            self.sent_first = True
            return text
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


# -- keepalives: no stream the server holds goes silent -----------------------------------------
# While a stream waits for a seat, is preempted or prefills a long prompt it sends nothing; most
# proxies and clients drop an idle stream after 5-60 s. A stream silent for the keepalive interval
# gets one keepalive (Anthropic's `event: ping`, an SSE comment on the OpenAI route), written by its
# own handler (a sentinel pushed into its output stream), so every send stays in the handler's order.

KEEPALIVE_TICK_S = 0.5     # how often silence is checked: the longest silence is interval + this


class SilenceWatch:
    """What the keepalive ticker knows of one stream: whether it sent anything since the last tick."""

    __slots__ = ("stream", "flight", "sent", "quiet_since")

    def __init__(self, stream: Any, flight: Any, now: float) -> None:
        self.stream = stream
        self.flight = flight       # handlers.Flight: the watch ends when the request is done
        self.sent = False
        self.quiet_since = now


class KeepaliveTicker:
    """One loop timer for all streams of a server, running only while some stream is open: each
    tick, a stream that sent nothing for ``interval_s`` gets ``sentinel`` pushed into its output."""

    def __init__(self, interval_s: float, sentinel: object) -> None:
        self.interval_s = interval_s
        self.tick_s = min(KEEPALIVE_TICK_S, interval_s / 2)
        self.sentinel = sentinel
        self.watches: set[SilenceWatch] = set()
        self._timer: Any = None
        self._loop: Any = None

    def open(self, stream: Any, flight: Any) -> SilenceWatch:
        loop = self._loop = asyncio.get_running_loop()
        w = SilenceWatch(stream, flight, loop.time())
        self.watches.add(w)
        if self._timer is None:
            self._timer = loop.call_later(self.tick_s, self._tick)
        return w

    def close(self, watch: SilenceWatch) -> None:
        """The stream ended: drop its watch now (held until the next tick, a finished stream's
        request objects outlived it by up to a tick, hundreds of them at a high request rate)."""
        self.watches.discard(watch)

    def _tick(self) -> None:
        now = self._loop.time()
        for w in list(self.watches):
            if w.flight.done:
                self.watches.discard(w)
            elif w.sent:
                w.sent = False
                w.quiet_since = now
            elif now - w.quiet_since >= self.interval_s - 1e-3:
                w.quiet_since = now
                w.stream.push(self.sentinel)
        self._timer = self._loop.call_later(self.tick_s, self._tick) if self.watches else None
