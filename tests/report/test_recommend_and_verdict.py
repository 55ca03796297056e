"""Recommendations and the verdict are computed from the data: thresholds in code, figures quoted."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from zgtool.report import recommend
from zgtool.report.load import ResultSet, collect
from zgtool.report.verdict import taxes, verdict


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


def test_a_cache_below_the_threshold_is_called_a_pure_cost_with_its_figures(run: ResultSet) -> None:
    rs = with_cache(run, hits=1, answers=10)
    rec = next(r for r in recommend.recommendations(rs) if "cache" in r.title)
    assert rec.severity == "act" and "10%" in rec.title and "1 of 10" in rec.detail
    assert rec.figures["hit_rate"] == pytest.approx(0.1)


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
    assert rec.severity == "act" and f"{above:+.2f} ms" in rec.title
    assert f"({recommend.TAX_PCT_MAX + 5:+.1f}%)" in rec.title


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
