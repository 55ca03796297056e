"""The per-request async stream the HTTP front iterates, fed in batches from the step thread."""

from __future__ import annotations

import asyncio
from collections import deque

from zgtool.engine.outputs import RequestOutput, RequestTimings, Usage
from zgtool.engine.sequence import Sequence


class RequestStream:
    """`async for out in stream` yields RequestOutput deltas until the finished one."""

    def __init__(self, seq: Sequence, loop: asyncio.AbstractEventLoop | None) -> None:
        self._seq = seq
        self._loop = loop
        self._queue: deque[RequestOutput] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._done = False
        # a reader that wants the whole answer (non-streaming) is woken once, by the finished
        # output, instead of once per step: its earlier deltas wait in the queue
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

    def push(self, out: RequestOutput) -> None:
        """Called on the event loop thread (one call_soon_threadsafe per engine step)."""
        self._queue.append(out)
        w = self._waiter
        if w is not None and (out.finished or not self.wake_on_finish) and not w.done():
            w.set_result(None)

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
        return out
