"""k6 handleSummary JSON -> zgtool dataclasses (per-scenario phases, ramp steps and the knee).

k6 names are kept (`http_req_duration`, ms) so gate rules read like k6 thresholds;
`p(95)` becomes `p95` and `med` becomes `p50`. The percentiles are k6's own, computed
over every request of the run (summaryTrendStats in the scripts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from zgtool.errors import UsageError

PHASES = ("http_req_blocked", "http_req_connecting", "http_req_tls_handshaking", "http_req_sending",
          "http_req_waiting", "http_req_receiving", "http_req_duration")
_STAT_NAMES = {"avg": "avg", "min": "min", "med": "p50", "p(90)": "p90", "p(95)": "p95", "p(99)": "p99",
               "max": "max", "count": "count"}


@dataclass(frozen=True)
class Trend:
    """One k6 trend in ms."""

    count: int
    avg: float
    min: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float
    unit: str = "ms"


@dataclass(frozen=True)
class ScenarioStats:
    name: str
    url: str
    stream: bool
    rate_rps: float  # the asked-for arrival rate
    requests: int
    failures: int
    failure_rate: float
    achieved_rps: float
    dropped_iterations: int
    checks_failed: int
    http_req_blocked: Trend
    http_req_connecting: Trend
    http_req_tls_handshaking: Trend
    http_req_sending: Trend
    http_req_waiting: Trend
    http_req_receiving: Trend
    http_req_duration: Trend
    arrivals: str = "constant"  # constant | poisson
    # requests sent on a new TCP connection though their VU had sent on one to the same target before:
    # the server closed its kept-alive connection (k6/gateway_vs_direct.js's zg_reconnects)
    reconnects: int = 0
    # the 95% bootstrap interval of http_req_duration's median over this scenario's requests (k6's raw points)
    p50_lo_ms: float | None = None
    p50_hi_ms: float | None = None


@dataclass(frozen=True)
class BenchResult:
    """The data of a "bench.k6" result."""

    k6_version: str
    script: str
    config: dict[str, Any]
    scenarios: dict[str, ScenarioStats]
    requests: int
    failures: int
    failure_rate: float
    dropped_iterations: int
    load_generator_saturated: bool
    test_run_s: float
    ttft_ms: None = None  # k6 cannot see the first SSE event; see notes
    notes: list[str] = field(default_factory=list)
    segment: str | None = None  # "i/N" when this run was one k6 execution segment of N
    points: dict[str, dict[str, list[float]]] | None = None  # segments: raw ms per path and phase, for merge
    # what each scenario adds to direct's median duration, with its interval (differences.py)
    differences: dict[str, dict[str, Any]] = field(default_factory=dict)


def _metric(summary: dict[str, Any], name: str) -> dict[str, Any] | None:
    m = summary.get("metrics", {}).get(name)
    return m.get("values") if isinstance(m, dict) else None


def trend(summary: dict[str, Any], name: str) -> Trend:
    values = _metric(summary, name)
    if values is None:
        raise UsageError(f"k6 summary has no {name!r}: was the script changed? (expected per-path sub-metrics)")
    missing = [k for k in _STAT_NAMES if k not in values]
    if missing:
        raise UsageError(f"k6 summary {name!r} lacks {', '.join(missing)} (summaryTrendStats changed?)")
    f = {_STAT_NAMES[k]: float(values[k]) for k in _STAT_NAMES}
    return Trend(count=int(f["count"]), avg=f["avg"], min=f["min"], p50=f["p50"], p90=f["p90"], p95=f["p95"],
                 p99=f["p99"], max=f["max"])


def _count(summary: dict[str, Any], name: str) -> int:
    values = _metric(summary, name)
    return int(values.get("count", 0)) if values else 0


def _fails(summary: dict[str, Any], name: str) -> int:
    """A Rate's true count: for http_req_failed, `passes` counts the failed requests."""
    values = _metric(summary, name)
    return int(values.get("passes", 0)) if values else 0


def scenario_stats(summary: dict[str, Any], name: str, *, url: str, stream: bool, rate_rps: float,
                   duration_s: float, arrivals: str = "constant", rounds: int = 1) -> ScenarioStats:
    """One path's figures; with rounds > 1 its k6 scenarios are NAME_r0 ... (k6/gateway_vs_direct.js ROUNDS),
    its requests tagged path:NAME in each."""
    sel = f"{{path:{name}}}"
    requests = _count(summary, f"http_reqs{sel}")
    failures = _fails(summary, f"http_req_failed{sel}")
    checks = _metric(summary, f"checks{sel}") or {}
    trends: dict[str, Any] = {phase: trend(summary, phase + sel) for phase in PHASES}
    return ScenarioStats(
        name=name, url=url, stream=stream, rate_rps=rate_rps, requests=requests, failures=failures,
        failure_rate=failures / requests if requests else math.nan,
        achieved_rps=requests / duration_s if duration_s > 0 else math.nan,
        dropped_iterations=sum(_count(summary, f"dropped_iterations{{scenario:{scenario}}}")
                               for scenario in ([name] if rounds <= 1 else [f"{name}_r{r}" for r in range(rounds)])),
        checks_failed=int(checks.get("fails", 0)),
        **trends, arrivals=arrivals, reconnects=_count(summary, f"zg_reconnects{sel}"),
    )


def run_duration_s(summary: dict[str, Any]) -> float:
    return float(summary.get("state", {}).get("testRunDurationMs", 0.0)) / 1000.0


@dataclass(frozen=True)
class RampStep:
    rate_rps: float
    step_s: float
    requests: int
    achieved_rps: float
    failures: int
    p50_ms: float
    p95_ms: float
    p99_ms: float


@dataclass(frozen=True)
class RampPath:
    name: str
    url: str
    steps: list[RampStep]
    baseline_p95_ms: float
    knee_rps: float | None  # rate from which on p95 >= 2x baseline (or failures / rate not kept)
    knee_reason: str
    dropped_iterations: int


def ramp_path(summary: dict[str, Any], name: str, url: str, rates: list[float], step_s: float,
              *, knee_factor: float = 2.0, poisson: bool = False) -> RampPath:
    steps: list[RampStep] = []
    for i, rate in enumerate(rates):
        sel = f"{{path:{name},step:{i}}}"
        requests = _count(summary, f"http_reqs{sel}")
        d = _metric(summary, f"http_req_duration{sel}") or {}
        has = requests > 0 and "p(95)" in d
        steps.append(RampStep(rate, step_s, requests, requests / step_s, _fails(summary, f"http_req_failed{sel}"),
                              float(d["med"]) if has else math.nan, float(d["p(95)"]) if has else math.nan,
                              float(d["p(99)"]) if has else math.nan))
    knee, reason, base = find_knee(steps, knee_factor, poisson=poisson)
    return RampPath(name, url, steps, base, knee, reason, _count(summary, f"dropped_iterations{{scenario:{name}}}"))


def find_knee(steps: list[RampStep], factor: float = 2.0, *,
              poisson: bool = False) -> tuple[float | None, str, float]:
    """(rate, why, baseline p95): the first step from which on every step is over the knee:
    p95 >= factor x the low-rate p95 (the lower of the first two steps), >1% failed, or
    under 90% of the rate started.
    "From which on" keeps a single noisy sub-millisecond spike from being called the knee."""
    measured = [s for s in steps if not math.isnan(s.p95_ms)]
    if not measured:
        return None, "no requests completed", math.nan
    # the lower of the first two steps: one noisy low-rate step must not set the bar
    base = min(s.p95_ms for s in measured[:2])
    reasons = [_over_knee(s, factor, base, poisson) for s in steps]
    for i, reason in enumerate(reasons):
        if reason and all(reasons[i:]):
            return steps[i].rate_rps, reason, base
    return None, f"p95 stayed under {factor:g} x {base:.2f} ms up to {steps[-1].rate_rps:g} req/s", base


def started_enough(requests: int, rate_rps: float, seconds: float, poisson: bool = False) -> bool:
    """Did the generator start (about) the asked number of requests? Poisson arrivals vary by
    sqrt(expected): allow three standard deviations below 90% of it."""
    expected = rate_rps * seconds
    slack = 3.0 * math.sqrt(expected) if poisson else 0.0
    # +1: an arrival-rate plateau starts its first request one interval in
    return requests + 1 >= 0.9 * expected - slack


def _over_knee(s: RampStep, factor: float, base: float, poisson: bool = False) -> str:
    if s.requests == 0 or math.isnan(s.p95_ms):
        return "no requests completed at this rate"
    if s.failures / s.requests > 0.01:
        return f"{s.failures} of {s.requests} requests failed"
    if s.p95_ms >= factor * base:
        return f"p95 {s.p95_ms:.2f} ms >= {factor:g} x {base:.2f} ms"
    if not started_enough(s.requests, s.rate_rps, s.step_s, poisson):
        return f"only {s.achieved_rps:.1f} of {s.rate_rps:g} req/s started"
    return ""
