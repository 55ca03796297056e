"""A sweep does not overclaim (issue 33 item 6): a knee or capacity tax read from load points with fewer
than MIN_POINT_REQUESTS answers is stated as indicative, first on stdout; the HTML's recommendations agree
with the headline; every load point is labelled on the charts' x axis."""

from __future__ import annotations

import io
import re
from pathlib import Path

from rich.console import Console

from zgtool.latency.analysis.saturation import CONCURRENCY, MIN_POINT_REQUESTS
from zgtool.latency.render.sweep import render
from zgtool.latency.schedule.sweep import PointSummary, SweepResult, judge, knee_rule, result_data
from zgtool.report.html import render_files
from zgtool.report.load import collect
from zgtool.report.sections_other import recommendations_section
from zgtool.report.sections_sweep import sweep_section
from zgtool.results import make_result, write_result

LOADS = (1, 2, 4, 8, 16)


def _point(target: str, streams: int, capacity_rps: float, n: int) -> PointSummary:
    rps = min(streams * 10.0, capacity_rps)      # 100 ms per answer until the path's capacity
    e2e = {"count": n, "p50": 100.0 * streams * 10.0 / rps, "p99": 120.0 * streams * 10.0 / rps}
    return PointSummary(target=target, load=streams, num_ok=n, num_error=0, errors={}, achieved_rps=rps,
                        offered_rps=None, goodput_rps=None, duration_s=n / rps, ttft_ms={}, itl_ms={}, e2e_ms=e2e)


def sweep(n: int, targets: tuple[str, ...] = ("direct", "nginx")) -> SweepResult:
    res = SweepResult(kind=CONCURRENCY, unit="streams", targets=list(targets), rule=knee_rule(CONCURRENCY, False),
                      config={"num_requests": n})
    for load in LOADS:
        res.points += [_point(name, load, capacity, n) for name, capacity in zip(targets, (80.0, 40.0), strict=False)]
    judge(res, stream=False)
    return res


def _stdout(res: SweepResult) -> str:
    buf = io.StringIO()
    render(res, Console(file=buf, width=80, no_color=True), stream=False, slo=False)
    return buf.getvalue()


def test_a_capacity_tax_from_thin_load_points_is_indicative_on_the_first_line() -> None:
    res = sweep(8)
    [tax] = res.capacity_tax
    assert tax.indicative and tax.tax_pct == 50.0
    first = _stdout(res).splitlines()[0]
    assert first.startswith(f"indicative: 8 answered requests at a load point, a firm statement needs "
                            f"{MIN_POINT_REQUESTS}")
    assert "knee at 8 streams direct vs 4 streams nginx: capacity tax 50%" in first
    data = result_data(res)
    assert data["indicative"] == {"direct": True, "nginx": True} and data["min_point_requests"] == MIN_POINT_REQUESTS
    assert data["fewest_ok_per_point"] == {"direct": 8, "nginx": 8}


def test_enough_requests_per_point_states_the_tax_firmly_first() -> None:
    res = sweep(MIN_POINT_REQUESTS)
    [tax] = res.capacity_tax
    assert not tax.indicative
    out = _stdout(res)
    assert out.splitlines()[0] == ("knee at 8 streams direct vs 4 streams nginx: capacity tax 50%; peak answered 40 "
                                   "vs 80 req/s: 50% less")
    assert "indicative" not in out


def test_one_path_sweep_says_its_knee_first_and_whether_it_is_indicative() -> None:
    thin, firm = sweep(4, ("direct",)), sweep(MIN_POINT_REQUESTS, ("direct",))
    assert _stdout(thin).splitlines()[0] == (f"indicative: 4 answered requests at a load point, a firm statement "
                                             f"needs {MIN_POINT_REQUESTS} (-n {MIN_POINT_REQUESTS}); direct: knee at "
                                             "8 streams; saturated at 16 streams (8 -> 16 streams: 80 -> 80 req/s, "
                                             "0% of the proportional gain)")
    assert _stdout(firm).splitlines()[0].startswith("direct: knee at 8 streams")


def test_points_past_saturation_do_not_make_a_statement_indicative() -> None:
    res = sweep(MIN_POINT_REQUESTS)
    res.points = [p if p.load <= 8 or p.target == "direct" else
                  PointSummary(**{**p.__dict__, "num_ok": 2}) for p in res.points]
    judge(res, stream=False)
    assert res.fewest_ok["nginx"] == MIN_POINT_REQUESTS and not res.capacity_tax[0].indicative


def _page_files(tmp_path: Path, n: int) -> list[Path]:
    return [write_result(make_result("latency_sweep", result_data(sweep(n))), tmp_path / "sweep.json")]


def test_the_reports_recommendations_agree_with_a_firm_capacity_tax(tmp_path: Path) -> None:
    sec = recommendations_section(collect(_page_files(tmp_path, MIN_POINT_REQUESTS)))
    assert "Nothing to act on" not in sec.body
    assert "nginx saturates earlier than direct" in sec.body and "capacity tax 50%" in sec.body
    assert ">act<" in sec.body


def test_the_reports_recommendations_ask_to_remeasure_an_indicative_tax(tmp_path: Path) -> None:
    files = _page_files(tmp_path, 8)
    sec = recommendations_section(collect(files))
    assert "Nothing to act on" not in sec.body
    assert "re-measure" in sec.body and f"-n {MIN_POINT_REQUESTS} or more per load point" in sec.body
    page = render_files(files)
    assert "indicative: 8 answered requests" in page
    assert "nginx: knee at 4 streams; saturated at 8 streams" in page
    assert f"(indicative: fewer than {MIN_POINT_REQUESTS} answers at a load point)" in page


def test_every_load_point_is_labelled_on_each_charts_x_axis(tmp_path: Path) -> None:
    body = sweep_section(collect(_page_files(tmp_path, MIN_POINT_REQUESTS))).body
    charts = re.findall(r"<svg.*?</svg>", body, flags=re.S)
    assert charts
    for chart in charts:
        labels = set(re.findall(r'<text class="tick"[^>]*text-anchor="middle">([^<]+)</text>', chart))
        assert {str(x) for x in LOADS} <= labels, labels
