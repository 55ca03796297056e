"""Work the server hands to other threads shares the GIL with a busy event loop (engine/server/offload.py):
a thread's pure-Python work finishes while the loop stays busy, beside callbacks that run back to back
and beside a stream the null engine steps flat out; the loop hands the GIL over only while such work is
in flight. Checked on state (what finished first, what was counted), never on a duration."""

from __future__ import annotations

import asyncio
from typing import Any

from zgtool.engine import Engine, EngineConfig
from zgtool.engine.config import SamplingParams
from zgtool.engine.server.offload import Offloads

ITERATIONS = 3_000_000
TOTAL = 8_999_994          # sum(i % 7 for i in range(ITERATIONS))


def python_work() -> int:
    """Pure Python: it needs the GIL throughout (0.13 s alone on the 2-core Xeon)."""
    total = 0
    for i in range(ITERATIONS):
        total += i % 7
    return total


def test_a_thread_finishes_its_work_beside_a_loop_busy_with_callbacks() -> None:
    # Without the hand-over, the same work took 18-50 s beside this loop (35,000-97,000 callbacks ran
    # meanwhile); with it, 0.23-0.25 s and about 200: the loop's 5,000 callbacks run out first only if starved.
    async def go() -> tuple[int, bool, int, int]:
        loop = asyncio.get_running_loop()
        left = [5_000]

        def busy() -> None:                       # 0.5 ms of Python per callback, back to back
            end = loop.time() + 0.0005
            while loop.time() < end:
                pass
            left[0] -= 1
            if left[0] > 0:
                loop.call_soon(busy)

        loop.call_soon(busy)
        offloads = Offloads()
        total = await offloads.in_thread(python_work)
        still_busy = left[0] > 0
        left[0] = 0
        return total, still_busy, offloads.in_flight, offloads.handovers

    total, still_busy, in_flight, handovers = asyncio.run(go())
    assert total == TOTAL
    assert still_busy, "the busy loop ran out before the thread's work: the thread was starved"
    assert in_flight == 0 and handovers > 0


def test_a_thread_finishes_its_work_before_a_stream_the_loop_steps_flat_out() -> None:
    # Without the hand-over: 2.5 s, and the stream of 200,000 tokens had ended first.
    async def go() -> tuple[int, str | None, int]:
        eng = Engine(EngineConfig(model="null", max_model_len=262_144))
        eng.start(asyncio.get_running_loop())
        ids = eng.tokenizer.apply_chat_template(messages=[{"role": "user", "content": "hi"}], system=None)
        stream = eng.add_request(ids, SamplingParams(max_tokens=200_000), request_id="flat-out")
        await stream.__anext__()                  # the stream is being stepped
        offloads = Offloads()
        total = await offloads.in_thread(python_work)
        reason = stream.finish_reason             # None: still running when the work came back
        eng.abort("flat-out")
        async for _ in stream:
            pass
        await eng.shutdown(1.0)
        return total, reason, offloads.in_flight

    total, reason, in_flight = asyncio.run(go())
    assert total == TOTAL
    assert reason is None, "the stream of 200,000 tokens ended before the thread's work: the thread was starved"
    assert in_flight == 0


def test_the_loop_hands_the_gil_over_only_while_work_is_in_flight() -> None:
    async def until(cond: Any) -> bool:
        for _ in range(30_000):                   # state, polled (30 s at most on a loaded box)
            if cond():
                return True
            await asyncio.sleep(0.001)
        return False

    async def go() -> dict[str, Any]:
        offloads = Offloads()
        seen: dict[str, Any] = {"idle_timer": offloads._timer}
        release = asyncio.Event()

        async def held() -> int:                 # in flight until released
            await release.wait()
            return 1

        task = asyncio.ensure_future(offloads.waiting(held()))
        seen["handed_over"] = await until(lambda: offloads.handovers >= 2)   # twice: it re-arms
        seen["in_flight"] = offloads.in_flight
        release.set()
        seen["result"] = await task
        after = offloads.handovers
        seen["timer_stopped"] = await until(lambda: offloads._timer is None)
        seen["in_flight_after"], seen["added_after"] = offloads.in_flight, offloads.handovers - after
        return seen

    seen = asyncio.run(go())
    assert seen["idle_timer"] is None                 # nothing in flight: no timer at all
    assert seen["handed_over"] and seen["in_flight"] == 1 and seen["result"] == 1
    assert seen["timer_stopped"] and seen["in_flight_after"] == 0 and seen["added_after"] == 0


def test_work_that_fails_in_its_thread_raises_in_the_caller_and_is_no_longer_counted() -> None:
    async def go() -> tuple[str, int]:
        offloads = Offloads()

        def boom() -> None:
            raise ValueError("bad prompt")

        try:
            await offloads.in_thread(boom)
        except ValueError as exc:
            return str(exc), offloads.in_flight
        return "", offloads.in_flight

    assert asyncio.run(go()) == ("bad prompt", 0)


def test_offloads_hand_over_on_a_new_loop_after_the_old_one_closed_with_work_in_flight() -> None:
    offloads = Offloads()

    async def abandoned() -> None:            # the loop ends while this work is still counted
        never = asyncio.Event()
        asyncio.ensure_future(offloads.waiting(never.wait()))
        await asyncio.sleep(0)

    asyncio.run(abandoned())

    async def later() -> int:
        before = offloads.handovers
        release = asyncio.Event()
        task = asyncio.ensure_future(offloads.waiting(release.wait()))
        for _ in range(30_000):               # state, polled: a hand-over on this loop
            if offloads.handovers > before:
                break
            await asyncio.sleep(0.001)
        release.set()
        await task
        return offloads.handovers - before

    assert asyncio.run(later()) >= 1
