"""One request's fault fails that request alone (issue 22): the rest of the batch finishes with
the tokens it would have produced without it, and every KV block goes back to the pool."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zgtool.engine import Engine, EngineConfig, SamplingParams
from zgtool.engine.errors import InvalidRequest, SequenceFault
from zgtool.engine.sampling import sample

GREEDY = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


def _prompts(n: int) -> list[list[int]]:
    return [[256, *range(3 + i, 3 + i + 4 + 3 * i)] for i in range(n)]


@pytest.fixture
def engine() -> Engine:
    return Engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", block_size=8))


def _generate_all(engine: Engine, prompts: list[list[int]], poison: int | None, raise_with) -> tuple[dict, dict]:
    """Run every prompt in one batch; the runner fails whenever the poisoned sequence is in the step."""
    real = engine.runner.execute

    def execute(batch):  # noqa: ANN001, ANN202
        rows = [i for i, s in enumerate(batch.seqs) if s.request_id == f"p{poison}"]
        if rows:
            raise_with(rows)
        return real(batch)

    engine.runner.execute = execute  # type: ignore[method-assign]
    tokens: dict[str, list[int]] = {}
    errors: dict[str, str | None] = {}
    for i, p in enumerate(prompts):
        engine.add_request(p, GREEDY, request_id=f"p{i}")
    while engine._has_work():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.token_ids)
            if out.finished:
                errors[out.request_id] = out.error
    return tokens, errors


def _raise_runtime(rows: list[int]) -> None:
    raise RuntimeError("multinomial: invalid probability distribution")


def _raise_fault(rows: list[int]) -> None:
    raise SequenceFault(rows, "non-finite logits")


@pytest.mark.parametrize("raise_with", [_raise_runtime, _raise_fault], ids=["unattributed", "sequence-fault"])
def test_a_fault_tied_to_one_of_16_sequences_fails_it_alone(raise_with) -> None:
    prompts = _prompts(16)
    quiet = Engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", block_size=8))
    ref_tokens, ref_errors = _generate_all(quiet, prompts, None, raise_with)
    hit = Engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu", block_size=8))
    tokens, errors = _generate_all(hit, prompts, 5, raise_with)
    assert errors["p5"] is not None and "p5" in errors["p5"]
    for i in range(16):
        if i != 5:
            assert errors[f"p{i}"] is None and tokens[f"p{i}"] == ref_tokens[f"p{i}"], i
    assert all(c == 0 for c in hit.block_manager.ref_cnt)  # every block went back to the pool


def test_client_errors_name_the_request_not_the_exception() -> None:
    engine = Engine(EngineConfig(model="dummy:tiny", dtype="float32", device="cpu"))
    engine.runner.execute = lambda batch: (_ for _ in ()).throw(ZeroDivisionError("secret detail"))  # type: ignore
    engine.add_request([256, 5, 6], GREEDY, request_id="only")
    outs = engine.step()
    assert outs and outs[0].finished and "only" in (outs[0].error or "")
    assert "secret detail" not in (outs[0].error or "")


@settings(max_examples=200, deadline=None)
@given(temperature=st.floats(min_value=1e-300, max_value=1e3, allow_nan=False),
       scale=st.floats(min_value=1e-3, max_value=1e30), top_p=st.floats(min_value=1e-300, max_value=1.0),
       top_k=st.integers(min_value=0, max_value=600))
def test_finite_logits_sample_a_valid_token_at_any_temperature(temperature, scale, top_p, top_k) -> None:
    if top_p <= 0:
        return
    logits = (torch.randn(2, 512, generator=torch.Generator().manual_seed(1)) * scale).float()
    params = [SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)] * 2
    toks = sample(logits, params, [None, None])
    assert all(0 <= t < 512 for t in toks)


def test_a_tiny_temperature_is_greedy() -> None:
    assert SamplingParams(temperature=1e-300).greedy and SamplingParams(temperature=1e-6).greedy
    assert not SamplingParams(temperature=1e-4).greedy


def test_non_finite_logits_are_that_rows_fault() -> None:
    logits = torch.zeros(3, 8)
    logits[1, 2] = math.nan
    with pytest.raises(SequenceFault) as info:
        sample(logits, [SamplingParams(temperature=0.7)] * 3, [None] * 3)
    assert info.value.rows == [1]


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0])
def test_unusable_temperatures_are_invalid_requests(value: float) -> None:
    with pytest.raises(InvalidRequest):
        SamplingParams(temperature=value)


def test_a_temperature_of_1e_300_beside_other_streams_finishes_and_they_do_too(engine: Engine) -> None:
    for i, t in enumerate([1e-300, 0.8, 0.0, 1e-38]):
        engine.add_request([256, 9, 10, 11 + i], SamplingParams(max_tokens=8, temperature=t, seed=i, ignore_eos=True),
                           request_id=f"t{i}")
    done = {}
    while engine._has_work():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    assert sorted(done) == ["t0", "t1", "t2", "t3"] and all(o.error is None for o in done.values())
