"""What each scenario adds to direct's median request duration, with its interval, and the scenarios whose
server closed kept-alive connections: read from k6's raw points and counters.

Scenarios in turn take turns in rounds (k6/gateway_vs_direct.js ROUNDS, `bench --rounds`, 10 by default): the
difference is then paired as `zgtool latency-split` pairs its paths, the rounds resampled together (a paired
cluster bootstrap), so a drift of the machine, or the first turn's warm-up, falls on both paths and out of the
difference. In one round (--rounds 1, or scenarios at once, or under 3 rounds) the interval is a bootstrap over
requests, each path resampled on its own: it covers the spread of requests, not a drift between the scenarios.
A difference whose interval holds 0 is called not significant rather than printed as a fact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from zgtool.bootstrap import BY_ROUNDS, median_ci, median_difference
from zgtool.loadtest.points import ROUND_KEY
from zgtool.loadtest.summary import ScenarioStats

BASELINE = "direct"
METHOD = "unpaired bootstrap over requests (separate k6 runs)"
PAIRED = "paired by rounds: the scenarios took turns, and the rounds are resampled together"
RECONNECT_MARK = "went out on a new TCP connection"


def p50_differences(points: Mapping[str, Mapping[str, Sequence[float]]],
                    scenarios: Sequence[str]) -> dict[str, dict[str, Any]]:
    """name -> {vs, p50_ms, lo_ms, hi_ms, verdict, n, method} for every scenario beside direct, from
    each path's raw http_req_duration points (every request, as k6's own trend counts them)."""
    base, base_rounds = _durations(points, BASELINE)
    out: dict[str, dict[str, Any]] = {}
    if BASELINE not in scenarios or not base:
        return out
    for name in scenarios:
        cand, cand_rounds = _durations(points, name)
        if name == BASELINE or not cand:
            continue
        paired = base_rounds is not None and cand_rounds is not None
        d = median_difference(base, cand, baseline_groups=base_rounds if paired else None,
                              candidate_groups=cand_rounds if paired else None)
        iv = d.interval
        out[name] = {"vs": BASELINE, "p50_ms": iv.estimate, "lo_ms": iv.lo, "hi_ms": iv.hi,
                     "confidence": iv.confidence, "verdict": d.verdict, "n": iv.n,
                     "method": PAIRED if iv.method == BY_ROUNDS else METHOD, "rounds": iv.rounds}
    return out


def _durations(points: Mapping[str, Mapping[str, Sequence[float]]], name: str
               ) -> tuple[list[float], list[float] | None]:
    """A path's durations and, where every one carries it, the round each ran in."""
    got = points.get(name) or {}
    values = list(got.get("http_req_duration", []))
    rounds = list(got.get(ROUND_KEY, []))
    return values, (rounds if rounds and len(rounds) == len(values) else None)


def with_p50_intervals(scenarios: Mapping[str, ScenarioStats],
                       points: Mapping[str, Mapping[str, Sequence[float]]]) -> dict[str, ScenarioStats]:
    """Each scenario with the 95% bootstrap interval of its median duration (over its rounds where it took turns,
    else over its requests: what `compare` reads to judge a path's median across runs); unchanged where its
    points are missing or too few."""
    out = {}
    for name, s in scenarios.items():
        values, rounds = _durations(points, name)
        iv = median_ci(values, groups=rounds) if values else None
        out[name] = replace(s, p50_lo_ms=iv.lo, p50_hi_ms=iv.hi) if iv is not None and iv.lo is not None else s
    return out


def reconnect_notes(scenarios: Mapping[str, ScenarioStats]) -> list[str]:
    """One line for every scenario in which requests found their VU's kept-alive connection closed (the cause
    and its cost are the same for each; one line per scenario said it three times over)."""
    hit = [(name, s) for name, s in scenarios.items() if s.reconnects > 0]
    if not hit:
        return []
    counts = ", ".join(f"{name}: {s.reconnects} of {s.requests}" for name, s in hit)
    connect = ", ".join(f"{s.http_req_connecting.p95:.2f}" for _, s in hit)
    return [f"{counts} requests {RECONNECT_MARK} although their k6 VU had sent on one to the same server before: "
            "the server (or a hop in front of it) closed the kept-alive connection, after its answer (llama-server "
            "does after every streamed answer) or while it idled (between the scenarios' turns, or between a VU's "
            "requests at a low rate: uvicorn's keep-alive timeout is 5 s), so these durations include a TCP "
            f"connect (connecting p95 {connect} ms); a gateway that keeps its upstream connections alive meets the "
            "same closes"]


def split_shape(data: Mapping[str, Any], phase: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A bench result's data in latency-split's shape, for `compare` and `gate --baseline`: its targets (direct
    first, then the other scenarios in order; each with its median duration under `phase`, that median's interval
    over its requests, and no phase where no request succeeded) and its differences (each scenario's median minus
    direct's under `phase`, paired by turns where the scenarios took them)."""
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


def how_paired(differences: Mapping[str, Any]) -> str:
    """How a bench's differences were measured, in words, for the tables that show them."""
    methods = {d.get("method") for d in differences.values() if isinstance(d, dict)}
    if methods and methods <= {PAIRED}:
        rounds = max((int(d.get("rounds") or 0) for d in differences.values() if isinstance(d, dict)), default=0)
        return f"paired by {rounds} rounds in which the k6 scenarios took turns"
    return "separate k6 scenarios, unpaired"
