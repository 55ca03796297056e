"""`zgtool bench merge`: the segments of one k6 run (`--segment i/N`) combined into one bench.k6 result.

Counts are summed; every trend is recomputed from the pooled raw points of all segments (an
average of percentiles is not a percentile). The merged result is an ordinary bench.k6 result,
so `zgtool gate` and `zgtool report html` read it like any other.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from zgtool.errors import UsageError
from zgtool.loadtest.differences import RECONNECT_MARK, p50_differences, reconnect_notes, with_p50_intervals
from zgtool.loadtest.points import ROUND_KEY
from zgtool.loadtest.summary import PHASES, BenchResult, ScenarioStats, Trend
from zgtool.stats import percentile

_SAME_CONFIG = ("rate_rps", "duration_s", "api", "arrivals", "sequential", "endpoint", "rounds")


def trend_of(values: list[float]) -> Trend:
    if not values:
        return Trend(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    return Trend(count=len(values), avg=sum(values) / len(values), min=min(values), p50=percentile(values, 50),
                 p90=percentile(values, 90), p95=percentile(values, 95), p99=percentile(values, 99),
                 max=max(values))


def _check_segments(labelled: list[tuple[str, dict[str, Any]]]) -> int:
    seen: dict[int, str] = {}
    count: int | None = None
    for label, result in labelled:
        if result.get("kind") != "bench.k6":
            raise UsageError(f"{label}: a {result.get('kind')!r} result; bench merge takes bench.k6 segments")
        seg = (result.get("data") or {}).get("segment")
        if not isinstance(seg, str) or "/" not in seg:
            raise UsageError(f"{label}: not a segment (run it with zgtool bench --segment i/N)")
        if not isinstance(result["data"].get("points"), dict):
            raise UsageError(f"{label}: segment {seg} carries no raw points; rerun it with this zgtool version")
        i, n = (int(x) for x in seg.split("/"))
        if count is None:
            count = n
        elif n != count:
            raise UsageError(f"{label}: segment {seg} of {n}, but the others are of {count}")
        if i in seen:
            raise UsageError(f"{label}: segment {seg} given twice (also {seen[i]})")
        seen[i] = label
    assert count is not None
    missing = [f"{i}/{count}" for i in range(1, count + 1) if i not in seen]
    if missing:
        raise UsageError(f"bench merge: segments {', '.join(missing)} missing; give all {count}")
    first = labelled[0][1]["data"]["config"]
    for label, result in labelled[1:]:
        cfg = result["data"]["config"]
        for key in _SAME_CONFIG:
            if cfg.get(key) != first.get(key):
                raise UsageError(f"{label}: {key} {cfg.get(key)!r} differs from {labelled[0][0]}'s "
                                 f"{first.get(key)!r}: not segments of one run")
        if set(result["data"]["scenarios"]) != set(labelled[0][1]["data"]["scenarios"]):
            raise UsageError(f"{label}: other scenarios than {labelled[0][0]}: not segments of one run")
    return count


def merge_segments(labelled: list[tuple[str, dict[str, Any]]]) -> BenchResult:
    if not labelled:
        raise UsageError("bench merge needs the RESULT files of every segment")
    count = _check_segments(labelled)
    datas = [r["data"] for _, r in labelled]
    first = datas[0]
    duration_s = float(first["config"]["duration_s"])
    scenarios: dict[str, ScenarioStats] = {}
    for name, base in first["scenarios"].items():
        parts = [d["scenarios"][name] for d in datas]
        requests = sum(int(p["requests"]) for p in parts)
        failures = sum(int(p["failures"]) for p in parts)
        trends: dict[str, Any] = {phase: trend_of([v for d in datas for v in (d["points"].get(name) or {}).get(phase, [])])
                  for phase in PHASES}
        scenarios[name] = ScenarioStats(
            name=name, url=base["url"], stream=bool(base["stream"]), rate_rps=float(base["rate_rps"]),
            requests=requests, failures=failures, failure_rate=failures / requests if requests else math.nan,
            achieved_rps=requests / duration_s if duration_s > 0 else math.nan,
            dropped_iterations=sum(int(p["dropped_iterations"]) for p in parts),
            checks_failed=sum(int(p["checks_failed"]) for p in parts), arrivals=base.get("arrivals", "constant"),
            reconnects=sum(int(p.get("reconnects", 0)) for p in parts), **trends)
    requests = sum(s.requests for s in scenarios.values())
    failures = sum(s.failures for s in scenarios.values())
    dropped = sum(s.dropped_iterations for s in scenarios.values())
    notes = [f"merged from {count} k6 execution segments ({', '.join(label for label, _ in labelled)}): counts "
             "summed, every trend recomputed from the pooled raw points (linear percentiles)"]
    notes += [n for d in datas for n in d.get("notes", []) if n not in notes and RECONNECT_MARK not in n]
    notes += reconnect_notes(scenarios)     # the segments' counts summed, not one line per segment
    pooled = {name: {key: [v for d in datas for v in (d["points"].get(name) or {}).get(key, [])]
                     for key in ("http_req_duration", ROUND_KEY)}      # a segment's rounds are the same turns
              for name in scenarios}
    scenarios = with_p50_intervals(scenarios, pooled)
    merged = BenchResult(
        k6_version=first["k6_version"], script=first["script"],
        config={**first["config"], "segments": count}, scenarios=scenarios, requests=requests, failures=failures,
        failure_rate=failures / requests if requests else math.nan, dropped_iterations=dropped,
        load_generator_saturated=dropped > 0, test_run_s=max(float(d["test_run_s"]) for d in datas), notes=notes,
        differences=p50_differences(pooled, list(scenarios)))
    return replace(merged, segment=None, points=None)
