"""Work the event loop hands to another thread, counted so that the loop shares the GIL with it.

Every hand-off of work that computes goes through here: ``in_thread`` for a heavy prompt's template
and safety check and /tokenize's large bodies, ``waiting`` around intake.parse_body (a large body's
decode and parse, on its own executor). While one is in flight ``Engine.threads_waiting`` is above
zero, and a driver that steps on the loop (engine/drivers.py, LoopStepper) hands the GIL over once
per switch interval; without it, a thread waiting beside a loop that steps a stream flat out waited
seconds (engine/drivers.py). Not counted: the admin routes' executor calls, which wait for the loop
(Engine.run_in_step_thread) rather than compute. A request cancelled while its work runs stops
counting it at once; the thread finishes that work as fast as the GIL lets it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Counted(Protocol):
    threads_waiting: int


async def in_thread(engine: Counted, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``asyncio.to_thread(fn, *args, **kwargs)`` (the default executor, this context), counted."""
    ctx = contextvars.copy_context()
    return await waiting(engine, asyncio.get_running_loop().run_in_executor(
        None, functools.partial(ctx.run, fn, *args, **kwargs)))


async def waiting(engine: Counted, work: Awaitable[T]) -> T:
    """Await ``work``, which runs in another thread, counted as in flight meanwhile."""
    engine.threads_waiting += 1
    try:
        return await work
    finally:
        engine.threads_waiting -= 1
