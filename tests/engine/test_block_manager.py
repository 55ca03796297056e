"""Block pool and prefix cache bookkeeping (no torch)."""

from __future__ import annotations

from zgtool.engine.block_manager import BlockManager
from zgtool.engine.config import SamplingParams
from zgtool.engine.sequence import Sequence


def seq(ids: list[int], rid: str = "r") -> Sequence:
    return Sequence(rid, ids, SamplingParams(max_tokens=4))


def compute_all(bm: BlockManager, s: Sequence) -> None:
    n = s.num_tokens - s.num_computed_tokens
    assert bm.allocate(s, n)
    s.num_computed_tokens += n
    bm.cache_full_blocks(s)


def test_allocation_takes_ceil_blocks_and_free_returns_them():
    bm = BlockManager(num_blocks=8, block_size=4)
    s = seq(list(range(10)))
    bm.match_prefix(s)
    assert bm.allocate(s, 10)
    assert len(s.block_table) == 3 and bm.num_used_blocks == 3
    assert all(bm.ref_cnt[b] == 1 for b in s.block_table)
    bm.free_seq(s)
    assert bm.num_used_blocks == 0 and s.block_table == []


def test_allocation_fails_without_changing_anything_when_pool_is_short():
    bm = BlockManager(num_blocks=2, block_size=4)
    s = seq(list(range(12)))
    assert not bm.allocate(s, 12)
    assert bm.num_used_blocks == 0 and s.block_table == []


def test_requests_sharing_a_system_prompt_share_its_blocks_by_ref_count():
    bm = BlockManager(num_blocks=16, block_size=4)
    system = list(range(100, 112))  # 3 full blocks
    a = seq(system + [1, 2], "a")
    bm.match_prefix(a)
    compute_all(bm, a)
    b = seq(system + [7, 8, 9], "b")
    hit = bm.match_prefix(b)
    assert hit == 12
    assert b.block_table == a.block_table[:3]
    assert all(bm.ref_cnt[x] == 2 for x in b.block_table)
    assert bm.prefix_hits == 12
    compute_all(bm, b)
    bm.free_seq(a)
    bm.free_seq(b)
    assert bm.num_used_blocks == 0


def test_a_full_prompt_hit_still_leaves_one_token_to_compute():
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq(list(range(8)), "a")
    bm.match_prefix(a)
    compute_all(bm, a)
    bm.free_seq(a)
    b = seq(list(range(8)), "b")
    assert bm.match_prefix(b) == 4  # not 8: the last token's logits are needed


def test_freed_prefix_blocks_stay_cached_until_evicted_lru():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = seq(list(range(8)) + [99], "a")
    bm.match_prefix(a)
    compute_all(bm, a)
    bm.free_seq(a)
    assert bm.num_cached_free_blocks == 2 and bm.num_used_blocks == 0
    # a different request needs 3 blocks: never-cached blocks go first, then the prefix's
    # tail (freed last-first), so the prefix's head block survives longest
    c = seq(list(range(50, 61)), "c")
    bm.match_prefix(c)
    assert bm.allocate(c, 11)
    assert bm.num_cached_free_blocks == 1
    assert bm.match_prefix(seq(list(range(8)) + [5], "d")) == 4


def test_fragmentation_and_compaction_plan():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    seqs = [seq(list(range(4)), f"s{i}") for i in range(8)]
    for s in seqs:
        bm.match_prefix(s)
        assert bm.allocate(s, 4)
    for s in seqs[::2]:
        bm.free_seq(s)
    assert bm.fragmentation() > 0
    plan = bm.compaction_plan()
    live = seqs[1::2]
    bm.apply_compaction(plan, live)
    assert bm.fragmentation() == 0
    assert sorted(b for s in live for b in s.block_table) == [0, 1, 2, 3]
    assert bm.num_used_blocks == 4
