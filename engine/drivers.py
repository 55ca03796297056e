"""What calls Engine.step once the engine is start()ed: the step driver, chosen once by the backend.

``StepThread`` (every engine that computes): one dedicated step thread; its outputs go back to the
asyncio loop once per step. Handoff design (the hot path of the fused claim): add_request appends
to a deque the step thread drains between steps (no wake-up unless the thread is idle); each
step's outputs for every request travel in ONE loop.call_soon_threadsafe call, and while such a
hand-back is still pending the next steps only append to the outbox: a loop that falls behind
drains many steps' tokens per wake-up. While another step follows at once, a step's outputs wait
for that step's inputs to be prepared (engine/handback.py): the loop thread then wakes as the C
call releases the GIL instead of preempting the step thread's Python. This is the one hand-back
mode (the measured best of three, README). (A shorter GIL switch interval and an idle spin-poll
were measured with bench/serving_overhead.py and rejected: the first cost 18% requests/s at c=32,
the second bought nothing at c=1.)

``LoopStepper`` (the null backend): it has no compute to overlap with I/O, so a step thread only
adds two thread wake-ups and GIL hand-overs per request (on 2 busy cores, the largest part of its
serving overhead). Its engine steps on the loop: the same Engine.step, scheduler and KV
bookkeeping, run from a loop callback that reschedules itself while there is work, so I/O still
interleaves between steps. A request that finds that engine idle while no other request is in the
server (add_request's ``step_now``) takes its first step at once, in its handler: no loop
iteration and no wake-up between admission and its first token. ``ZGTOOL_STEP_DRIVER=thread``
runs the null engine on a step thread instead (the A/B of bench/serving_overhead.py and
tests/engine/server/test_server_step_driver.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from zgtool.engine.outputs import RequestOutput


class Engine(Protocol):
    """What a driver uses of zgtool.engine.engine.Engine, which starts the driver: a Protocol, so this
    module does not import the engine back (no import circle, tests/structure/test_import_cycles.py)."""

    @property
    def model(self) -> Any: ...
    @property
    def runner(self) -> Any: ...
    @property
    def config(self) -> Any: ...
    @property
    def scheduler(self) -> Any: ...
    @property
    def faults(self) -> Any: ...
    @property
    def _streams(self) -> Any: ...
    @property
    def _seqs(self) -> Any: ...
    @property
    def _inbox(self) -> Any: ...
    @property
    def _admin(self) -> Any: ...
    @property
    def _stuck(self) -> bool: ...
    @property
    def _batch_window_s(self) -> float: ...

    def step(self) -> list[RequestOutput]: ...

    def _has_work(self) -> bool: ...

    def _drain(self) -> None: ...

STUCK_BACKOFF_S = 0.01   # a step that could schedule nothing is retried after this (or an arrival)
TICK_BUDGET_S = 0.0005   # loop driver: longest run of steps before the loop polls I/O again
DELIVERY_WAIT_S = 0.002  # thread driver, one running sequence: longest wait for the loop's write


def choose_driver(engine: Engine, loop: asyncio.AbstractEventLoop) -> StepThread | LoopStepper:
    """The null backend steps on the loop (call on the loop's thread), every other on a step thread."""
    if engine.model is None and os.environ.get("ZGTOOL_STEP_DRIVER", "auto") != "thread":
        return LoopStepper(engine, loop)
    return StepThread(engine, loop)


def deliver(engine: Engine, outputs: Any) -> None:
    """On the loop thread: push each output to its request's stream, forget finished requests."""
    streams, seqs = engine._streams, engine._seqs
    for out in outputs:
        stream = streams.get(out.request_id)
        if stream is not None:
            stream.push(out)
        if out.finished:
            streams.pop(out.request_id, None)
            seqs.pop(out.request_id, None)


def step_or_fail(engine: Engine) -> list[RequestOutput]:
    """One Engine.step; an exception it lets out fails the in-flight requests, serving goes on."""
    try:
        return engine.step()
    except Exception as exc:  # noqa: BLE001 - fail the in-flight requests, keep serving
        return engine.faults.fail_everyone(exc)


def _popping(box: deque[RequestOutput]) -> Any:
    while box:  # what the step thread appends meanwhile is delivered too
        yield box.popleft()


class StepThread:
    name = "thread"

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine, self.loop = engine, loop
        self.stop = False
        self._wake = threading.Event()
        self.outbox: deque[RequestOutput] = deque()
        self.handback_pending = False
        self.delivered = threading.Event()   # set on the loop once a serial hand-back is written
        self.await_delivery = False
        self.defer = False                   # the outbox waits for the next step's prepared()
        if hasattr(engine.runner, "prepared"):
            # engine/handback.py: a step's outputs go back once the next step's inputs are ready
            engine.runner.prepared = self.prepared
        self.thread = threading.Thread(target=self.run, name="zgtool-step", daemon=True)
        self.thread.start()

    def arrived(self, step_now: bool) -> None:
        self._wake.set()

    def is_stepper(self) -> bool:
        return threading.current_thread() is self.thread

    def run(self) -> None:
        eng = self.engine
        window_s = eng.config.batch_window_ms / 1e3
        while not self.stop:
            if not eng._has_work():
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            if window_s and not eng.scheduler.running and eng._inbox:
                # a burst is starting on an idle engine: let it fill the first step
                deadline = time.perf_counter() + window_s
                while (left := deadline - time.perf_counter()) > 0 and len(eng._inbox) < eng.config.max_num_seqs:
                    time.sleep(min(left, 0.0005))
            if eng._stuck:     # nothing could run last step: wait for an arrival or abort, not spin
                self._wake.wait(STUCK_BACKOFF_S)
                self._wake.clear()
            outputs = step_or_fail(eng)
            if outputs:
                self.outbox.extend(outputs)
            if self.defer or not self.outbox:
                self.hand_back()   # a deferred hand-back whose next step did not compute: now
            elif eng.scheduler.running and getattr(eng.runner, "prepared", None) is not None:
                self.defer = True  # the next step's runner.prepared() hands these back
            else:
                self.hand_back()
        self.hand_back()

    def hand_back(self) -> None:
        """Step thread: one loop.call_soon_threadsafe(dispatch) for whatever the outbox holds."""
        self.defer = False
        if self.outbox and not self.handback_pending:
            self.handback_pending = True
            self.loop.call_soon_threadsafe(self.dispatch)

    def prepared(self) -> None:
        """HandbackRunner's hook: the next step's inputs are ready, its C call comes next.

        One running sequence: wait (at most DELIVERY_WAIT_S) until the loop has handed the
        outputs to the handler and it has written them, then compute. The loop thread then
        runs while the kernel pool is idle instead of preempting one of its threads mid-step
        (2 cores: its ~0.3 ms of CPU per token stalled the step). With more sequences the
        loop's work per step grows with them and overlaps the C call as before."""
        if not self.defer:
            return
        if len(self.engine.scheduler.running) != 1:
            self.hand_back()
            return
        self.delivered.clear()
        self.await_delivery = True
        self.hand_back()
        self.delivered.wait(DELIVERY_WAIT_S)
        self.await_delivery = False

    def dispatch(self) -> None:
        """On the loop thread: drain everything the step thread produced since the last call."""
        self.handback_pending = False  # before draining: a later append schedules a new call
        box = self.outbox
        deliver(self.engine, _popping(box))
        if self.await_delivery:
            # queued after the handlers' wake-ups: runs once they have written (FIFO callbacks)
            self.loop.call_soon(self.delivered.set)

    def between_steps(self, fn: Callable[[], Any], timeout_s: float) -> Any:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.engine._admin.append((fn, fut))
        self._wake.set()
        return fut.result(timeout_s)

    async def close(self) -> None:
        self.stop = True
        self._wake.set()
        await asyncio.to_thread(self.thread.join, 5.0)


class LoopStepper:
    name = "loop"

    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine, self.loop = engine, loop
        self.stop = False
        self.tick_scheduled = False
        self.loop_tid = threading.get_ident()   # start() runs on the loop's thread (the app's lifespan)

    def is_stepper(self) -> bool:
        return threading.get_ident() == self.loop_tid  # between two loop callbacks is between two steps

    def arrived(self, step_now: bool) -> None:
        eng = self.engine
        if (step_now and not self.tick_scheduled and len(eng._inbox) == 1 and not eng.scheduler.has_work
                and not eng._batch_window_s and not self.stop and threading.get_ident() == self.loop_tid):
            self.step_now()
        else:
            self.kick()

    def kick(self) -> None:
        """Schedule one step on the loop (once, however many requests arrive before it runs)."""
        if self.tick_scheduled or self.stop:
            return
        self.tick_scheduled = True
        eng = self.engine
        if threading.get_ident() != self.loop_tid:
            self.loop.call_soon_threadsafe(self.tick)
        elif eng._batch_window_s and not eng.scheduler.running and eng._inbox:
            self.loop.call_later(eng._batch_window_s, self.tick)   # let a burst fill the first step
        else:
            self.loop.call_soon(self.tick)

    def step_now(self) -> None:
        """add_request(step_now=True) on an idle engine (nothing running, waiting or scheduled): the
        first step at once, in the caller; the rest go through tick as usual."""
        deliver(self.engine, step_or_fail(self.engine))
        if self.engine._has_work():
            self.kick()

    def tick(self) -> None:
        """Steps back to back for up to TICK_BUDGET_S (a request's tokens reach its handler in
        one wake-up, as the thread driver's outbox does), then yields to the loop's I/O."""
        self.tick_scheduled = False
        eng = self.engine
        deadline = time.perf_counter() + TICK_BUDGET_S
        while not self.stop:
            deliver(eng, step_or_fail(eng))
            if not eng._has_work():
                return
            if eng._stuck:       # nothing could run: look again later, not in a busy loop
                self.tick_scheduled = True
                self.loop.call_later(STUCK_BACKOFF_S, self.tick)
                return
            if time.perf_counter() >= deadline:
                self.kick()      # call_soon: the loop polls I/O before the next step
                return

    def between_steps(self, fn: Callable[[], Any], timeout_s: float) -> Any:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.engine._admin.append((fn, fut))
        self.kick()
        return fut.result(timeout_s)

    async def close(self) -> None:
        self.stop = True
        self.engine._drain()   # admin calls queued after the last step must not wait for a timeout
