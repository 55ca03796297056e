"""KV-pool compaction: fragmentation to zero, nothing in use freed, outputs unchanged."""

from __future__ import annotations

import pytest

from zgtool.engine import Engine, EngineConfig, SamplingParams

PARAMS = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)


def prompts() -> list[list[int]]:
    return [[256, *([30 + i] * (20 + 5 * i))] for i in range(6)]


@pytest.fixture()
def engine() -> Engine:
    return Engine(EngineConfig(model="dummy:tiny", deterministic=True, block_size=16,
                               enable_prefix_caching=False, max_num_batched_tokens=512))


def start_fragmented(engine: Engine) -> list:
    seqs = [engine._new_seq(p, PARAMS, f"r{i}", None) for i, p in enumerate(prompts())]
    for s in seqs:
        engine._seqs[s.request_id] = s
        engine.scheduler.add(s)
    for _ in range(12):  # prefill, then decodes that grow every table block by block, interleaved
        engine.step()
    for s in seqs[::2]:  # finish alternate requests: holes all over the pool
        engine.abort(s.request_id)
    engine.step()
    return seqs[1::2]


def test_defrag_brings_fragmentation_to_zero_and_frees_nothing_in_use(engine):
    live = start_fragmented(engine)
    before = engine.kv_report()
    assert before["fragmentation"] > 0
    used_tables = [list(s.block_table) for s in live]
    rep = engine.defrag()
    assert rep["after"]["fragmentation"] == 0
    assert rep["after"]["kv_blocks_used"] == before["kv_blocks_used"]
    assert any("moved" in a for a in rep["actions"])
    new_ids = sorted(b for s in live for b in s.block_table)
    assert new_ids == list(range(len(new_ids)))
    assert [len(t) for t in used_tables] == [len(s.block_table) for s in live]


def test_a_running_stream_produces_the_same_tokens_with_or_without_defrag(engine):
    target = prompts()[3]
    alone = Engine(EngineConfig(model="dummy:tiny", deterministic=True, block_size=16,
                                enable_prefix_caching=False)).generate(target, PARAMS).output_token_ids
    live = start_fragmented(engine)
    seq = next(s for s in live if s.prompt_token_ids == target)
    engine.defrag()
    while not seq.is_finished:
        engine.step()
    assert seq.output_token_ids == alone
    while engine.scheduler.has_work:
        engine.step()
    assert engine.block_manager.num_used_blocks == 0


def test_dry_run_changes_nothing(engine):
    live = start_fragmented(engine)
    tables = [list(s.block_table) for s in live]
    before = engine.kv_report()
    rep = engine.defrag(dry_run=True)
    assert rep["dry_run"] and rep["planned_moves"] > 0 and rep["actions"] == []
    assert engine.kv_report() == before
    assert [s.block_table for s in live] == tables


def test_drop_prefix_cache_releases_evictable_blocks():
    e = Engine(EngineConfig(model="dummy:tiny", block_size=16))
    e.generate([256, *([7] * 70)], SamplingParams(max_tokens=2, temperature=0))
    assert e.kv_report()["kv_blocks_cached"] > 0
    rep = e.defrag(drop_prefix_cache=True)
    assert rep["after"]["kv_blocks_cached"] == 0
    assert any("dropped" in a for a in rep["actions"])
