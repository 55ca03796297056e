"""The trace-echo verdict's arithmetic (issue 38 item 3; the live test is test_trace_echo_live.py): no echo on the
path nor on the direct one says nothing; a path whose answers mix survived, rewritten and dropped says each count,
in the JSON and the table's row."""

from __future__ import annotations

from zgtool.latency.analysis.phases import trace_echo
from zgtool.latency.records import RequestSample, TargetResult
from zgtool.latency.render.split import trace_cell


def _sent(echoes: list[str | None]) -> list[RequestSample]:
    out = []
    for i, e in enumerate(echoes):
        tid = f"{i:032x}"
        out.append(RequestSample(index=i, worker=0, round=0, ok=True, total_ms=1.0, trace_id=tid,
                                 trace_echo=tid if e == "same" else e))
    return out


def test_no_echo_anywhere_is_not_judged_and_no_echo_beside_an_echoing_direct_path_is_dropped() -> None:
    quiet = _sent([None] * 4)
    assert trace_echo(quiet, direct_echoes=False) is None             # an engine that echoes nothing (vLLM)
    assert trace_echo(quiet, direct_echoes=True)["verdict"] == "dropped"   # type: ignore[index]


def test_a_path_that_mixes_verdicts_says_each_count() -> None:
    te = trace_echo(_sent(["same", "same", "f" * 32, None]), direct_echoes=True)
    assert te == {"verdict": "mixed", "survived": 2, "rewritten": 1, "dropped": 1, "sent": 4,
                  "source": "engine echo (x-zgtool-trace-id)"}
    tr = TargetResult("gw", "http://127.0.0.1:1", "anthropic", "http", [], {}, 4, 0, trace_echo=te)
    assert trace_cell(tr) == ("mixed: 2 survived, 1 rewritten, 1 dropped (echo)", "4")


def test_the_html_lists_each_paths_echo_verdict_with_its_counts() -> None:
    from zgtool.report.load import ResultSet
    from zgtool.report.sections_latency import waterfall_section

    te = trace_echo(_sent(["same", "same", "f" * 32, None]), direct_echoes=True)
    data = {"config": {}, "waterfall_phases": [], "targets": [{"name": "gw", "phases": {}, "trace_echo": te}]}
    sec = waterfall_section(ResultSet(results=[("r.json", {"kind": "latency_split", "data": data})]))
    assert "gw: mixed (of 4: 2 survived, 1 rewritten, 1 dropped)" in sec.body
