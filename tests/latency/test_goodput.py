"""Throughput, token totals and goodput at an SLO (vLLM benchmark_serving / DistServe definitions)."""

from __future__ import annotations

import pytest

from zgtool.errors import UsageError
from zgtool.latency.analysis.phases import analyse, measured_duration_s, throughput
from zgtool.latency.config import Slo, SplitConfig
from zgtool.latency.records import RequestSample
from zgtool.latency.schedule.runner import measure_targets
from zgtool.targets import Target


def sample(i: int, rnd: int, start_s: float, total_ms: float, ttft_ms: float | None = None,
           tpot_ms: float | None = None, out: int | None = 8, inp: int | None = 5, ok: bool = True) -> RequestSample:
    return RequestSample(index=i, worker=0, round=rnd, ok=ok, start_s=start_s, total_ms=total_ms, ttft_ms=ttft_ms,
                         tpot_ms=tpot_ms, output_tokens=out, input_tokens=inp)


def test_slo_parses_the_vllm_goodput_form_and_rejects_nonsense() -> None:
    assert Slo.parse("ttft:500 tpot:20 e2el:2000") == Slo(ttft_ms=500, tpot_ms=20, e2e_ms=2000)
    assert Slo.parse(["ttft:500", "e2e:1s".replace("1s", "1000")]) == Slo(ttft_ms=500, e2e_ms=1000)
    assert Slo.parse("ttft:500,tpot:20") == Slo(ttft_ms=500, tpot_ms=20)
    assert Slo.parse([]) is None and Slo.parse(None) is None
    for bad in ("ttft=500", "latency:5", "ttft:abc", "ttft:0", "tpot:-3"):
        with pytest.raises(UsageError):
            Slo.parse(bad)


def test_a_request_is_good_only_when_it_meets_every_slo() -> None:
    slo = Slo(ttft_ms=100, tpot_ms=10, e2e_ms=500)
    assert slo.met_by(ttft_ms=90, tpot_ms=9, e2e_ms=400, stream=True)
    assert not slo.met_by(ttft_ms=110, tpot_ms=9, e2e_ms=400, stream=True)
    assert not slo.met_by(ttft_ms=90, tpot_ms=11, e2e_ms=400, stream=True)
    assert not slo.met_by(ttft_ms=90, tpot_ms=9, e2e_ms=600, stream=True)
    assert slo.met_by(ttft_ms=90, tpot_ms=None, e2e_ms=400, stream=True)   # one token: TPOT 0 (vLLM)
    # a whole-body answer shows its first token when the body is complete
    assert not Slo(ttft_ms=100).met_by(ttft_ms=None, tpot_ms=None, e2e_ms=150, stream=False)
    assert Slo(ttft_ms=200, tpot_ms=1).met_by(ttft_ms=None, tpot_ms=None, e2e_ms=150, stream=False)


def test_duration_is_the_wall_time_of_each_rounds_block() -> None:
    samples = [sample(0, 0, 0.0, 100.0), sample(1, 0, 0.1, 100.0),      # round 0: 0.0 .. 0.2 s
               sample(2, 1, 5.0, 50.0), sample(3, 1, 5.05, 50.0)]       # round 1: 5.0 .. 5.1 s
    assert measured_duration_s(samples) == pytest.approx(0.3)


def test_throughput_tokens_and_goodput_over_the_measured_time() -> None:
    samples = [sample(0, 0, 0.0, 100.0, ttft_ms=20, tpot_ms=5), sample(1, 0, 0.1, 100.0, ttft_ms=80, tpot_ms=5),
               sample(2, 1, 1.0, 100.0, ttft_ms=20, tpot_ms=50), sample(3, 1, 1.1, 100.0, ok=False, out=None)]
    tp = throughput(samples, Slo(ttft_ms=50, tpot_ms=10), stream=True)
    assert tp.duration_s == pytest.approx(0.4)
    assert tp.requests_ok == 3 and tp.request_rps == pytest.approx(3 / 0.4)
    assert (tp.input_tokens, tp.output_tokens) == (15, 24)
    assert tp.output_tok_s == pytest.approx(24 / 0.4)
    assert tp.good_requests == 1 and tp.goodput_rps == pytest.approx(1 / 0.4)
    assert tp.slo == {"ttft_ms": 50, "tpot_ms": 10}


def test_without_usage_tokens_are_unknown_not_zero() -> None:
    tp = throughput([sample(0, 0, 0.0, 10.0, out=None, inp=None)], None, stream=False)
    assert tp.output_tokens is None and tp.input_tokens is None and tp.output_tok_s is None
    assert tp.goodput_rps is None and tp.good_requests is None


def test_a_live_split_reports_throughput_tokens_and_goodput(origin: str) -> None:
    targets = [Target("origin", origin, "anthropic")]
    cfg = SplitConfig(num_requests=8, warmup=1, stream=True, max_tokens=4,
                      slo=Slo(ttft_ms=10_000, e2e_ms=60_000))
    res = analyse(targets, measure_targets(targets, cfg), cfg)
    tp = res.targets[0].throughput
    assert tp is not None and tp.requests_ok == 8
    assert tp.request_rps is not None and tp.request_rps > 0
    assert tp.output_tokens is not None and tp.output_tokens > 0
    assert tp.input_tokens is not None and tp.input_tokens > 0
    assert tp.good_requests == 8 and tp.goodput_rps == pytest.approx(tp.request_rps)
    assert res.config["slo"] == {"ttft_ms": 10_000, "e2e_ms": 60_000}
