"""A latency_sweep result in the HTML report and the terminal: charts of latency and rate against
the offered load, the knee per path and the capacity tax (zgtool.report.sections_sweep,
zgtool.latency.render.sweep), from a sweep built on synthetic per-point figures."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from zgtool.latency.analysis.saturation import RATE
from zgtool.latency.render.sweep import render
from zgtool.latency.schedule.sweep import PointSummary, SweepResult, judge, knee_rule, result_data
from zgtool.report.html import render_files
from zgtool.report.load import collect
from zgtool.report.sections_sweep import sweep_section
from zgtool.results import make_result, write_result


def _point(target: str, load: float, capacity: float) -> PointSummary:
    keeps_up = load <= capacity
    p99 = 20.0 if keeps_up else 400.0
    return PointSummary(target=target, load=load, num_ok=40, num_error=0, errors={},
                        achieved_rps=load if keeps_up else capacity, offered_rps=load, goodput_rps=load * 0.9,
                        duration_s=40 / load, ttft_ms={"count": 40, "p50": p99 / 2, "p99": p99},
                        itl_ms={"count": 400, "p50": 1.0, "p99": 3.0}, e2e_ms={"count": 40, "p50": 50, "p99": p99 + 30},
                        sent_rps=load, ttft_from_due_ms={"count": 40, "p50": p99 / 2, "p99": p99},
                        e2e_from_due_ms={"count": 40, "p50": 50, "p99": p99 + 30})


def synthetic_sweep() -> SweepResult:
    res = SweepResult(kind=RATE, unit="req/s", targets=["direct", "nginx"], rule=knee_rule(RATE, True),
                      config={"num_requests": 40})
    for load in (1, 2, 4, 8, 16):
        res.points += [_point("direct", load, 8), _point("nginx", load, 4)]
    judge(res, stream=True)
    return res


def test_the_sweep_judges_each_path_and_the_gateways_capacity_tax() -> None:
    res = synthetic_sweep()
    assert (res.saturation["direct"].knee, res.saturation["nginx"].knee) == (8, 4)
    [tax] = res.capacity_tax
    assert tax.text == ("knee at 8 req/s direct vs 4 req/s nginx: capacity tax 50%; peak answered 4 vs 8 req/s: "
                        "50% less")
    assert (tax.baseline_peak_rps, tax.candidate_peak_rps, tax.peak_tax_pct) == (8, 4, 50.0)


def test_the_terminal_shows_one_row_per_path_and_load_with_the_knee_marked() -> None:
    buf = io.StringIO()
    render(synthetic_sweep(), Console(file=buf, width=120, no_color=True), stream=True, slo=True)
    text = buf.getvalue()
    rows = [ln for ln in text.splitlines() if ln.split()[:1] in (["direct"], ["nginx"])]
    assert len(rows) == 10
    assert any(ln.split()[:2] == ["direct", "8"] and ln.rstrip().endswith("knee") for ln in rows)
    assert any(ln.split()[:2] == ["nginx", "8"] and ln.rstrip().endswith("saturated") for ln in rows)
    flat = " ".join(text.split())
    assert "TTFT p99 (counted from each request's due time) > 3x its value at low load" in flat
    assert "capacity tax 50%" in text


def test_the_report_draws_latency_and_rate_against_load(tmp_path: Path) -> None:
    res = synthetic_sweep()
    result = make_result("latency_sweep", result_data(res), command="zgtool latency-split --rate 1,2,4,8,16")
    f = write_result(result, tmp_path / "sweep.json")
    json.loads(f.read_text())                              # plain JSON, nothing unserialisable
    sec = sweep_section(collect([f]))
    assert sec.missing is None
    assert sec.body.count("<h3>") == 4 and "<svg" in sec.body      # TTFT, E2E, ITL, req/s charts
    assert "knee at 8 req/s direct vs 4 req/s nginx: capacity tax 50%" in sec.body
    assert sec.body.count("<tr>") == 1 + 10                # header + one row per (path, load)
    assert "offered load, req/s" in sec.body and "Knee rule: saturated at the first load" in sec.body
    page = render_files([f])
    assert 'id="sweep"' in page and "capacity tax 50%" in page


def test_a_report_without_a_sweep_says_so(tmp_path: Path) -> None:
    f = write_result(make_result("probe.tcp", {"x": 1}), tmp_path / "probe.json")
    sec = sweep_section(collect([f]))
    assert sec.missing is not None and "--rate sweep" in sec.missing


def test_a_gate_reads_the_knee_and_the_capacity_tax(tmp_path: Path) -> None:
    from zgtest import run_zgtool

    f = write_result(make_result("latency_sweep", result_data(synthetic_sweep())), tmp_path / "sweep.json")
    policy = tmp_path / "gates.toml"
    policy.write_text('[[rule]]\nkind = "latency_sweep"\ncheck = "knee.direct >= 8"\n\n'
                      '[[rule]]\nkind = "latency_sweep"\ncheck = "capacity_tax_pct.nginx < 30"\n')
    r = run_zgtool("gate", "--policy", policy, f, "--json")
    assert r.returncode == 1, r.stderr           # the knee holds; a 50% capacity tax breaches the 30% gate
    rows = json.loads(r.stdout)["data"]["rows"]
    assert [row["status"] for row in rows] == ["pass", "fail"]
    assert rows[1]["values"][0] == 50.0
