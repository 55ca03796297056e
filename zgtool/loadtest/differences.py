"""What each scenario adds to direct's median request duration, with an unpaired interval, and the
scenarios whose server closed kept-alive connections: read from k6's raw points and counters.

k6's scenarios are separate runs, so the paths cannot be paired round by round as `zgtool
latency-split` pairs them: the interval is a bootstrap over requests, each path resampled on its own.
It covers the spread of requests within the runs, not a drift of the machine between them; a
difference whose interval holds 0 is called not significant rather than printed as a fact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from zgtool.bootstrap import median_ci, median_difference
from zgtool.loadtest.summary import ScenarioStats

BASELINE = "direct"
METHOD = "unpaired bootstrap over requests (separate k6 runs)"
RECONNECT_MARK = "went out on a new TCP connection"


def p50_differences(points: Mapping[str, Mapping[str, Sequence[float]]],
                    scenarios: Sequence[str]) -> dict[str, dict[str, Any]]:
    """name -> {vs, p50_ms, lo_ms, hi_ms, verdict, n, method} for every scenario beside direct, from
    each path's raw http_req_duration points (every request, as k6's own trend counts them)."""
    base = list((points.get(BASELINE) or {}).get("http_req_duration", []))
    out: dict[str, dict[str, Any]] = {}
    if BASELINE not in scenarios or not base:
        return out
    for name in scenarios:
        cand = list((points.get(name) or {}).get("http_req_duration", []))
        if name == BASELINE or not cand:
            continue
        d = median_difference(base, cand)
        iv = d.interval
        out[name] = {"vs": BASELINE, "p50_ms": iv.estimate, "lo_ms": iv.lo, "hi_ms": iv.hi,
                     "confidence": iv.confidence, "verdict": d.verdict, "n": iv.n, "method": METHOD}
    return out


def with_p50_intervals(scenarios: Mapping[str, ScenarioStats],
                       points: Mapping[str, Mapping[str, Sequence[float]]]) -> dict[str, ScenarioStats]:
    """Each scenario with the 95% bootstrap interval of its median duration over its requests (what `compare`
    reads to judge a path's median across runs); unchanged where its points are missing or too few."""
    out = {}
    for name, s in scenarios.items():
        values = list((points.get(name) or {}).get("http_req_duration", []))
        iv = median_ci(values) if values else None
        out[name] = replace(s, p50_lo_ms=iv.lo, p50_hi_ms=iv.hi) if iv is not None and iv.lo is not None else s
    return out


def reconnect_notes(scenarios: Mapping[str, ScenarioStats]) -> list[str]:
    """One line per scenario in which requests found their VU's kept-alive connection closed."""
    notes = []
    for name, s in scenarios.items():
        if s.reconnects <= 0:
            continue
        notes.append(
            f"{name}: {s.reconnects} of {s.requests} requests {RECONNECT_MARK} although their k6 VU had sent "
            f"on one to the same server before: the server (or a hop in front of it) closed the kept-alive "
            f"connection after its answer (llama-server does after every streamed answer), so these "
            f"durations include a TCP connect (connecting p95 {s.http_req_connecting.p95:.2f} ms); a gateway "
            f"that keeps its upstream connections alive meets the same closes")
    return notes


def split_shape(data: Mapping[str, Any], phase: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A bench result's data in latency-split's shape, for `compare` and `gate --baseline`: its targets (direct
    first, then the other scenarios in order; each with its median duration under `phase`, that median's interval
    over its requests, and no phase where no request succeeded) and its differences (each scenario's median minus
    direct's under `phase`, unpaired)."""
    sc = data.get("scenarios") or {}
    order = ([BASELINE] if BASELINE in sc else []) + [n for n in sc if n != BASELINE]
    targets = []
    for name in order:
        s = sc[name]
        dur = s.get("http_req_duration") or {}
        ok = int(s.get("requests", 0)) - int(s.get("failures", 0))
        phases = {phase: {"count": ok, "summary": {"p50": dur.get("p50")}, "median_lo": s.get("p50_lo_ms"),
                          "median_hi": s.get("p50_hi_ms")}} if ok > 0 and dur.get("p50") is not None else {}
        targets.append({"name": name, "url": s.get("url"), "phases": phases})
    differences = [{"phase": phase, "baseline": d.get("vs", BASELINE), "candidate": name, "diff_ms": d.get("p50_ms"),
                    "lo_ms": d.get("lo_ms"), "hi_ms": d.get("hi_ms"), "verdict": d.get("verdict")}
                   for name, d in (data.get("differences") or {}).items() if isinstance(d, dict)]
    return targets, differences
