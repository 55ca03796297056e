"""The knee rule and the capacity tax on synthetic curves (zgtool.latency.analysis.saturation)."""

from __future__ import annotations

import pytest

from zgtool.latency.analysis.saturation import (
    CONCURRENCY,
    RATE,
    CurvePoint,
    KneeRule,
    capacity_tax,
    detect,
    with_peaks,
)

RATE_RULE = KneeRule(kind=RATE)
CONC_RULE = KneeRule(kind=CONCURRENCY)


def rate_curve(capacity_rps: float, loads: tuple[float, ...] = (1, 2, 4, 8, 16),
               base_p99_ms: float = 20.0) -> list[CurvePoint]:
    """A server of fixed capacity: keeps up below it (flat latency), queues above it."""
    out = []
    for r in loads:
        if r <= capacity_rps:
            out.append(CurvePoint(r, r, base_p99_ms))
        else:
            out.append(CurvePoint(r, capacity_rps, base_p99_ms * 20))
    return out


def test_a_curve_that_keeps_up_everywhere_has_no_knee() -> None:
    s = detect(rate_curve(100), RATE_RULE)
    assert s.knee is None and s.saturated_at is None and s.reason is None
    assert s.max_load == 16 and "not saturated up to 16" in s.describe("req/s")


@pytest.mark.parametrize(("capacity", "knee", "saturated_at"), [(1, 1, 2), (2, 2, 4), (4, 4, 8), (8, 8, 16)])
def test_the_knee_is_the_last_load_the_path_kept_up_with(capacity: float, knee: float, saturated_at: float) -> None:
    s = detect(rate_curve(capacity), RATE_RULE)
    assert (s.knee, s.saturated_at) == (knee, saturated_at)
    assert "answered" in (s.reason or "")


def test_points_are_judged_in_load_order() -> None:
    s = detect(list(reversed(rate_curve(4))), RATE_RULE)
    assert (s.knee, s.saturated_at) == (4, 8)


def test_a_miss_that_a_higher_load_contradicts_is_noise_not_the_knee() -> None:
    # 2 req/s: one slow block (p99 4x); 4 and 8 req/s kept up with flat latency; 16 did not
    pts = rate_curve(8)
    pts[1] = CurvePoint(2, 2.0, 80.0)
    s = detect(pts, RATE_RULE)
    assert (s.knee, s.saturated_at) == (8, 16)
    # closed loop: a dip at 2 streams, then 4 and 8 streams scale again: no knee up to 8
    dip = [CurvePoint(1, 2.6, 30.0), CurvePoint(2, 3.0, 40.0), CurvePoint(4, 5.4, 45.0), CurvePoint(8, 14.5, 50.0)]
    assert detect(dip, CONC_RULE).saturated_at is None


def test_noise_within_the_shortfall_and_the_latency_factor_is_not_saturation() -> None:
    # achieved 5-9% short of offered, p99 jittering up to 2.5x the lowest load's
    pts = [CurvePoint(1, 0.95, 20.0), CurvePoint(2, 1.82, 44.0), CurvePoint(4, 3.71, 31.0),
           CurvePoint(8, 7.6, 50.0), CurvePoint(16, 9.0, 400.0)]
    s = detect(pts, RATE_RULE)
    assert (s.knee, s.saturated_at) == (8, 16)


def test_tail_latency_past_the_factor_saturates_even_when_the_rate_keeps_up() -> None:
    pts = [CurvePoint(1, 1, 10.0), CurvePoint(2, 2, 12.0), CurvePoint(4, 4, 31.0), CurvePoint(8, 8, 90.0)]
    s = detect(pts, RATE_RULE)
    assert (s.knee, s.saturated_at) == (2, 4)
    assert "TTFT p99 31 ms > 3x 10 ms" in (s.reason or "")
    e2e = detect(pts, KneeRule(kind=RATE, latency_factor=10, latency_metric="E2E"))
    assert e2e.saturated_at is None


def test_one_slow_block_at_the_lowest_load_does_not_blind_the_latency_rule() -> None:
    pts = [CurvePoint(1, 1, 900.0), CurvePoint(2, 2, 12.0), CurvePoint(4, 4, 14.0), CurvePoint(8, 8, 95.0)]
    s = detect(pts, RATE_RULE)
    assert (s.knee, s.saturated_at) == (4, 8) and "> 3x 12 ms at low load" in (s.reason or "")


def test_saturated_at_the_lowest_load_has_no_knee() -> None:
    s = detect([CurvePoint(4, 2.0, 10.0), CurvePoint(8, 2.0, 10.0)], RATE_RULE)
    assert s.knee is None and s.saturated_at == 4
    assert "lowest load" in s.describe("req/s")


def test_a_rate_point_is_judged_against_the_schedule_actually_drawn() -> None:
    # a Poisson draw for 8 req/s came out at 7.2 req/s: answering 6.9 of them is keeping up
    pts = [CurvePoint(4, 4.0, 10.0), CurvePoint(8, 6.9, 11.0, offered_rps=7.2)]
    assert detect(pts, RATE_RULE).saturated_at is None
    short = [CurvePoint(4, 4.0, 10.0), CurvePoint(8, 6.4, 11.0, offered_rps=7.2)]
    s = detect(short, RATE_RULE)
    assert s.saturated_at == 8 and "< 90% of 7.2 offered" in (s.reason or "")


def test_a_point_where_nothing_was_answered_is_saturated() -> None:
    s = detect([CurvePoint(1, 1, 5.0), CurvePoint(2, None, None)], RATE_RULE)
    assert (s.knee, s.saturated_at, s.reason) == (1, 2, "no request answered")


def test_concurrency_knee_is_where_more_streams_stop_adding_throughput() -> None:
    # 1 stream: 100 req/s; scales to 4 streams, then flat at ~380 req/s (latency grows instead)
    pts = [CurvePoint(1, 100, 12.0), CurvePoint(2, 195, 13.0), CurvePoint(4, 370, 14.0),
           CurvePoint(8, 385, 25.0), CurvePoint(16, 390, 30.0)]
    s = detect(pts, CONC_RULE)
    assert (s.knee, s.saturated_at) == (4, 8)
    assert "4 -> 8 streams" in (s.reason or "")


def test_concurrency_noise_in_throughput_does_not_make_a_knee() -> None:
    pts = [CurvePoint(1, 100, 12.0), CurvePoint(2, 180, 14.0), CurvePoint(4, 390, 15.0), CurvePoint(8, 700, 20.0)]
    assert detect(pts, CONC_RULE).saturated_at is None


def test_the_rule_is_stated_with_its_numbers() -> None:
    assert "answers/s < 90% of the offered rate" in RATE_RULE.describe()
    assert "TTFT p99 (counted from each request's due time) > 3x" in RATE_RULE.describe()
    assert "and at every higher load measured" in RATE_RULE.describe()
    assert "TTFT p99 > 3x" in KneeRule(kind=CONCURRENCY).describe()
    assert "50% of the throughput" in CONC_RULE.describe()
    assert CONC_RULE.public()["text"] == CONC_RULE.describe()
    with pytest.raises(ValueError):
        KneeRule(kind="burst")


def test_capacity_tax_between_two_knees() -> None:
    base, gw = detect(rate_curve(8), RATE_RULE), detect(rate_curve(4), RATE_RULE)
    t = capacity_tax("direct", base, "nginx", gw, "req/s")
    assert (t.baseline_knee, t.candidate_knee, t.bound) == (8, 4, "exact")
    assert t.tax_pct == pytest.approx(50.0)
    assert t.text == "knee at 8 req/s direct vs 4 req/s nginx: capacity tax 50%"
    same = capacity_tax("direct", base, "pygw", base, "req/s")
    assert same.tax_pct == pytest.approx(0.0) and same.bound == "exact"
    quarter = capacity_tax("direct", base, "slow", detect(rate_curve(2), RATE_RULE), "req/s")
    assert quarter.tax_pct == pytest.approx(75.0)
    cached = capacity_tax("direct", detect(rate_curve(4), RATE_RULE), "pygw", base, "req/s")
    assert cached.tax_pct == pytest.approx(-100.0) and "pygw held more than direct: a cache" in cached.text


def test_capacity_tax_is_a_bound_when_one_side_never_saturated() -> None:
    base_unsat = detect(rate_curve(100), RATE_RULE)             # held 16
    gw = detect(rate_curve(4), RATE_RULE)
    t = capacity_tax("direct", base_unsat, "gw", gw, "req/s")
    assert t.bound == "at least" and t.tax_pct == pytest.approx(75.0)
    assert "at least 75%" in t.text

    base = detect(rate_curve(8), RATE_RULE)
    short = detect(rate_curve(100, loads=(1, 2)), RATE_RULE)    # held 2 and was not pushed further
    t = capacity_tax("direct", base, "gw", short, "req/s")
    assert t.bound == "at most" and t.tax_pct == pytest.approx(75.0)
    past = capacity_tax("direct", base, "gw", base_unsat, "req/s")
    assert past.bound == "at most" and past.tax_pct == 0.0 and "no capacity tax" in past.text


def test_capacity_tax_when_the_gateway_saturates_at_the_lowest_load() -> None:
    base = detect(rate_curve(8), RATE_RULE)
    gw = detect(rate_curve(0.5), RATE_RULE)
    t = capacity_tax("direct", base, "gw", gw, "req/s")
    assert t.bound == "at least" and t.tax_pct == pytest.approx(87.5) and "more than 88%" in t.text


def test_no_capacity_tax_without_a_knee_on_either_side() -> None:
    never = detect(rate_curve(100), RATE_RULE)
    t = capacity_tax("direct", never, "gw", never, "req/s")
    assert t.tax_pct is None and t.bound is None and "neither saturated" in t.text
    base_low = detect(rate_curve(0.5), RATE_RULE)
    t = capacity_tax("direct", base_low, "gw", detect(rate_curve(4), RATE_RULE), "req/s")
    assert t.tax_pct is None and "no capacity tax" in t.text


def test_the_peak_answered_rate_resolves_a_tax_finer_than_the_load_grid() -> None:
    # both knees at 16 on a doubling grid; saturated, direct answered 30 req/s and nginx 24
    base, gw = detect(rate_curve(30, loads=(8, 16, 32, 64)), RATE_RULE), detect(rate_curve(24, loads=(8, 16, 32, 64)), RATE_RULE)
    t = with_peaks(capacity_tax("direct", base, "nginx", gw, "req/s"), base, gw, 30.0, 24.0)
    assert t.tax_pct == pytest.approx(0.0) and t.peak_tax_pct == pytest.approx(20.0)
    assert t.text.endswith("capacity tax 0%; peak answered 24 vs 30 req/s: 20% less")
    # a path never driven past its knee: its peak is only a lower bound on its capacity
    never = detect(rate_curve(100, loads=(8, 16, 32, 64)), RATE_RULE)
    u = with_peaks(capacity_tax("direct", never, "nginx", gw, "req/s"), never, gw, 32.0, 24.0)
    assert u.peak_tax_pct == pytest.approx(25.0) and u.baseline_peak_rps == 32.0
    assert "at least 25% less (direct was not driven to its service rate)" in u.text
    neither = with_peaks(capacity_tax("direct", never, "nginx", never, "req/s"), never, never, 32.0, 31.0)
    assert neither.peak_tax_pct is None and "peak" not in neither.text


def test_a_knee_seen_only_in_the_tail_latency_leaves_the_peak_a_lower_bound() -> None:
    base = detect(rate_curve(30, loads=(8, 16, 32, 64)), RATE_RULE)
    assert base.capacity_seen
    tail = detect([CurvePoint(8, 8, 10.0), CurvePoint(16, 15.8, 50.0)], RATE_RULE)    # kept up, p99 5x
    assert tail.saturated_at == 16 and not tail.capacity_seen
    t = with_peaks(capacity_tax("direct", base, "pygw", tail, "req/s"), base, tail, 30.0, 15.8)
    assert t.peak_tax_pct == pytest.approx(100 * (1 - 15.8 / 30))
    assert "at most 47% less (pygw was not driven to its service rate)" in t.text
