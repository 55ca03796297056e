"""Poisson arrivals (k6 thinning and zgtool's own scheduler) and streaming TTFT at the ramp's knee."""

from __future__ import annotations

import math
import statistics

from zgtool.loadtest import BenchConfig, RampConfig, find_k6, run_bench, run_ramp
from zgtool.loadtest.bench import knee_rates
from zgtool.loadtest.summary import RampPath, RampStep, find_knee, started_enough
from zgtool.loadtest.ttft import arrival_times_s, poisson_ttft
from zgtool.targets import Target


def test_arrivals_are_a_poisson_process_exponential_gaps_with_the_asked_mean() -> None:
    times = arrival_times_s(50.0, 60.0, seed=3)
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    mean = statistics.fmean(gaps)
    assert abs(mean - 1 / 50) < 0.1 / 50                       # ~3000 gaps: mean within 10%
    assert 0.9 < statistics.stdev(gaps) / mean < 1.1           # exponential: coefficient of variation 1
    assert abs(len(times) - 3000) < 4 * math.sqrt(3000)


def test_poisson_counts_are_not_called_a_shortfall_but_a_real_one_is() -> None:
    assert started_enough(19, 5.0, 5.0, poisson=True)          # 25 expected, sd 5
    assert not started_enough(19, 5.0, 5.0, poisson=False)
    assert not started_enough(5, 5.0, 5.0, poisson=True)


def test_knee_rates_are_the_step_before_the_knee_and_the_knee() -> None:
    steps = [RampStep(r, 1.0, int(r), r, 0, 1.0, p95, p95) for r, p95 in ((5, 1.0), (10, 1.1), (20, 5.0))]
    knee, _, base = find_knee(steps)
    path = RampPath("direct", "u", steps, base, knee, "", 0)
    assert knee == 20 and knee_rates(path) == [10, 20]
    no_knee = RampPath("direct", "u", steps[:2], base, None, "", 0)
    assert knee_rates(no_knee) == [5, 10]


def test_k6_poisson_arrivals_send_about_the_asked_rate(asgi_url, tmp_path) -> None:  # noqa: ANN001
    cfg = BenchConfig(rate_rps=20, duration_s=3.0, scenarios=("direct",), arrivals="poisson", max_vus=50)
    result = run_bench(cfg, direct=Target("direct", asgi_url), gateway=None, k6=find_k6(), run_dir=tmp_path / "r",
                       progress=False)
    s = result.scenarios["direct"]
    assert s.arrivals == "poisson" and result.config["arrivals"] == "poisson"
    assert abs(s.requests - 60) < 4 * math.sqrt(60) and s.failures == 0


def test_poisson_ttft_times_the_first_token_from_the_scheduled_arrival(asgi_url) -> None:  # noqa: ANN001
    t = poisson_ttft(Target("direct", asgi_url), 20.0, 1.5, max_tokens=4, workers=4, seed=1)
    assert t.requests >= 10 and t.ok == t.requests and not t.errors
    assert t.ttft_p50_ms is not None and t.ttft_p95_ms is not None and 0 < t.ttft_p50_ms <= t.ttft_p95_ms
    assert t.client_wait_p95_ms is not None and t.client_wait_p95_ms >= 0


def test_the_ramp_reports_ttft_at_its_knee(asgi_url, tmp_path) -> None:  # noqa: ANN001
    cfg = RampConfig(rates=(5, 10), step_s=1.0, warmup_s=0.0, arrivals="poisson", ttft_at_knee_s=1.0)
    result = run_ramp(cfg, {"direct": Target("direct", asgi_url)}, k6=find_k6(), run_dir=tmp_path / "ramp",
                      progress=False)
    assert [t.rate_rps for t in result.ttft_at_knee] == knee_rates(result.paths[0])
    assert all(t.ttft_p50_ms is not None for t in result.ttft_at_knee)
    assert result.config["arrivals"] == "poisson" and any("TTFT at the knee" in n for n in result.notes)
