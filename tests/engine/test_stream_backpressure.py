"""Backpressure: a stream whose reader falls far behind has its sequence held out of the batch
(engine/stream.py, Scheduler.hold) instead of computing tokens that only queue in memory."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest

from zgtool.engine import Engine, EngineConfig, SamplingParams
from zgtool.engine.block_manager import BlockManager
from zgtool.engine.scheduler import Scheduler
from zgtool.engine.sequence import Sequence
from zgtool.engine.stream import HOLD_AT_OUTPUTS, RESUME_AT_OUTPUTS

PARAMS = SamplingParams(max_tokens=2000, temperature=0, ignore_eos=True)


def _seq(rid: str, n: int = 4) -> Sequence:
    return Sequence(rid, list(range(1, n + 1)), SamplingParams(max_tokens=50))


def _decode(sched: Scheduler, batch) -> None:
    for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
        s.num_computed_tokens += n
        if s.num_computed_tokens == s.num_tokens:
            s.token_ids.append(7)


def test_a_held_sequence_is_left_out_of_the_batch_and_is_not_work():
    sched = Scheduler(BlockManager(64, 4), max_num_seqs=4, max_num_batched_tokens=64)
    a, b = _seq("a"), _seq("b")
    sched.add(a)
    sched.add(b)
    _decode(sched, sched.schedule())        # both prefilled
    sched.hold(a, True)
    batch = sched.schedule()
    assert batch.seqs == [b] and sched.num_held == 1 and sched.has_work
    sched.hold(b, True)
    assert sched.schedule().is_empty and not sched.has_work      # nothing to compute: not work
    assert a.block_table and b.block_table                        # a held sequence keeps its blocks
    sched.hold(a, False)
    assert sched.schedule().seqs == [a] and sched.num_held == 1
    sched.hold(a, False)                    # idempotent
    assert sched.num_held == 1


def test_finishing_or_preempting_a_held_sequence_keeps_the_held_count_right():
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    a, b = _seq("a"), _seq("b")
    sched.add(a)
    sched.add(b)
    _decode(sched, sched.schedule())
    sched.hold(a, True)
    sched.hold(b, True)
    sched.finish(a, "abort")
    assert sched.num_held == 1 and not a.held and not a.block_table
    sched._preempt(b, sched.schedule())     # preempted while held: parked, not waiting for a seat
    assert sched.num_held == 0 and b.held and sched.parked == [b] and not sched.waiting and not sched.has_work
    assert sched.schedule().is_empty         # a parked sequence is not admitted while held
    sched.hold(b, False)                     # let go: first in line, it recomputes what it had
    assert sched.parked == [] and list(sched.waiting) == [b]
    batch = sched.schedule()
    assert batch.seqs == [b] and batch.num_new_tokens == [b.num_tokens] and sched.num_held == 0
    sched.hold(a, True)                      # a finished sequence is never held again
    assert sched.num_held == 0 and not a.held


def test_a_held_sequence_gives_its_seat_to_a_waiting_one_and_runs_again_when_let_go():
    sched = Scheduler(BlockManager(64, 4), max_num_seqs=1, max_num_batched_tokens=64)
    stalled, other = _seq("stalled"), _seq("other")
    sched.add(stalled)
    _decode(sched, sched.schedule())
    sched.hold(stalled, True)
    sched.add(other)                         # the only seat is held: it goes to the waiting sequence
    batch = sched.schedule()
    assert batch.seqs == [other] and batch.preempted == [stalled] and sched.parked == [stalled]
    assert not stalled.block_table and stalled.held
    sched.hold(stalled, False)
    assert sched.schedule().seqs == [other]  # seated sequences are not preempted for it: it waits its turn
    sched.finish(other, "length")
    assert sched.schedule().seqs == [stalled] and not sched.parked


def test_a_held_sequence_gives_its_blocks_to_a_sequence_that_needs_them():
    bm = BlockManager(4, 4)                  # 16 tokens of KV in all
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    stalled = _seq("stalled", n=11)          # 3 blocks
    sched.add(stalled)
    _decode(sched, sched.schedule())
    sched.hold(stalled, True)
    big = _seq("big", n=8)                   # needs 2 blocks; 1 is free
    sched.add(big)
    batch = sched.schedule()
    assert batch.seqs == [big] and sched.parked == [stalled] and not stalled.block_table


async def _until(cond: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "state not reached"
        await asyncio.sleep(0.001)


def _idle(e: Engine) -> bool:
    driver = e._driver
    return not e._has_work() and not getattr(driver, "tick_scheduled", False)


async def _stalled_then_read(e: Engine) -> None:
    ref = e.add_request([256, 5, 6, 7], PARAMS)          # read as it comes: never held
    want = [t async for o in ref for t in o.token_ids]
    s = e.add_request([256, 5, 6, 7], PARAMS)            # its reader has stalled
    seq = e.sequence(s.request_id)
    assert seq is not None
    await _until(lambda: seq.held and _idle(e))
    made = len(seq.output_token_ids)
    assert HOLD_AT_OUTPUTS <= made < PARAMS.max_tokens     # it stopped well before max_tokens
    assert e.stats()["held"] == 1 and e.stats()["running"] == 1 and e.stalled_s() == 0.0
    for _ in range(50):                                   # the engine stays idle: nothing is computed
        await asyncio.sleep(0)
    assert len(seq.output_token_ids) == made and _idle(e)
    got: list[int] = []
    resumed = False
    async for o in s:                                     # the reader catches up: it runs again
        got += o.token_ids
        resumed = resumed or not s.held
    assert resumed and got == want and len(got) == PARAMS.max_tokens
    await _until(lambda: e.stats()["kv_blocks_used"] == 0)
    assert e.stats()["held"] == 0 and e.stats()["running"] == 0


@pytest.mark.parametrize("driver", ["loop", "thread"])
def test_a_stalled_reader_holds_its_sequence_until_it_reads_and_loses_no_token(monkeypatch, driver):
    monkeypatch.setenv("ZGTOOL_STEP_DRIVER", "auto" if driver == "loop" else "thread")

    async def main() -> None:
        e = Engine(EngineConfig(model="null", max_model_len=4096))
        e.start()
        try:
            assert e.step_driver == driver
            await _stalled_then_read(e)
        finally:
            await e.shutdown(1.0)

    asyncio.run(main())


def test_a_model_on_the_step_thread_holds_a_stalled_stream_too():
    async def main() -> None:
        e = Engine(EngineConfig(model="dummy:tiny"))
        e.start()
        try:
            s = e.add_request([256, 1, 2], SamplingParams(max_tokens=1000, temperature=0, ignore_eos=True))
            seq = e.sequence(s.request_id)
            assert seq is not None
            await _until(lambda: seq.held and not e._has_work())
            assert HOLD_AT_OUTPUTS <= len(seq.output_token_ids) < 1000
            n = 0
            async for o in s:
                n += len(o.token_ids)
            assert n == 1000 and s.finish_reason == "length"
        finally:
            await e.shutdown(1.0)

    asyncio.run(main())


def test_an_aborted_held_stream_frees_its_blocks_and_a_whole_answer_reader_is_never_held():
    async def main() -> None:
        e = Engine(EngineConfig(model="null", max_model_len=4096))
        e.start()
        try:
            s = e.add_request([256, 5, 6, 7], PARAMS)
            seq = e.sequence(s.request_id)
            assert seq is not None
            await _until(lambda: seq.held and _idle(e))
            e.abort(s.request_id)
            await _until(lambda: e.stats()["kv_blocks_used"] == 0 and e.stats()["running"] == 0)
            assert e.stats()["held"] == 0
            late = e.add_request([256, 5, 6, 7], PARAMS)
            late.wake_on_finish = True      # a reader that wants the end, on a sequence that hands out deltas
            lseq = e.sequence(late.request_id)
            outs = [o async for o in late]
            assert sum(len(o.token_ids) for o in outs) == PARAMS.max_tokens and lseq is not None and not lseq.held
            assert len(outs) > HOLD_AT_OUTPUTS > RESUME_AT_OUTPUTS    # it queued past the mark, unheld
            whole = e.add_request([256, 5, 6, 7], PARAMS, whole_answer=True)     # a JSON answer
            wseq = e.sequence(whole.request_id)
            assert whole.wake_on_finish and wseq is not None
            outs = [o async for o in whole]
            assert len(outs) == 1 and outs[0].finished and not wseq.held     # nothing queued to hold
            assert outs[0].token_ids == wseq.output_token_ids and len(outs[0].token_ids) == PARAMS.max_tokens
            assert outs[0].text == wseq.output_text
        finally:
            await e.shutdown(1.0)

    asyncio.run(main())


def test_a_held_victim_ahead_in_the_batch_leaves_no_running_sequence_unscheduled():
    sched = Scheduler(BlockManager(3, 4), max_num_seqs=4, max_num_batched_tokens=64)
    a, b, c = _seq("a", n=3), _seq("b", n=4), _seq("c", n=3)   # one block each: the pool is full
    for s in (a, b, c):
        sched.add(s)
    _decode(sched, sched.schedule())
    sched.hold(a, True)
    batch = sched.schedule()    # b's decode needs a block: held a (ahead of b) gives its own
    assert batch.seqs == [b, c] and batch.preempted == [a] and sched.parked == [a]


def test_with_one_seat_a_stalled_stream_lets_another_request_run_and_then_finishes_unchanged():
    async def main() -> None:
        e = Engine(EngineConfig(model="null", max_model_len=4096, max_num_seqs=1))
        e.start()
        try:
            ref = e.add_request([256, 5, 6, 7], PARAMS)
            want = [t async for o in ref for t in o.token_ids]
            stalled = e.add_request([256, 5, 6, 7], PARAMS)
            seq = e.sequence(stalled.request_id)
            assert seq is not None
            await _until(lambda: seq.held and _idle(e))
            other = e.add_request([256, 9], SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
            got_other = [o async for o in other]       # it gets the held seat: it does not wait for the stall
            assert got_other[-1].finish_reason == "length" and seq in e.scheduler.parked
            assert e.stats()["held"] == 1 and not seq.block_table
            got = [t async for o in stalled for t in o.token_ids]     # read: recomputed, then finished
            assert got == want and seq.num_preemptions >= 1
            await _until(lambda: e.stats()["kv_blocks_used"] == 0)
            assert e.stats()["held"] == 0 and not e.scheduler.parked
        finally:
            await e.shutdown(1.0)

    asyncio.run(main())
