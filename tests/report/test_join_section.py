"""The report's waterfall section carries the join: engine source, hops' self-reports, remainder, hop audit."""

from __future__ import annotations

from zgtool.latency.analysis.phases import analyse
from zgtool.latency.config import SplitConfig
from zgtool.latency.records import FROM_SCHEDULING, EngineTiming, RequestSample
from zgtool.latency.result import result_data
from zgtool.report.sections_latency import join_table
from zgtool.targets import Target


def _s(i: int, total: float, hops: dict[str, float]) -> RequestSample:
    return RequestSample(index=i, worker=0, round=i % 4, ok=True, total_ms=total, hop_reports=hops,
                         engine=EngineTiming(source="TGI headers", queue_ms=1.0, total_ms=20.0,
                                             total_start=FROM_SCHEDULING))


def test_join_table_names_the_source_hops_remainder_and_flags() -> None:
    direct = [_s(i, 22.0 + 0.01 * i, {}) for i in range(16)]
    gw = [_s(i, 30.0 + 0.01 * i, {"x-kong-proxy-latency": 5.0}) for i in range(16)]
    gw[0].total_ms = 23.0                                   # kong 5 + engine 20 > 23: flagged
    res = analyse([Target("direct", "http://127.0.0.1:1"), Target("kong", "http://127.0.0.1:2")], [direct, gw],
                  SplitConfig(num_requests=16, stream=False, resamples=200))
    html = join_table(result_data(res)["join"])
    assert "TGI headers (16)" in html and "kong 5.00" in html
    assert "1 below −1 ms" in html
    assert "x-kong-proxy-latency" in html and "not in its report" in html


def test_the_waterfall_section_gives_a_paths_gateway_account_from_its_own_spans() -> None:
    from pathlib import Path

    from report_build import split, target

    from zgtool.report.load import ResultSet
    from zgtool.report.sections_latency import waterfall_section

    acc = {"source": "LiteLLM OTLP spans", "requests": 40, "of": 40, "p50_before_call_ms": 7.23,
           "p50_call_ms": 552.22, "p50_after_call_ms": 11.3, "p50_call_beyond_engine_ms": 34.1, "engine_spans": 40}
    result = split([], targets=[target("direct", 500.0), target("litellm", 550.0, hop_account=acc)])
    body = waterfall_section(ResultSet(results=[(Path("split.json"), result)])).body
    assert ("litellm: the gateway&#x27;s own account (LiteLLM OTLP spans, 40 of 40 requests, medians): 7.23 ms "
            "before its call to the engine; its call 552.22 ms, 34.10 ms of it beyond the engine&#x27;s own time; "
            "11.30 ms after it (to its server span&#x27;s end)") in body
    assert body.count("own account") == 1
