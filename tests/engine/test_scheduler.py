"""Continuous batching, chunked prefill, preemption by recompute (no torch)."""

from __future__ import annotations

from zgtool.engine.block_manager import BlockManager
from zgtool.engine.config import SamplingParams
from zgtool.engine.scheduler import Scheduler
from zgtool.engine.sequence import Sequence, Status


def seq(n: int, rid: str, max_tokens: int = 8, first: int = 1) -> Sequence:
    return Sequence(rid, list(range(first, first + n)), SamplingParams(max_tokens=max_tokens))


def run_step(sched: Scheduler, batch, token: int = 5) -> None:
    """What the engine does after the runner: advance computed counts, append sampled tokens."""
    for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
        done = s.num_computed_tokens + n == s.num_tokens
        s.num_computed_tokens += n
        sched.bm.cache_full_blocks(s)
        if done:
            s.token_ids.append(token)
            if s.num_output_tokens >= s.params.max_tokens:
                sched.finish(s, "length")


def test_long_prompt_is_chunked_while_running_decodes_keep_stepping():
    bm = BlockManager(64, 4)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=16)
    short = seq(4, "short", max_tokens=20)
    sched.add(short)
    run_step(sched, sched.schedule())  # short's prefill
    long = seq(60, "long", first=1000)
    sched.add(long)
    for _ in range(4):
        b = sched.schedule()
        assert short in b.seqs and b.num_new_tokens[b.seqs.index(short)] == 1  # decode never stalls
        assert b.num_tokens <= 16
        assert long in b.seqs and b.num_new_tokens[b.seqs.index(long)] == 15
        run_step(sched, b)
    assert long.num_computed_tokens == 60 and long.num_output_tokens == 1


def test_cap_on_running_sequences_is_respected_fcfs():
    sched = Scheduler(BlockManager(64, 4), max_num_seqs=2, max_num_batched_tokens=100)
    seqs = [seq(3, f"r{i}") for i in range(4)]
    for s in seqs:
        sched.add(s)
    b = sched.schedule()
    assert b.seqs == seqs[:2]
    assert list(sched.waiting) == seqs[2:]


def test_out_of_blocks_preempts_newest_and_it_resumes_by_recompute():
    bm = BlockManager(4, 4, enable_prefix_caching=False)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64)
    a, b = seq(7, "a", max_tokens=8), seq(7, "b", max_tokens=8, first=100)
    sched.add(a)
    sched.add(b)
    run_step(sched, sched.schedule())  # both prefilled: 2 blocks each, the pool is full
    run_step(sched, sched.schedule())  # position 7 still fits in each second block
    assert bm.num_free_blocks == 0 and b.num_output_tokens == 2
    batch = sched.schedule()           # a needs a 3rd block for position 8: b, the newest, is preempted
    assert b in batch.preempted and b not in batch.seqs and a in batch.seqs
    assert b.status is Status.WAITING and b.block_table == [] and b.num_computed_tokens == 0
    outputs_before = b.output_token_ids
    run_step(sched, batch)
    while not a.is_finished:
        run_step(sched, sched.schedule())
    # a finished and freed its blocks: b resumes, recomputing prompt + its earlier outputs
    batch = sched.schedule()
    assert batch.seqs == [b] and batch.num_new_tokens == [b.num_tokens]
    assert b.output_token_ids == outputs_before
    run_step(sched, batch)
    while not b.is_finished:
        run_step(sched, sched.schedule())
    assert b.num_output_tokens == 8 and bm.num_used_blocks == 0


def test_abort_while_waiting_or_running_frees_every_block():
    bm = BlockManager(16, 4)
    sched = Scheduler(bm, max_num_seqs=1, max_num_batched_tokens=64)
    a, b = seq(9, "a"), seq(9, "b")
    sched.add(a)
    sched.add(b)
    run_step(sched, sched.schedule())
    sched.finish(b, "abort")  # waiting
    sched.finish(a, "abort")  # running
    assert bm.num_used_blocks == 0 and not sched.has_work
