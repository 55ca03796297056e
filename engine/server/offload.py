"""Work the event loop hands to other threads, counted, and the GIL shared with it while it runs.

CPython 3.11 gives a thread that waits for the GIL a turn only when the holder has kept it a whole
switch interval (5 ms) with no other thread taking it in between. A busy event loop releases the GIL
at every poll of its I/O and takes it straight back, and each time it does that count starts again:
a thread beside such a loop can wait for seconds. Measured here (Intel Xeon @ 2.80GHz): 3,000,000
iterations of Python (0.13 s alone) took 18-50 s in a thread beside a loop whose callbacks ran back to
back (uvloop and asyncio), and 2.75 s beside a stream stepped flat out by the null engine's loop driver;
through sockets, bench/gil_handover.py.

So every hand-off of work that computes goes through ``Offloads`` (``in_thread`` for a heavy prompt's
template and safety check and /tokenize's large bodies; ``waiting`` around intake.parse_body, a large
body's decode and parse on its own executor), and while any is in flight a loop timer, once per switch
interval, sleeps ``HANDOVER_S``: the GIL is released long enough for the OS to wake the waiting thread,
which then runs until the loop asks for it back one interval later. The loop and the thread share the
CPU (the same work: 0.23-0.25 s beside the busy loop, 0.35-0.44 s beside the stream), and the loop, when it
is not busy, loses 0.2 ms per 5 ms only while offloaded work runs.

Not counted: the admin routes' executor calls, which wait for the loop (Engine.run_in_step_thread)
rather than compute. A request cancelled while its work runs stops counting it at once; the thread
finishes that work as fast as the GIL then lets it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")
HANDOVER_S = 0.0002     # the loop thread's sleep that lets a thread waiting for the GIL take it


class Offloads:
    """The server's work in other threads, in flight; the GIL handed over while there is any."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.handovers = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    async def in_thread(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``asyncio.to_thread(fn, *args, **kwargs)`` (the default executor, this context), counted."""
        ctx = contextvars.copy_context()
        return await self.waiting(asyncio.get_running_loop().run_in_executor(
            None, functools.partial(ctx.run, fn, *args, **kwargs)))

    async def waiting(self, work: Awaitable[T]) -> T:
        """Await ``work``, which runs in another thread, counted as in flight meanwhile."""
        self.in_flight += 1
        loop = asyncio.get_running_loop()
        if self._timer is None or self._timer_loop is not loop:    # none, or one left on a loop since closed
            self._arm(loop)
        try:
            return await work
        finally:
            self.in_flight -= 1

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer_loop = loop
        self._timer = loop.call_later(sys.getswitchinterval(), self._hand_over)

    def _hand_over(self) -> None:
        if not self.in_flight:
            self._timer = None
            return
        time.sleep(HANDOVER_S)
        self.handovers += 1
        self._arm(asyncio.get_running_loop())
