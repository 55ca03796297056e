"""The in-process Engine API: determinism under batching, async streams, aborts, bad input."""

from __future__ import annotations

import asyncio

import pytest

from zgtool.engine import Engine, EngineConfig, SamplingParams
from zgtool.engine.errors import EngineError, ModelNotFound


@pytest.fixture(scope="module")
def det_engine():
    return Engine(EngineConfig(model="dummy:tiny", deterministic=True, max_num_batched_tokens=96, block_size=16))


def prompts(n: int) -> list[list[int]]:
    # different lengths, some sharing a prefix (the prefix cache is on)
    base = [256, *b"You are a careful assistant. "]
    return [base + [40 + (i * 7) % 200] * (3 + 11 * i % 57) for i in range(n)]


def test_deterministic_mode_16_concurrent_requests_match_each_alone(det_engine):
    params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    ps = prompts(16)
    alone = [det_engine.generate(p, params).output_token_ids for p in ps]
    together = [r.output_token_ids for r in det_engine.generate(ps, params)]
    assert together == alone
    assert det_engine.block_manager.num_used_blocks == 0


def test_seeded_sampling_is_reproducible_and_respects_max_tokens():
    e = Engine(EngineConfig(model="dummy:tiny"))
    p = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, top_k=50, seed=7, ignore_eos=True)
    a = e.generate([256, 1, 2, 3], p)
    b = e.generate([256, 1, 2, 3], p)
    assert a.output_token_ids == b.output_token_ids and len(a.output_token_ids) == 12
    assert a.finish_reason == "length"


def test_stop_sequence_ends_generation_and_is_not_in_the_text():
    e = Engine(EngineConfig(model="null"))
    r = e.generate("hi", SamplingParams(max_tokens=50, stop=("null",)))
    assert r.finish_reason == "stop" and r.text == "Hello from the zgtool "


@pytest.mark.parametrize("bad", [
    lambda e: e.generate([], SamplingParams()),
    lambda e: e.generate([1] * 5000, SamplingParams(max_tokens=4)),
    lambda e: e.generate([1, 2], SamplingParams(max_tokens=0)),
    lambda e: e.generate([1, 2], SamplingParams(max_tokens=1023)),
    lambda e: e.generate([10**6], SamplingParams(max_tokens=4)),
], ids=["empty-prompt", "prompt-longer-than-context", "max-tokens-zero", "prompt-plus-max-tokens-over-context",
        "token-outside-vocab"])
def test_bad_input_raises_one_error_type_and_leaks_nothing(bad):
    e = Engine(EngineConfig(model="dummy:tiny"))
    with pytest.raises(EngineError) as info:
        bad(e)
    assert str(info.value)
    assert e.block_manager.num_used_blocks == 0 and not e.scheduler.has_work


def test_context_error_names_both_counts():
    e = Engine(EngineConfig(model="dummy:tiny"))
    with pytest.raises(EngineError, match=r"5000 tokens.*1024 tokens"):
        e.generate([1] * 5000, SamplingParams(max_tokens=4))


def test_unknown_model_string_is_model_not_found():
    with pytest.raises(ModelNotFound, match="dummy:<preset>"):
        Engine(EngineConfig(model="nope/does-not-exist"))
    with pytest.raises(ModelNotFound, match="tiny"):
        Engine(EngineConfig(model="dummy:gigantic"))


def test_async_streams_deliver_tokens_timings_and_abort_frees_blocks():
    async def main() -> None:
        e = Engine(EngineConfig(model="dummy:tiny"))
        e.start()
        try:
            s1 = e.add_request([256, 1, 2, 3], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
            s2 = e.add_request([256, 9, 9], SamplingParams(max_tokens=400, temperature=0, ignore_eos=True))
            got = [o async for o in s1]
            assert sum(len(o.token_ids) for o in got) == 16 and got[-1].finish_reason == "length"
            t = s1.timings
            assert t.ttft_ms is not None and t.ttft_ms <= t.total_ms
            parts = t.server_timing()
            assert parts["queue"] + parts["prefill"] + parts["decode"] + parts["detok"] + parts["safety"] <= parts["total"] + 1e-6
            async for o in s2:
                e.abort(s2.request_id)
                if o.finished:
                    assert o.finish_reason == "abort"
            for _ in range(100):
                if e.stats()["kv_blocks_used"] == 0:
                    break
                await asyncio.sleep(0.01)
            assert e.stats()["kv_blocks_used"] == 0 and e.stats()["running"] == 0
        finally:
            await e.shutdown(1.0)

    asyncio.run(main())


def test_output_filter_stops_generation_and_withholds_the_offending_text():
    async def main() -> None:
        e = Engine(EngineConfig(model="null"))
        e.start()
        try:
            s = e.add_request([1, 2], SamplingParams(max_tokens=60),
                              output_filter=lambda text: "denied phrase" if "zgtool" in text else None)
            outs = [o async for o in s]
            text = "".join(o.text for o in outs)
            assert outs[-1].finish_reason == "content_filter" and outs[-1].error == "denied phrase"
            assert "zgtool" not in text
            assert s.timings.safety_ms > 0
            assert e.stats()["kv_blocks_used"] == 0
        finally:
            await e.shutdown(1.0)

    asyncio.run(main())


def test_the_step_counters_give_the_mean_batch_size():
    e = Engine(EngineConfig(model="null"))
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    for i in range(4):
        e.add_request([256, 1, 2, 3], params, request_id=f"r{i}")
    done = []
    while len(done) < 4:
        done += [o for o in e.step() if o.finished]
    s = e.stats()
    # four requests added before the first step run together: 3 steps of 4 sequences
    assert (s["num_steps"], s["num_step_seqs"]) == (3, 12)
    assert e.step() == [] and (e.stats()["num_steps"], e.stats()["num_step_seqs"]) == (3, 12)  # no work: no step
