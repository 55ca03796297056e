"""The verdict's words follow its statistics (issue 25): the first token leads on a stream, engine
jitter is never the path, chance negatives are noise, an empty result says what it could have seen."""

from __future__ import annotations

import re

from report_build import diff, split

from zgtool.report.verdict import describe, taxes, verdict


def test_a_significant_ttft_and_ttfb_tax_leads_the_headline_even_when_the_total_is_not() -> None:
    # the audit's hop: +80.8 ms TTFB and +35.9 ms TTFT, both significant; dummy:small stream c=1, n=30
    r = split([diff("ttfb_ms", 80.8, 60.2, 101.0), diff("ttft_ms", 35.9, 12.4, 58.0),
               diff("total_ms", 30.1, -12.0, 71.0), diff("outside_engine_ms", 1.1, -3.0, 6.0)], stream=True)
    v = verdict([r])
    assert v is not None and v.lead == "first_token"
    assert v.headline.startswith("stack adds 35.9 ms to the first token (TTFT, 95% CI [+12.4, +58.0] ms)")
    assert "adds 80.8 ms to the first byte (TTFB, 95% CI [+60.2, +101.0] ms)" in v.headline
    assert "No significant difference" not in v.headline and "every interval contains 0" not in v.headline


def test_engine_decode_running_faster_is_engine_jitter_not_a_faster_path() -> None:
    # behind a 30 ms hold: TTFB +30.4 (significant), the engine's decode happened to run 27.6 ms faster
    r = split([diff("ttfb_ms", 30.4, 28.0, 33.0), diff("ttft_ms", 30.2, 27.5, 33.1),
               diff("total_ms", -27.8, -40.1, -15.2), diff("decode_ms", -27.6, -39.0, -16.0),
               diff("outside_engine_ms", 0.4, -1.0, 1.9)], stream=True)
    v = verdict([r])
    assert v is not None
    assert "faster by" not in v.headline and "faster by" not in describe(v.rows[0])
    assert v.headline.startswith("stack adds 30.2 ms to the first token")
    assert "total -27.8 ms (95% CI [-40.1, -15.2] ms) at stream c=1, all of it engine decode (engine jitter), " \
           "not the path" in v.headline


def test_a_total_explained_by_the_engine_at_c8_is_never_the_path_being_slower() -> None:
    # two identical paths at c=8: the total moved 305 ms, all of it inside the engine
    r = split([diff("total_ms", 305.0, 120.0, 480.0), diff("outside_engine_ms", 2.0, -9.0, 14.0),
               diff("decode_ms", 300.0, 110.0, 470.0)], concurrency=8, direct_ms=900.0)
    v = verdict([r])
    assert v is not None
    assert "slower by" not in v.headline and "engine jitter" in v.headline and "not the path" in v.headline
    assert v.headline.startswith("No significant difference")


def test_identical_paths_at_c8_say_no_significant_difference_and_the_smallest_detectable_effect() -> None:
    rows = [split([diff("total_ms", 3.0, -20.0, 26.0), diff("outside_engine_ms", -1.0, -22.0, 21.0)],
                  concurrency=8),
            split([diff("total_ms", 0.1, -1.0, 1.2), diff("outside_engine_ms", 0.05, -0.9, 1.0)])]
    v = verdict(rows)
    assert v is not None and v.lead == "none"
    assert v.headline.startswith("No significant difference in total latency or outside the engine in 2 "
                                 "configurations")
    m = re.search(r"smallest difference outside the engine this run could have detected is about ([\d.]+) ms at "
                  r"non-stream c=1 and ([\d.]+) ms at non-stream c=8", v.headline)
    assert m, v.headline
    # conservative: 80% power at the 95% level, from the interval's wider half
    assert float(m.group(2)) == round(1.43 * 22.0, 1) or abs(float(m.group(2)) - 1.4286 * 22.0) < 0.1
    assert "little power at high concurrency" in v.headline


def test_the_result_s_own_mde_is_used_when_present() -> None:
    r = split([diff("total_ms", 3.0, -20.0, 26.0), diff("outside_engine_ms", -1.0, -22.0, 21.0, mde_ms=17.25)],
              concurrency=8)
    v = verdict([r])
    assert v is not None and "detected is about 17.2 ms" in v.headline


def test_a_chance_negative_outside_engine_difference_is_noise_not_missing_server_timing() -> None:
    r = split([diff("total_ms", -1.0, -2.5, 0.4), diff("outside_engine_ms", -1.03, -1.9, -0.2)])
    v = verdict([r])
    assert v is not None
    assert "Server-Timing" not in v.headline and "not attributed" not in v.headline
    assert "a difference within noise" in v.headline and "-1.03 ms" in v.headline
    assert v.headline.startswith("No significant cost")


def test_the_note_of_a_dropped_chance_negative_is_read_back_as_noise() -> None:
    note = ("stack: time outside the engine came out 1.03 ms below direct's (95% CI -1.90..-0.20 ms), which no "
            "hop can do: the attribution is missing (a renamed, stale or foreign Server-Timing total), not a saving")
    r = split([diff("total_ms", -1.0, -2.5, 0.4),
               {**diff("outside_engine_ms", 0, 0, 0), "diff_ms": None, "lo_ms": None, "hi_ms": None}], notes=[note])
    (row,) = taxes(r)
    assert not row.attribution_missing and row.outside_engine is not None
    assert row.outside_engine.diff_ms == -1.03
    v = verdict([r])
    assert v is not None and "within noise" in v.headline and "did not reach" not in v.headline


def test_server_timing_truly_absent_is_still_called_not_attributed() -> None:
    note = ("stack: no engine timing reached the client (no adapter applied: the path drops or renames it), so "
            "its time outside the engine is not attributed")
    r = split([diff("total_ms", 1.0, -2.5, 4.4)], engine=(True, False), notes=[note])
    v = verdict([r])
    assert v is not None and "not attributed" in v.headline


def test_without_the_engine_s_time_the_rest_is_unattributed_never_network() -> None:
    r = split([diff("total_ms", 117.0, 90.0, 140.0), diff("network_client_ms", 679.0, 600.0, 750.0)],
              engine=(True, False), direct_ms=400.0)
    (row,) = taxes(r)
    assert row.engine_unknown
    text = describe(row)
    assert "network" not in text
    from zgtool.report.verdict import gateway_phases, phase_label

    assert phase_label("network_client_ms", row.engine_unknown).startswith("unattributed")
    assert gateway_phases(row) == []


def test_a_negligible_effect_is_named_negligible_with_its_threshold() -> None:
    r = split([diff("total_ms", 0.01, -0.2, 0.3),
               diff("outside_engine_ms", 0.02, 0.01, 0.03, negligible=True, min_effect_ms=0.5)])
    v = verdict([r])
    assert v is not None and v.lead == "none"
    assert v.headline.startswith("No material difference") and "negligible (< 0.50 ms)" in v.headline


def test_the_headline_names_the_configuration_it_picked_why_and_the_range() -> None:
    rows = [split([diff("total_ms", 4.0, -5.0, 12.0), diff("outside_engine_ms", oe, lo, hi)], concurrency=c,
                  stream=s)
            for c, s, oe, lo, hi in ((1, False, 3.6, -0.5, 7.0), (8, False, 21.1, 12.0, 30.0),
                                     (1, True, 13.3, 5.0, 20.0), (8, True, 9.0, 2.0, 16.0))]
    v = verdict(rows)
    assert v is not None and v.lead == "outside_engine"
    assert v.headline.startswith("stack adds 21.1 ms")
    assert "at non-stream c=8" in v.headline
    assert "(largest of 3 significant; outside the engine +3.60 to +21.1 ms across the 4 configurations)" in v.headline
    # no family adjustment in these results: the headline says so
    assert "not adjusted for the 4 configurations" in v.headline


def test_with_several_configurations_the_family_adjusted_interval_decides() -> None:
    adj_out = {"significant_adj": False, "lo_adj": -1.0, "hi_adj": 9.0, "comparisons": 2}
    rows = [split([diff("total_ms", 1.0, -5.0, 7.0), diff("outside_engine_ms", 4.0, 0.5, 7.5, **adj_out)]),
            split([diff("total_ms", 1.0, -5.0, 7.0),
                   diff("outside_engine_ms", 0.2, -3.0, 3.0, significant_adj=False, lo_adj=-5.0, hi_adj=5.0,
                        comparisons=2)],
                  concurrency=8)]
    v = verdict(rows)
    assert v is not None and v.lead == "none" and v.family_adjusted
    assert v.headline.startswith("No significant difference")
    rows[0]["data"]["differences"][1].update(significant_adj=True, lo_adj=0.2, hi_adj=7.9)
    v = verdict(rows)
    assert v is not None and v.lead == "outside_engine"
    assert "family-adjusted 95% CI [+0.20, +7.90] ms" in v.headline and "not adjusted" not in v.headline
    # an adjustment over fewer comparisons than the configurations compared (separate runs) does not count
    for r in rows:
        r["data"]["differences"][1]["comparisons"] = 1
    v = verdict(rows)
    assert v is not None and not v.family_adjusted and "not adjusted for the 2 configurations" in v.headline


def test_intervals_are_printed_as_bounds_never_plus_minus() -> None:
    r = split([diff("total_ms", 36.33, 10.7, 92.4), diff("outside_engine_ms", 20.0, 5.0, 40.0)])
    v = verdict([r])
    assert v is not None
    text = v.headline + describe(v.rows[0])
    assert "±" not in text and "[+5.0, +40.0]" in text and "[+10.7, +92.4]" in text


# --- recommendations follow the same rules (issue 25) ----------------------------------------------

def _recs(*results: dict) -> list:
    from pathlib import Path

    from zgtool.report import recommend
    from zgtool.report.load import ResultSet

    return recommend.recommendations(ResultSet(results=[(Path(f"r{i}.json"), r) for i, r in enumerate(results)]))


def test_no_act_item_for_a_cost_of_0_002_ms_however_large_its_share() -> None:
    recs = _recs(split([diff("total_ms", 0.002, 0.001, 0.003), diff("outside_engine_ms", 0.002, 0.001, 0.003)],
                       direct_ms=0.01))
    assert not [r for r in recs if r.severity == "act"]


def test_no_act_item_for_a_negligible_or_family_insignificant_tax() -> None:
    negligible = split([diff("total_ms", 30.0, 20.0, 40.0),
                        diff("outside_engine_ms", 25.0, 20.0, 30.0, negligible=True, min_effect_ms=30.0)])
    assert not [r for r in _recs(negligible) if r.severity == "act"]
    one = split([diff("total_ms", 30.0, 20.0, 40.0),
                 diff("outside_engine_ms", 25.0, 2.0, 48.0, significant_adj=False, lo_adj=-3.0, hi_adj=53.0,
                      comparisons=2)])
    two = split([diff("total_ms", 1.0, -2.0, 4.0), diff("outside_engine_ms", 0.1, -1.0, 1.2, significant_adj=False,
                                                     lo_adj=-2.0, hi_adj=2.2, comparisons=2)],
                concurrency=8)
    assert not [r for r in _recs(one, two) if r.severity == "act"]
    one["data"]["differences"][1]["significant_adj"] = True
    assert [r for r in _recs(one, two) if r.severity == "act"]


def test_no_act_item_for_a_total_the_engine_explains() -> None:
    r = split([diff("total_ms", 305.0, 120.0, 480.0), diff("decode_ms", 300.0, 110.0, 470.0)], engine=(True, True))
    assert not [x for x in _recs(r) if x.severity == "act"]


def test_no_growth_with_concurrency_built_on_a_figure_that_was_not_significant() -> None:
    # the case: 3.60 ms at c=1 (interval contains 0) -> 21.11 ms at c=8
    c1 = split([diff("total_ms", 4.0, -5.0, 12.0), diff("outside_engine_ms", 3.6, -0.5, 7.7)])
    c8 = split([diff("total_ms", 30.0, 10.0, 50.0), diff("outside_engine_ms", 21.11, 15.0, 27.0)], concurrency=8)
    assert not [r for r in _recs(c1, c8) if "grows with concurrency" in r.title]
    c1["data"]["differences"][1].update(diff_ms=3.6, lo_ms=2.0, hi_ms=5.2, verdict="higher")
    grows = [r for r in _recs(c1, c8) if "grows with concurrency" in r.title]
    assert grows and "[+2.00, +5.20]" in grows[0].detail


def test_a_first_token_that_came_sooner_is_no_cost_and_not_called_no_difference() -> None:
    r = split([diff("ttft_ms", -5.0, -8.0, -2.0), diff("total_ms", 1.0, -2.0, 4.0),
               diff("outside_engine_ms", 0.5, -1.0, 2.0)], stream=True)
    v = verdict([r])
    assert v is not None and v.headline.startswith("No significant cost")
    assert "reaches the first token 5.00 ms sooner (TTFT, 95% CI [-8.00, -2.00] ms)" in describe(v.rows[0])
