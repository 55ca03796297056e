"""The prefix cache never attaches another request's KV on a hash match alone (issue 26,
the pattern of vLLM's GHSA-rm76-4mrf-v9r8): hashes are sha256 chains, and a hit is checked
against the block's tokens and its parent."""

from __future__ import annotations

import hashlib
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_block_manager import compute_all, seq

from zgtool.engine import block_manager as bm_mod
from zgtool.engine.block_manager import BlockManager


def test_block_hashes_are_sha256_chains_over_the_parent_and_the_token_ids():
    bm = BlockManager(num_blocks=8, block_size=4)
    s = seq([5, 6, 7, 8, 9, 10, 11, 12, 13])
    bm.match_prefix(s)
    first = hashlib.sha256(array("q", [5, 6, 7, 8]).tobytes()).digest()
    second = hashlib.sha256(first + array("q", [9, 10, 11, 12]).tobytes()).digest()
    assert s.block_hashes == [first, second]


@pytest.fixture
def weak_hash(monkeypatch):
    """Every block hashes the same: what an attacker who found a collision would get."""
    monkeypatch.setattr(bm_mod, "chain_digest", lambda parent, data: b"collide")


def test_two_different_blocks_with_the_same_hash_never_share_kv(weak_hash):
    bm = BlockManager(num_blocks=16, block_size=4)
    victim = seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "victim")
    bm.match_prefix(victim)
    compute_all(bm, victim)
    attacker = seq([40, 41, 42, 43, 44, 45, 46, 47, 48], "attacker")
    assert bm.match_prefix(attacker) == 0
    assert not set(attacker.block_table) & set(victim.block_table)
    compute_all(bm, attacker)
    assert not set(attacker.block_table) & set(victim.block_table)


def test_a_colliding_second_block_after_a_true_first_block_is_not_shared(weak_hash):
    """Same first block (a real hit), a different second block with the same hash: only the first is shared."""
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a")
    bm.match_prefix(a)
    compute_all(bm, a)
    b = seq([1, 2, 3, 4, 50, 60, 70, 80, 9], "b")
    # the weak hash maps every block to a's first block, whose tokens match b's first block only
    assert bm.match_prefix(b) == 4
    assert b.block_table == a.block_table[:1]


def test_equal_tokens_after_a_different_parent_are_not_shared(weak_hash):
    """A block's KV depends on everything before it: equal tokens behind a different prefix miss."""
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a")
    bm.match_prefix(a)
    compute_all(bm, a)
    bm.hash_to_block = {b"collide": a.block_table[1]}   # the lookup lands on a's second block
    b = seq([5, 6, 7, 8, 5, 6, 7, 8, 9], "b")
    assert bm.match_prefix(b) == 0


@settings(max_examples=80, deadline=None)
@given(prompts=st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=20), min_size=2, max_size=8))
def test_under_any_hash_collisions_a_hit_holds_exactly_the_requests_tokens(prompts):
    """With a 1-bit hash (collisions everywhere), every block a request attaches holds its own
    prefix: the tokens the block was computed for equal the request's, block by block."""
    original = bm_mod.chain_digest
    # token ids 0-3 as int64 bytes: their byte sum is their sum
    bm_mod.chain_digest = lambda parent, data: bytes([sum(data) % 2])
    try:
        bm = BlockManager(num_blocks=64, block_size=2)
        computed_for: dict[int, list[int]] = {}     # block -> the full prefix it was computed after
        for i, p in enumerate(prompts):
            s = seq(p, f"r{i}")
            hit = bm.match_prefix(s)
            for j, b in enumerate(s.block_table[: hit // 2]):
                assert computed_for[b] == p[: (j + 1) * 2], "attached KV computed for another prefix"
            compute_all(bm, s)
            for j in range(hit // 2, len(p) // 2):     # computed now (a reused block holds new KV)
                computed_for[s.block_table[j]] = p[: (j + 1) * 2]
            bm.free_seq(s)
    finally:
        bm_mod.chain_digest = original


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_a_generation_hashes_each_full_block_once_not_each_token(monkeypatch, prefix_caching):
    """Per-token bookkeeping stays per block: a null-engine request of 40 prompt and 60 output
    tokens computes one sha256 chain hash per block that fills (the same chain as chain_hash),
    whatever the number of steps."""
    from zgtool.engine import Engine, EngineConfig, SamplingParams

    calls = []
    real = bm_mod.chain_digest
    monkeypatch.setattr(bm_mod, "chain_digest", lambda parent, data: calls.append(data) or real(parent, data))
    eng = Engine(EngineConfig(model="null", block_size=16, enable_prefix_caching=prefix_caching))
    prompt = list(range(40))
    captured = []
    real_finish = eng.scheduler.finish
    monkeypatch.setattr(eng.scheduler, "finish", lambda s, r: captured.append(list(s.block_hashes)) or real_finish(s, r))
    res = eng.generate(prompt, SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True))
    assert len(res.output_token_ids) == 60
    engine_calls = len(calls)
    (hashes,) = captured
    tokens = prompt + res.output_token_ids
    expected, parent = [], None
    for i in range(len(hashes)):
        parent = bm_mod.chain_hash(parent, tokens[i * 16:(i + 1) * 16])
        expected.append(parent)
    assert hashes == expected and len(hashes) >= 99 // 16 - 1
    assert engine_calls == len(hashes)


def test_a_prefix_hit_reads_its_blocks_hashes_and_hashes_only_the_blocks_past_it(monkeypatch):
    """A hit block's chain hash is the request's own (the same chain): it is taken from the cache,
    not recomputed; the blocks past the hit are hashed, and the whole chain equals chain_hash's."""
    bm = BlockManager(num_blocks=16, block_size=4)
    a = seq(list(range(1, 14)), "a")
    bm.match_prefix(a)
    compute_all(bm, a)
    calls = []
    real = bm_mod.chain_digest
    monkeypatch.setattr(bm_mod, "chain_digest", lambda parent, data: calls.append(data) or real(parent, data))
    b = seq(list(range(1, 9)) + [90, 91, 92, 93, 94], "b")
    assert bm.match_prefix(b) == 8
    assert b.block_table == a.block_table[:2]
    assert len(calls) == 1      # the third block only (a miss)
    expected, parent = [], None
    for i in range(3):
        parent = bm_mod.chain_hash(parent, b.token_ids[i * 4:(i + 1) * 4])
        expected.append(parent)
    assert b.block_hashes == expected


def test_an_evicted_block_is_no_longer_found_by_its_content():
    bm = BlockManager(num_blocks=3, block_size=4)
    a = seq([1, 2, 3, 4, 5], "a")
    bm.match_prefix(a)
    compute_all(bm, a)
    bm.free_seq(a)
    other = seq(list(range(20, 30)) + [9], "other")   # takes every block: a's cached block is evicted
    bm.match_prefix(other)
    compute_all(bm, other)
    bm.free_seq(other)
    assert bm.match_prefix(seq([1, 2, 3, 4, 5], "again")) == 0
    assert (None, bm_mod.token_bytes([1, 2, 3, 4])) not in bm.by_content


@settings(max_examples=50, deadline=None)
@given(ids=st.lists(st.integers(0, 2**62), max_size=300))
def test_token_bytes_are_the_ids_as_native_int64(ids):
    assert bm_mod.token_bytes(ids) == array("q", ids).tobytes()
