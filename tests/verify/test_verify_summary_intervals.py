"""verify's terminal verdict prints intervals as [lo, hi] (issue 25: `+36.33 ±40.84*` read as both
"contains 0" and "excludes 0") and, on a stream, the first token's tax beside the others."""

from __future__ import annotations

import io
from pathlib import Path

from report_build import diff, split  # tests/report/report_build.py (the root conftest puts it on the path)
from rich.console import Console

from zgtool.report.verdict import describe, verdict
from zgtool.results import to_jsonable
from zgtool.verify.plan import VerifyData
from zgtool.verify.summary import render_summary


def test_the_tax_table_prints_bounds_never_plus_minus_and_marks_significance_in_text(tmp_path: Path) -> None:
    results = [split([diff("total_ms", 36.33, 10.7, 92.4), diff("outside_engine_ms", 21.1, 12.0, 30.0),
                      diff("ttft_ms", 35.9, 12.4, 58.0), diff("ttfb_ms", 80.8, 60.2, 101.0)], stream=True),
               split([diff("total_ms", 2.0, -5.0, 9.0), diff("outside_engine_ms", 0.5, -1.0, 2.0)])]
    v = verdict(results)
    assert v is not None
    data = VerifyData(config={}, plan={}, urls={}, stages=[], files=[], gate=None,
                      verdict={"headline": v.headline, "rows": to_jsonable(v.rows),
                               "sentences": [describe(r) for r in v.rows], "indicative": False, "metrics": []})
    buf = io.StringIO()
    render_summary(data, tmp_path / "report.html", Console(file=buf, width=200, color_system=None))
    out = buf.getvalue()
    assert "±" not in out
    assert "+36.33 [+10.7, +92.4] *" in out and "+0.50 [-1.00, +2.00] n.s." in out     # readable without colour
    assert "+36.33 [+10.7, +92.4]" in out and "+21.10 [+12.0, +30.0]" in out and "+0.50 [-1.00, +2.00]" in out
    assert "first token" in out and "+35.90 [+12.4, +58.0]" in out
    assert out.index("Verdict:") < out.index("stack adds 35.9 ms to the first token")


def test_at_80_columns_the_interval_goes_under_its_figure_never_cut(tmp_path: Path) -> None:
    results = [split([diff("total_ms", 1234.56, -880.0, 2560.0), diff("outside_engine_ms", 21.1, 12.0, 30.0)],
                     concurrency=c, stream=s) for c, s in ((1, False), (8, True))]
    v = verdict(results)
    assert v is not None
    data = VerifyData(config={}, plan={}, urls={}, stages=[], files=[], gate=None,
                      verdict={"headline": v.headline, "rows": to_jsonable(v.rows), "sentences": [],
                               "indicative": False, "metrics": []})
    buf = io.StringIO()
    render_summary(data, tmp_path / "report.html", Console(file=buf, width=80, color_system=None))
    out = buf.getvalue()
    assert "…" not in out and max(len(ln) for ln in out.splitlines()) <= 80
    assert "+1234.56" in out and "[-880, +2560]" in out and "[+12.0, +30.0]" in out


def test_client_lag_and_the_machine_s_load_are_printed_under_the_verdict(tmp_path: Path) -> None:
    import json

    from report_build import target

    samples = [{"ok": True, "lagged": i < 6, "client_lag_ms": 2.5} for i in range(20)]
    r = split([diff("total_ms", 1.0, -2.0, 4.0)], stream=True,
              environment={"host": "h", "cpus": 2, "loadavg": [9.5, 8.0, 6.0]},
              targets=[target("direct", 50.0, samples=[{"ok": True} for _ in range(20)]),
                       target("stack", 50.0, samples=samples)])
    (tmp_path / "latency_split-stream-c1.json").write_text(json.dumps(r))
    v = verdict([r])
    assert v is not None
    data = VerifyData(config={}, plan={}, urls={}, stages=[], files=["latency_split-stream-c1.json"], gate=None,
                      verdict={"headline": v.headline, "rows": to_jsonable(v.rows), "sentences": [],
                               "indicative": False, "metrics": []})
    buf = io.StringIO()
    render_summary(data, tmp_path / "report.html", Console(file=buf, width=200, color_system=None))
    out = " ".join(buf.getvalue().split())
    assert "15% of requests (6 of 40" in out and "machine load 9.5 / 8.0 / 6.0 (1/5/15 min) on 2 CPUs" in out
    assert out.index("Verdict:") < out.index("15% of requests") < out.index("Gateway tax")


def test_the_verdict_starts_stdouts_first_line(tmp_path: Path) -> None:
    import json

    from rich.console import Console

    from zgtool.verify.summary import render_summary

    data_dir = Path(__file__).resolve().parents[1] / "report" / "data"
    verify = json.loads((data_dir / "verify" / "verify.json").read_text())["data"]
    data = VerifyData(config={}, plan={}, urls={}, stages=[], files=[], gate=None, verdict=verify["verdict"])
    console = Console(width=60, record=True, force_terminal=False, color_system=None)
    with console.capture() as cap:
        render_summary(data, tmp_path / "report.html", console)
    text = cap.get()
    assert text.splitlines()[0].startswith("Verdict: ")
    assert " ".join(verify["verdict"]["headline"].split()) in " ".join(text.split())


def test_the_gate_line_says_how_many_passes_were_inconclusive(tmp_path: Path) -> None:
    gate = {"passed": True, "verdict": "pass", "counts": {"pass": 4, "fail": 0, "skip": 1}, "policy": "gates.toml",
            "applied": 4, "failed": [], "inconclusive": 2}
    data = VerifyData(config={}, plan={}, urls={}, stages=[], files=[], gate=gate, verdict=None)
    buf = io.StringIO()
    render_summary(data, tmp_path / "report.html", Console(file=buf, width=200, color_system=None))
    out = buf.getvalue()
    assert "Gate (gates.toml): pass — 4 pass (2 inconclusive: a regression up to the interval's high end could " \
           "hide), 0 fail, 1 skip" in out
    gate["inconclusive"] = 0
    buf = io.StringIO()
    render_summary(data, tmp_path / "report.html", Console(file=buf, width=200, color_system=None))
    assert "Gate (gates.toml): pass — 4 pass, 0 fail, 1 skip" in buf.getvalue()
