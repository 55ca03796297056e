"""Seats shared between client keys (issue 22 §5): one key filling the batch never keeps another
key waiting for one of its streams to end. State-based: counted in scheduler steps."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from test_scheduler import run_step

from zgtool.engine.block_manager import BlockManager
from zgtool.engine.config import SamplingParams
from zgtool.engine.scheduler import Scheduler
from zgtool.engine.sequence import Sequence, Status

# a second key's sequence runs within this many steps of arriving, whatever the first key holds
FAIR_ADMISSION_STEPS = 1


def keyed(rid: str, tenant: str | None, weight: float = 1.0, n: int = 4, max_tokens: int = 1000) -> Sequence:
    return Sequence(rid, [7] * n, SamplingParams(max_tokens=max_tokens), tenant=tenant, tenant_weight=weight)


def test_a_second_key_runs_at_once_while_the_first_fills_every_seat():
    sched = Scheduler(BlockManager(4096, 4), max_num_seqs=8, max_num_batched_tokens=512)
    hog = [keyed(f"pro{i}", "pro") for i in range(40)]
    for s in hog:
        sched.add(s)
    for _ in range(5):
        run_step(sched, sched.schedule())
    assert len(sched.running) == 8 and all(s.tenant == "pro" for s in sched.running)
    free = keyed("free0", "free")
    sched.add(free)
    for _ in range(FAIR_ADMISSION_STEPS):
        batch = sched.schedule()
        run_step(sched, batch)
    assert free.status is Status.RUNNING and free.num_output_tokens == 1
    assert len(sched.running) == 8, "the seat came from the saturating key, the cap still holds"
    # and it keeps it: the saturating key never takes it back while the other key has work
    for _ in range(20):
        run_step(sched, sched.schedule())
        assert free in sched.running


def test_seats_follow_the_tier_weights_when_both_keys_saturate():
    sched = Scheduler(BlockManager(4096, 4), max_num_seqs=8, max_num_batched_tokens=512)
    for i in range(20):
        sched.add(keyed(f"a{i}", "pro", weight=3.0))
        sched.add(keyed(f"b{i}", "free", weight=1.0))
    for _ in range(10):
        run_step(sched, sched.schedule())
        assert sched.num_preemptions <= 2, "seats do not ping-pong between keys"
    assert Counter(s.tenant for s in sched.running) == {"pro": 6, "free": 2}


def test_one_key_alone_keeps_every_seat_and_first_come_first_served():
    sched = Scheduler(BlockManager(4096, 4), max_num_seqs=4, max_num_batched_tokens=512)
    seqs = [keyed(f"r{i}", "only") for i in range(6)]
    for s in seqs:
        sched.add(s)
    batch = sched.schedule()
    assert batch.seqs == seqs[:4] and list(sched.waiting) == seqs[4:]
    assert sched.num_preemptions == 0


@settings(max_examples=60, deadline=None)
@given(arrivals=st.lists(st.tuples(st.sampled_from(["a", "b", "c", None]), st.integers(0, 12),
                                   st.integers(1, 12)), min_size=2, max_size=30),
       max_seqs=st.integers(2, 6))
def test_every_key_with_work_holds_a_seat_within_a_step_of_its_arrival(arrivals, max_seqs):
    sched = Scheduler(BlockManager(10_000, 4), max_num_seqs=max_seqs, max_num_batched_tokens=4096)
    by_step: dict[int, list[Sequence]] = {}
    for i, (key, step, mt) in enumerate(arrivals):
        by_step.setdefault(step, []).append(keyed(f"r{i}", key, max_tokens=mt))
    for step in range(60):
        for s in by_step.get(step, []):
            sched.add(s)
        batch = sched.schedule()
        keys_with_work = {s.tenant for s in list(sched.waiting) + sched.running}
        keys_running = {s.tenant for s in sched.running}
        if len(keys_with_work) <= max_seqs:
            assert keys_with_work == keys_running, f"step {step}: a key with work holds no seat"
        assert len(sched.running) <= max_seqs
        assert sched.num_live_keys == len(keys_with_work)
        run_step(sched, batch)


def test_the_engine_passes_the_key_through_add_request():
    from zgtool.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", max_num_seqs=4))
    long = SamplingParams(max_tokens=200, temperature=0, ignore_eos=True)
    for i in range(8):
        engine.add_request([256, 5 + i, 6], long, request_id=f"pro{i}", tenant="pro", tenant_weight=4.0)
    for _ in range(3):
        engine.step()
    assert {s.tenant for s in engine.scheduler.running} == {"pro"} and len(engine.scheduler.running) == 4
    engine.add_request([256, 9, 9], long, request_id="free0", tenant="free")
    firsts = [o for o in engine.step() if o.request_id == "free0" and o.token_ids]
    assert firsts, "the second key's first token comes in the step after it arrives"
