"""The per-request async stream the HTTP front iterates, fed in batches from the step thread.

Backpressure: a streaming reader that falls ``HOLD_AT_OUTPUTS`` deltas behind (its client stopped
reading, so its handler waits for the socket to drain) has its sequence held out of the engine's
batch until it is back to ``RESUME_AT_OUTPUTS``: a stalled client no longer makes the engine compute
tokens that only queue here, unbounded, until the write timeout drops it (a few hundred deltas at
most now, instead of every token up to max_tokens). A held sequence's seat and KV blocks go to a
waiting request that needs them (engine/scheduler.py parks it; it recomputes once let go). A reader
that wants the whole answer (``wake_on_finish``) is never held: its deltas wait here by design.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from zgtool.engine.outputs import RequestOutput, RequestTimings, Usage
from zgtool.engine.sequence import Sequence

HOLD_AT_OUTPUTS = 256     # undelivered deltas at which a streaming reader's sequence is held
RESUME_AT_OUTPUTS = 64    # ... and at which it runs again


class RequestStream:
    """`async for out in stream` yields RequestOutput deltas until the finished one.

    ``hold(seq, held)`` (the engine's, called on the loop thread) holds the sequence while this
    stream's reader is HOLD_AT_OUTPUTS behind, and lets it go at RESUME_AT_OUTPUTS."""

    def __init__(self, seq: Sequence, loop: asyncio.AbstractEventLoop | None,
                 hold: Callable[[Sequence, bool], None] | None = None) -> None:
        self._seq = seq
        self._loop = loop
        self._queue: deque[RequestOutput] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        self._hold = hold
        self.held = False
        # a reader that wants the whole answer (non-streaming) is woken once, by the finished
        # output, instead of once per step: any earlier deltas wait in the queue (most sequences
        # added with whole_answer=True hand over none before the last: Sequence.whole_answer)
        self.wake_on_finish = False

    @property
    def request_id(self) -> str:
        return self._seq.request_id

    @property
    def prompt_token_ids(self) -> list[int]:
        return self._seq.prompt_token_ids

    @property
    def timings(self) -> RequestTimings:
        return self._seq.timings

    @property
    def usage(self) -> Usage:
        return self._seq.usage

    @property
    def finish_reason(self) -> str | None:
        return self._seq.finish_reason

    @property
    def output_token_ids(self) -> list[int]:
        return self._seq.output_token_ids

    @property
    def ready(self) -> bool:
        """The next ``async for`` step returns at once (a delta is queued)."""
        return bool(self._queue)

    def push(self, out: RequestOutput) -> None:
        """Called on the event loop thread (one call_soon_threadsafe per engine step)."""
        queue = self._queue
        queue.append(out)
        w = self._waiter
        if w is not None and (out.finished or not self.wake_on_finish) and not w.done():
            w.set_result(None)
        if (len(queue) >= HOLD_AT_OUTPUTS and not self.held and not out.finished and not self.wake_on_finish
                and self._hold is not None):
            self.held = True
            self._hold(self._seq, True)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        while not self._queue:
            if self._done:
                raise StopAsyncIteration
            loop = self._loop or asyncio.get_running_loop()
            self._waiter = loop.create_future()
            await self._waiter
            self._waiter = None
        out = self._queue.popleft()
        if out.finished:
            self._done = True
        elif self.held and len(self._queue) <= RESUME_AT_OUTPUTS and self._hold is not None:
            self.held = False
            self._hold(self._seq, False)
        return out
