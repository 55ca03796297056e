"""The step thread's deferred hand-back (engine/handback.py): a step's outputs reach the loop
when the next step's inputs are prepared, and never wait longer than that step."""

from __future__ import annotations

import asyncio

from zgtool.engine import Engine, EngineConfig, SamplingParams

GREEDY = dict(temperature=0, ignore_eos=True)


async def _collect(stream, deadline_s: float = 60.0):
    async def run():
        return [o async for o in stream]
    return await asyncio.wait_for(run(), deadline_s)


def test_outputs_are_handed_back_while_the_next_step_runs_and_every_stream_finishes():
    async def main() -> None:
        e = Engine(EngineConfig(model="dummy:tiny"))
        e.start()
        handed_back_in_prepare = 0
        inner = e.runner.prepared

        def counting() -> None:
            nonlocal handed_back_in_prepare
            handed_back_in_prepare += e._driver.defer
            inner()

        e.runner.prepared = counting
        try:
            short = e.add_request([256, 1, 2, 3], SamplingParams(max_tokens=12, **GREEDY))
            long = e.add_request([256, 9, 9], SamplingParams(max_tokens=40, **GREEDY))
            got_short = await _collect(short)
            # the short one finished while the long one kept running: its last delta came
            # from a deferred hand-back, delivered by the long one's next step
            assert sum(len(o.token_ids) for o in got_short) == 12 and got_short[-1].finish_reason == "length"
            got_long = await _collect(long)
            assert sum(len(o.token_ids) for o in got_long) == 40 and got_long[-1].finish_reason == "length"
            assert handed_back_in_prepare > 0
            alone = Engine(EngineConfig(model="dummy:tiny"))
            assert [t for o in got_long for t in o.token_ids] == alone.generate(
                [256, 9, 9], SamplingParams(max_tokens=40, **GREEDY)).output_token_ids
            # the last request's final step is followed by no step: handed back at once
            one = await _collect(e.add_request([256, 5], SamplingParams(max_tokens=3, **GREEDY)))
            assert one[-1].finished and e.stats()["kv_blocks_used"] == 0
        finally:
            await e.shutdown(1.0)

    asyncio.run(main())


def test_a_step_that_fails_before_computing_still_hands_back_the_deferred_outputs():
    async def main() -> None:
        e = Engine(EngineConfig(model="dummy:tiny"))
        schedule = e.scheduler.schedule
        calls = 0

        def failing_third_schedule():
            nonlocal calls
            calls += 1
            if calls == 3:
                raise RuntimeError("injected")
            return schedule()

        e.scheduler.schedule = failing_third_schedule
        e.start()
        try:
            outs = await _collect(e.add_request([256, 7, 7], SamplingParams(max_tokens=30, **GREEDY)))
            # two computed steps (prompt, one decode) delivered in order, then the failure
            assert [len(o.token_ids) for o in outs[:2]] == [1, 1]
            # the client gets a generic message naming its request; the log has the traceback
            assert outs[-1].finish_reason == "abort" and "internal engine error" in (outs[-1].error or "")
            assert outs[-1].request_id in (outs[-1].error or "") and "injected" not in (outs[-1].error or "")
            assert e.stats()["kv_blocks_used"] == 0
        finally:
            await e.shutdown(1.0)

    asyncio.run(main())


def test_one_and_several_streams_get_every_token_through_the_hand_back():
    async def main() -> None:
        e = Engine(EngineConfig(model="dummy:tiny"))
        e.start()
        try:
            a = e.add_request([256, 1, 2], SamplingParams(max_tokens=10, **GREEDY))
            b = e.add_request([256, 3], SamplingParams(max_tokens=20, **GREEDY))
            got_a, got_b = await _collect(a), await _collect(b)
            assert sum(len(o.token_ids) for o in got_a) == 10 and sum(len(o.token_ids) for o in got_b) == 20
            assert not e._driver.defer and not e._driver.await_delivery
            one = await _collect(e.add_request([256, 4], SamplingParams(max_tokens=15, **GREEDY)))
            assert sum(len(o.token_ids) for o in one) == 15 and one[-1].finish_reason == "length"
        finally:
            await e.shutdown(1.0)

    asyncio.run(main())
