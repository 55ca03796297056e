"""The step's postprocessing stage (engine/postprocess.py) and the engine's progress watch: a
request whose own text or filter raises fails alone; a step that can schedule nothing is
counted and reported, not spun on silently."""

from __future__ import annotations

import pytest

from zgtool.engine import Engine, EngineConfig, SamplingParams

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


def _engine(**kw) -> Engine:  # noqa: ANN003
    return Engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", block_size=8, **kw))


def _run(engine: Engine, n: int, poison: int | None) -> tuple[dict, dict]:
    def broken_filter(text: str) -> str | None:
        raise KeyError("filter bug")

    tokens: dict[str, list[int]] = {}
    errors: dict[str, str | None] = {}
    for i in range(n):
        engine.add_request([256, 3 + i, 4 + i, 5], GREEDY, request_id=f"r{i}",
                           output_filter=broken_filter if i == poison else None)
    while engine._has_work():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
            if out.finished:
                errors[out.request_id] = out.error
    return tokens, errors


def test_an_output_filter_that_raises_fails_its_request_alone():
    ref_tokens, _ = _run(_engine(), 8, None)
    engine = _engine()
    tokens, errors = _run(engine, 8, 3)
    assert errors["r3"] == "internal engine error (request r3)"
    for i in range(8):
        if i != 3:
            assert errors[f"r{i}"] is None and tokens[f"r{i}"] == ref_tokens[f"r{i}"], i
    assert all(c == 0 for c in engine.block_manager.ref_cnt)


def test_a_step_that_can_schedule_nothing_is_counted_once_per_episode(monkeypatch: pytest.MonkeyPatch):
    engine = _engine()
    monkeypatch.setattr(engine.block_manager, "allocate", lambda seq, n: False)   # a wedged pool
    engine.add_request([256, 7, 8], GREEDY, request_id="stuck")
    for _ in range(3):
        assert engine.step() == []
    stats = engine.stats()
    assert stats["stuck_steps"] == 3 and stats["stuck_episodes"] == 1
    engine.abort("stuck")
    outs = engine.step()
    assert outs[0].finished and outs[0].finish_reason == "abort"
    monkeypatch.undo()
    out = engine.generate([256, 7, 8], GREEDY)
    assert len(out.output_token_ids) == 10 and engine.stats()["stuck_episodes"] == 1


def test_deterministic_mode_runs_with_a_step_budget_below_its_chunk():
    engine = _engine(deterministic=True, max_num_batched_tokens=16)
    engine.add_request([256, *range(3, 60)], GREEDY, request_id="long")
    done = []
    for _ in range(30):     # 58 prompt tokens in chunks of 16, then 10 tokens
        done += [o for o in engine.step() if o.finished]
    assert [o.finish_reason for o in done] == ["length"] and engine.stats()["stuck_steps"] == 0
