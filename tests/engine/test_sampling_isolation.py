"""Sampling cannot fail on finite logits (issue 22: one request's temperature killed every
stream): extreme float32 logits, every temperature the parameters accept, top-k/top-p edges."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zgtool.engine.config import GREEDY_BELOW_TEMPERATURE, SamplingParams
from zgtool.engine.sampling import sample

F32_MAX = float(torch.finfo(torch.float32).max)
V = 64

finite_f32 = st.floats(min_value=-F32_MAX, max_value=F32_MAX, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=120, deadline=None)
@given(values=st.lists(finite_f32, min_size=V, max_size=V),
       temperature=st.one_of(st.just(0.0), st.floats(min_value=1e-300, max_value=1e3)),
       top_p=st.one_of(st.just(1.0), st.floats(min_value=1e-300, max_value=1.0, exclude_min=False)),
       top_k=st.sampled_from([0, 1, 2, V - 1, V, V + 5]), seed=st.integers(0, 2**31))
def test_extreme_finite_logits_always_give_a_token_inside_top_k_and_top_p(values, temperature, top_p, top_k, seed):
    logits = torch.tensor([values], dtype=torch.float32)
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k)
    (tok,) = sample(logits, [params], [torch.Generator().manual_seed(seed)])
    assert 0 <= tok < V
    row = logits[0]
    if params.greedy:
        assert row[tok] == row.max()
    if 0 < top_k < V:
        assert row[tok] >= torch.topk(row, top_k).values[-1]   # never outside the k largest


def test_temperatures_below_the_floor_are_greedy_and_at_it_sample():
    logits = torch.tensor([[0.0, 1.0, 0.5]])
    for t in (0.0, 1e-300, 1e-38, GREEDY_BELOW_TEMPERATURE / 2):
        assert SamplingParams(temperature=t).greedy and sample(logits, [SamplingParams(temperature=t)], [None]) == [1]
    assert not SamplingParams(temperature=GREEDY_BELOW_TEMPERATURE).greedy


def test_a_batch_mixing_greedy_and_extreme_rows_samples_each_row():
    logits = torch.tensor([[F32_MAX, -F32_MAX, 0.0], [-F32_MAX, -F32_MAX, -F32_MAX], [1.0, 2.0, 3.0]])
    params = [SamplingParams(temperature=1e-5), SamplingParams(temperature=1e3), SamplingParams(temperature=0)]
    toks = sample(logits, params, [None, torch.Generator().manual_seed(0), None])
    assert toks[0] == 0 and 0 <= toks[1] < 3 and toks[2] == 2
