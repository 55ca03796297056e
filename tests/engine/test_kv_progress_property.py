"""The KV pool never deadlocks (issue 22): checked after every scheduler step over generated
workloads — arrival orders, prompt and output lengths, pool sizes, shared prefixes, aborts,
client keys with tier weights, and the preemptions they force.

Invariants:
- a waiting sequence holds no blocks (it cannot run with them, and others could);
- every block's reference count equals the sequences holding it (nothing leaks);
- whenever work is pending and some pending request fits the pool alone, the step schedules
  something: the engine always makes progress;
- every request that fits the pool alone finishes, within a bound of steps.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from test_scheduler import run_step

from zgtool.engine.block_manager import BlockManager
from zgtool.engine.config import SamplingParams
from zgtool.engine.scheduler import Scheduler
from zgtool.engine.sequence import Sequence

BLOCK = 4


def _blocks(tokens: int) -> int:
    return -(-tokens // BLOCK)


def _check(sched: Scheduler, live: list[Sequence]) -> None:
    bm = sched.bm
    for s in sched.waiting:
        assert not s.block_table, f"waiting {s.request_id} holds blocks {s.block_table}"
    held = Counter(b for s in live if not s.is_finished for b in s.block_table)
    for b in range(bm.num_blocks):
        assert bm.ref_cnt[b] == held.get(b, 0), f"block {b}: ref {bm.ref_cnt[b]} but held by {held.get(b, 0)}"


requests = st.lists(
    st.tuples(st.integers(1, 40),        # prompt length
              st.integers(1, 30),        # max_tokens
              st.integers(0, 3),         # shared-prefix group (same leading tokens)
              st.integers(0, 6)),        # arrival step
    min_size=1, max_size=14)


@settings(max_examples=150, deadline=None)
@given(reqs=requests, pool=st.integers(4, 40), max_seqs=st.integers(1, 8), budget=st.integers(4, 64),
       aborts=st.lists(st.tuples(st.integers(0, 13), st.integers(0, 60)), max_size=4),
       keys=st.lists(st.sampled_from([None, "a", "b"]), min_size=14, max_size=14),
       weights=st.tuples(st.sampled_from([1.0, 3.0]), st.sampled_from([1.0, 0.5])))
def test_the_scheduler_always_progresses_and_waiting_sequences_hold_nothing(reqs, pool, max_seqs, budget, aborts,
                                                                            keys, weights):
    bm = BlockManager(pool, BLOCK)
    sched = Scheduler(bm, max_num_seqs=max_seqs, max_num_batched_tokens=budget)
    seqs: list[Sequence] = []
    for i, (plen, mt, group, _) in enumerate(reqs):
        prefix = [1000 + 50 * group + k for k in range(min(plen, 12))]
        prompt = (prefix + [3000 + 40 * i + k for k in range(plen)])[:plen]
        # client keys (seat sharing preempts too): None, "a" and "b" with tier weights
        weight = {"a": weights[0], "b": weights[1]}.get(keys[i] or "", 1.0)
        seqs.append(Sequence(f"r{i}", prompt, SamplingParams(max_tokens=mt), tenant=keys[i], tenant_weight=weight))
    # admission (Engine.validate): a request whose prompt + output can never fit the pool is refused
    admitted = [s for s in seqs if _blocks(s.num_tokens + s.params.max_tokens) <= pool]
    arrivals = {s.request_id: reqs[int(s.request_id[1:])][3] for s in admitted}
    abort_at = {f"r{i}": step for i, step in aborts}
    bound = 50 + sum(s.num_tokens + s.params.max_tokens for s in admitted) * (len(admitted) + 1)
    for step in range(bound):
        for s in admitted:
            if arrivals[s.request_id] == step:
                sched.add(s)
        for s in admitted:
            if abort_at.get(s.request_id) == step and not s.is_finished and arrivals[s.request_id] <= step:
                sched.finish(s, "abort")
        pending = [s for s in admitted if arrivals[s.request_id] <= step and not s.is_finished]
        batch = sched.schedule()
        _check(sched, admitted)
        if pending:
            assert not batch.is_empty, f"step {step}: {len(pending)} pending, none scheduled (pool {pool})"
        run_step(sched, batch)
        _check(sched, admitted)
        if all(s.is_finished for s in admitted) and step >= max(arrivals.values(), default=0):
            break
    assert all(s.is_finished for s in admitted), "requests that fit the pool alone never finished"
    assert all(c == 0 for c in bm.ref_cnt)


def test_the_reported_deadlock_shape_finishes():
    """3 concurrent 400+600-token requests on a pool that holds one of them at a time."""
    bm = BlockManager(_blocks(1000) + 10, BLOCK)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=256)
    shared = list(range(1, 300))
    seqs = [Sequence(f"r{i}", shared + list(range(5000 + 200 * i, 5000 + 200 * i + 101)),
                     SamplingParams(max_tokens=600)) for i in range(3)]
    for s in seqs:
        sched.add(s)
    for _ in range(20_000):
        batch = sched.schedule()
        _check(sched, seqs)
        assert not batch.is_empty
        run_step(sched, batch)
        if all(s.is_finished for s in seqs):
            break
    assert all(s.is_finished for s in seqs)
