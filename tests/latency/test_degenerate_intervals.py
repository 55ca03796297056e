"""Intervals never collapse to a bound of 0.00 from a degenerate resample (issue 38 item 4): constructed sample
sets that used to give `0.00 [0.00, 0.00]` (nginx's whole-ms self-report) or `[0.00, x]` for a median far above
0 now say "within its resolution" or "no interval (...)" (pure functions, no network)."""

from __future__ import annotations

from zgtool.bootstrap import median_ci
from zgtool.latency.analysis.phases import _phase_stats
from zgtool.latency.attribution.join import WITHIN_RESOLUTION, Boot, _stat
from zgtool.latency.config import SplitConfig
from zgtool.latency.render.join import _cell
from zgtool.latency.render.split import fmt_p50, fmt_pm
from zgtool.report.sections_latency import median_ci_cell

# three rounds: one of zeros (a remainder clipped to 0 where the engine's total exceeded the client's), two
# near 1,800 ms; the small-rounds widening takes the lower bound far below 0, which used to print as 0.00
ZEROS_ROUND = [0.0] * 4 + [1780.0, 1790.0, 1800.0, 1787.85, 1795.0] + [2100.0, 2150.0, 2196.77, 2000.0]
ZEROS_GROUPS = [0] * 4 + [1] * 5 + [2] * 4


def test_a_self_report_that_is_always_0_has_no_interval_and_says_so() -> None:
    iv = median_ci([0.0] * 30)
    assert iv.lo is None and iv.hi is None and iv.note == "no interval (1 distinct value)"


def test_two_distinct_values_give_no_interval_not_bounds_on_the_values() -> None:
    iv = median_ci([0.0] * 10 + [1800.0] * 12)
    assert iv.estimate == 1800.0 and iv.lo is None and iv.note == "no interval (2 distinct values)"
    assert median_ci([1.0, 2.0, 3.0] * 5).lo is not None          # three distinct values: an interval


def test_nginx_whole_ms_self_report_is_within_its_resolution_in_the_join() -> None:
    st = _stat([0.0] * 30, list(range(30)), Boot(resamples=200))
    assert st is not None and st["lo_ms"] is None and st["note"] == WITHIN_RESOLUTION and st["resolution_ms"] == 1.0
    assert _cell(st) == "0.00 (within its 1 ms resolution)"


def test_a_latency_whose_widened_bound_went_below_0_has_no_clipped_bound() -> None:
    assert median_ci(ZEROS_ROUND, groups=ZEROS_GROUPS).lo < 0          # what used to be clipped to 0.00
    cfg = SplitConfig(resamples=500)
    p = _phase_stats("network_client_ms", ZEROS_ROUND, ZEROS_GROUPS, len(ZEROS_ROUND), None, cfg)
    assert p.median_lo is None and p.median_hi is None
    assert p.ci_note == "no interval (widened below 0; 4 of 13 are 0)"
    assert fmt_p50(p) == "1790.00 (no interval (widened below 0; 4 of 13 are 0))"
    assert "0.00," not in fmt_p50(p)
    assert median_ci_cell({"count": 13, "of": 13, "ci_note": p.ci_note})[0] == p.ci_note
    st = _stat(ZEROS_ROUND, ZEROS_GROUPS, Boot(resamples=500))
    assert st is not None and st["lo_ms"] is None and st["note"].startswith("no interval (widened below 0")


def test_a_latency_above_0_keeps_a_positive_interval_in_the_join() -> None:
    vals = [1780.0 + 7 * (i % 9) for i in range(27)]
    st = _stat(vals, [i % 3 for i in range(27)], Boot(resamples=500))
    assert st is not None and 0 < st["lo_ms"] <= st["median_ms"] <= st["hi_ms"] and "note" not in st


def test_a_remainders_negative_bound_is_shown_not_clipped() -> None:
    from zgtool.latency.records import PhaseStats

    rest = PhaseStats("network_client_ms", 30, {"p50": 1787.85}, -312.4, 2196.77, None, "linear", 30)
    assert fmt_p50(rest) == "1787.85 [-312, 2197]"
    assert fmt_pm(5.0, -3.0, 12.0) == "5.00 [0.0, 12.0]"          # a latency's (never below 0 by its drawing)


def test_a_difference_of_a_phase_that_is_0_on_both_paths_has_no_interval() -> None:
    from zgtool.bootstrap import median_difference
    from zgtool.latency.analysis.phases import analyse
    from zgtool.latency.records import RequestSample
    from zgtool.latency.render.split import fmt_diff
    from zgtool.targets import Target

    d = median_difference([0.0] * 16, [0.0] * 16)
    assert d.interval.lo is None and d.interval.note == "no interval (1 distinct value)"
    assert median_difference([0.0] * 16, [0.01 * (i % 4) for i in range(16)]).interval.lo is not None

    def path(extra: float) -> list[RequestSample]:
        return [RequestSample(index=i, worker=0, round=i % 4, ok=True, total_ms=1.0 + extra + 0.01 * (i % 5),
                              server_timing={"prefill": 0.0, "total": 0.5}) for i in range(16)]

    targets = [Target("a", "http://127.0.0.1:1"), Target("b", "http://127.0.0.1:2")]
    res = analyse(targets, [path(0.0), path(0.2)], SplitConfig(num_requests=16, stream=False, resamples=200))
    pre = next(x for x in res.differences if x.phase == "prefill_ms")
    assert pre.lo_ms is None and pre.note == "no interval (1 distinct value)"
    assert fmt_diff(pre).plain == "+0.00 (no CI: 1 value)"
    total = next(x for x in res.differences if x.phase == "total_ms")
    assert total.lo_ms is not None and total.note is None
