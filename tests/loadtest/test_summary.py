"""k6 summary -> zgtool dataclasses, on summaries recorded from real k6 v1.1 runs (data/)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from zgtool.errors import UsageError
from zgtool.loadtest.render import bench_verdict
from zgtool.loadtest.summary import PHASES, BenchResult, RampStep, find_knee, ramp_path, scenario_stats

DATA = Path(__file__).parent / "data"


def _load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def test_every_phase_of_every_scenario_is_converted_with_k6_percentiles():
    summary = _load("k6_summary_gateway_vs_direct.json")
    s = scenario_stats(summary, "direct", url="http://x", stream=False, rate_rps=10, duration_s=1.0)
    raw = summary["metrics"]["http_req_duration{path:direct}"]["values"]
    assert s.http_req_duration.p95 == raw["p(95)"] and s.http_req_duration.p50 == raw["med"]
    assert s.requests == 11 and s.failures == 0 and s.failure_rate == 0 and s.dropped_iterations == 0
    for phase in PHASES:
        assert getattr(s, phase).count == 11


def test_failed_requests_are_read_from_the_rate_passes():
    summary = _load("k6_summary_gateway_vs_direct.json")
    summary["metrics"]["http_req_failed{path:gateway}"]["values"].update(passes=3, fails=8)
    s = scenario_stats(summary, "gateway", url="http://x", stream=False, rate_rps=10, duration_s=1.0)
    assert s.failures == 3 and s.failure_rate == pytest.approx(3 / 11)


def test_summary_without_the_per_path_submetrics_is_a_clear_error():
    summary = _load("k6_summary_gateway_vs_direct.json")
    del summary["metrics"]["http_req_waiting{path:direct}"]
    with pytest.raises(UsageError, match=r"no 'http_req_waiting\{path:direct\}'"):
        scenario_stats(summary, "direct", url="http://x", stream=False, rate_rps=10, duration_s=1.0)


def test_ramp_summary_gives_p95_per_rate_step():
    path = ramp_path(_load("k6_summary_ramp.json"), "direct", "http://x", [5, 20, 40], 1.0)
    assert [s.requests for s in path.steps] == [4, 20, 40]
    assert all(not math.isnan(s.p95_ms) for s in path.steps)


def _steps(*p95s: float, rates=(10, 20, 40, 80), failures=0) -> list[RampStep]:
    return [RampStep(r, 5.0, int(r * 5), r, failures, p / 2, p, p * 1.2) for r, p in zip(rates, p95s, strict=True)]


def test_knee_is_the_rate_from_which_p95_stays_doubled():
    knee, reason, base = find_knee(_steps(1.0, 1.2, 2.5, 6.0))
    assert (knee, base) == (40, 1.0) and "p95 2.50 ms >= 2 x 1.00 ms" in reason


def test_a_single_noisy_step_is_not_the_knee():
    knee, reason, _ = find_knee(_steps(1.0, 2.4, 1.1, 1.3))
    assert knee is None and "up to 80 req/s" in reason


def test_failures_or_an_unkept_rate_mark_the_knee():
    steps = _steps(1.0, 1.0, 1.0, 1.0)
    steps[3] = RampStep(80, 5.0, 400, 80, 40, 0.5, 1.0, 1.2)
    assert find_knee(steps)[0:2] == (80, "40 of 400 requests failed")
    steps[3] = RampStep(80, 5.0, 200, 40, 0, 0.5, 1.0, 1.2)
    assert find_knee(steps)[1] == "only 40.0 of 80 req/s started"


def _bench(summary: dict, failures: dict[str, int] | None = None) -> BenchResult:
    scen = {}
    for name in ("direct", "gateway"):
        if failures and name in failures:
            summary["metrics"][f"http_req_failed{{path:{name}}}"]["values"].update(
                passes=failures[name], fails=11 - failures[name])
        scen[name] = scenario_stats(summary, name, url="http://x", stream=False, rate_rps=10, duration_s=1.0)
    return BenchResult(k6_version="v1.1", script="s.js", config={"rate_rps": 10}, scenarios=scen, requests=22,
                       failures=sum((failures or {}).values()), failure_rate=0.0, dropped_iterations=0,
                       load_generator_saturated=False, test_run_s=1.0)


def test_bench_answers_first_with_what_the_gateway_adds_at_p50_and_p95():
    summary = _load("k6_summary_gateway_vs_direct.json")
    res = _bench(summary)
    d, g = res.scenarios["direct"].http_req_duration, res.scenarios["gateway"].http_req_duration
    line = bench_verdict(res)
    assert line.startswith(f"gateway adds {g.p50 - d.p50:+.2f} ms at p50")
    assert f"{g.p95 - d.p95:+.2f} ms at p95" in line and "at 10 req/s" in line and "no interval" in line


def test_bench_verdict_names_failures_and_a_run_where_nothing_succeeded():
    summary = _load("k6_summary_gateway_vs_direct.json")
    assert "gateway: 3 of 11 failed" in bench_verdict(_bench(summary, {"gateway": 3}))
    summary = _load("k6_summary_gateway_vs_direct.json")
    assert bench_verdict(_bench(summary, {"direct": 11, "gateway": 11})).startswith("No request succeeded")


def test_the_verdict_gives_the_p50_difference_its_interval_and_says_when_it_holds_zero():
    summary = _load("k6_summary_gateway_vs_direct.json")
    res = _bench(summary)
    g = {"vs": "direct", "p50_ms": 1.0, "lo_ms": 0.4, "hi_ms": 1.9, "confidence": 0.95, "verdict": "higher", "n": 11}
    line = bench_verdict(replace(res, differences={"gateway": g}))
    assert "; 95% interval [+0.40, +1.90])" in line and "not significant" not in line
    assert "intervals over requests; separate k6 runs, so a drift between them is not covered" in line
    line = bench_verdict(replace(res, differences={"gateway": {**g, "lo_ms": -0.2}}))
    assert "; 95% interval [-0.20, +1.90], not significant)" in line
    # an interval of too few requests is not printed
    assert "interval" not in bench_verdict(replace(res, differences={"gateway": {**g, "lo_ms": None}})).split("(")[1]


def test_p50_differences_are_each_path_against_direct_from_the_raw_durations():
    from zgtool.loadtest.differences import p50_differences

    direct = [10.0 + i * 0.1 for i in range(40)]
    points = {"direct": {"http_req_duration": direct},
              "gateway": {"http_req_duration": [v + 5.0 for v in direct]},
              "direct_stream": {"http_req_duration": [v + 0.01 * (-1) ** i for i, v in enumerate(direct)]}}
    out = p50_differences(points, ["gateway", "direct", "direct_stream"])
    assert set(out) == {"gateway", "direct_stream"}
    assert out["gateway"]["p50_ms"] == pytest.approx(5.0) and out["gateway"]["lo_ms"] > 0
    assert out["gateway"]["verdict"] == "higher"
    assert out["direct_stream"]["lo_ms"] <= 0 <= out["direct_stream"]["hi_ms"]
    assert out["direct_stream"]["verdict"] == "not significant"
    assert p50_differences(points, ["gateway"]) == {}                 # no direct run: nothing to compare with
    assert p50_differences({"gateway": points["gateway"]}, ["gateway", "direct"]) == {}
