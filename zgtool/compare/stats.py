"""Across runs: each path's metrics with a between-run interval, the tax per hop per run, regressions.

- Between-run interval (AIPerf's multi-run confidence): the t-interval over the runs' medians,
  mean +/- t(0.975, k-1) * sd / sqrt(k). It needs k >= 2 runs; it says how much the figure moves
  from one run to the next, which a single run's bootstrap interval cannot.
- Tax per hop: each run's own paired difference (candidate path minus path 1, the run's
  interleaved rounds), with its within-run interval, and the t-interval over those differences.
- Regression table: each run against the baseline run, metric by metric. Two runs are separate
  samples, so the interval combines the two medians' own intervals (normal approximation of each:
  se = width / (2 * 1.96)); a change counts only when that interval excludes 0 and the change is
  above the smallest effect that matters (max(0.2 ms, 2% of the baseline), the rule latency-split
  uses). Each hop's tax is compared the same way (its paired interval in each run; the effect that
  matters is 2% of the baseline path's median of that phase, at least 0.2 ms).
- What --fail-on-regression counts: in runs of two or more paths, the hops' taxes only, which the machine's
  drift between runs cancels within each run; a path's own median moves with the machine (it flagged 6 of 11
  consecutive pairs of A/A runs that bench/gate_calibration.py had made, quiet, here) and is listed, not
  counted. In runs of one path there is nothing paired: its medians are counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist, fmean, stdev

from zgtool.bootstrap import t_quantile
from zgtool.compare.runs import BENCH_KIND, KIND, Run

LATENCY_METRICS = ("ttfb_ms", "ttft_ms", "itl_ms", "tpot_ms", "total_ms", "outside_engine_ms",
                   # a gateway's own account from its spans (latency-split --otlp-listen): its path's rows only
                   "gateway_before_call_ms", "gateway_call_ms", "gateway_after_call_ms")
THROUGHPUT_METRICS = ("request_rps", "output_tok_s")       # higher is better
TAX_PHASES = ("total_ms", "ttft_ms", "outside_engine_ms")
CONFIDENCE = 0.95
_Z = NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)


def t_critical(df: int, confidence: float = CONFIDENCE) -> float:
    """Two-sided Student t critical value: exact for 1 and 2 degrees of freedom, Cornish-Fisher above."""
    p = 0.5 + confidence / 2
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    return t_quantile(p, df)


@dataclass(frozen=True)
class Interval:
    mean: float
    lo: float | None          # None with fewer than two values
    hi: float | None
    n: int


def between_runs(values: list[float]) -> Interval:
    if len(values) < 2:
        v = values[0] if values else math.nan
        return Interval(v, None, None, len(values))
    m, sd = fmean(values), stdev(values)
    half = t_critical(len(values) - 1) * sd / math.sqrt(len(values))
    return Interval(m, m - half, m + half, len(values))


@dataclass(frozen=True)
class MetricRow:
    path: int                          # 0-based position of the path in every run
    path_name: str                     # its name in the baseline run
    metric: str
    per_run: tuple[float | None, ...]  # each run's median (None: the run has no such figure)
    across: Interval


def _median(target: dict, metric: str) -> tuple[float | None, float | None, float | None]:
    if metric in THROUGHPUT_METRICS:
        v = (target.get("throughput") or {}).get(metric)
        return (float(v) if isinstance(v, int | float) else None), None, None
    phase = (target.get("phases") or {}).get(metric)
    if not phase or not phase.get("count"):
        return None, None, None
    return float(phase["summary"]["p50"]), phase.get("median_lo"), phase.get("median_hi")


def metric_rows(runs: list[Run]) -> list[MetricRow]:
    rows = []
    for i, name in enumerate(runs[0].path_names):
        for metric in (*LATENCY_METRICS, *THROUGHPUT_METRICS):
            per_run = tuple(_median(run.targets[i], metric)[0] for run in runs)
            present = [v for v in per_run if v is not None]
            if not present:
                continue
            rows.append(MetricRow(i, name, metric, per_run, between_runs(present)))
    return rows


@dataclass(frozen=True)
class TaxRow:
    candidate: int                     # path position (>= 1) against path 0
    candidate_name: str
    phase: str
    per_run: tuple[tuple[float, float, float, str] | None, ...]   # (diff, lo, hi, verdict) per run
    across: Interval                   # t-interval over the runs' differences


def _difference(run: Run, candidate: int, phase: str) -> tuple[float, float, float, str] | None:
    names = run.path_names
    for d in run.differences:
        if d.get("phase") == phase and d.get("baseline") == names[0] and d.get("candidate") == names[candidate]:
            if d.get("diff_ms") is None or d.get("lo_ms") is None or d.get("hi_ms") is None:
                return None
            return float(d["diff_ms"]), float(d["lo_ms"]), float(d["hi_ms"]), str(d.get("verdict", ""))
    return None


def tax_rows(runs: list[Run]) -> list[TaxRow]:
    rows = []
    for j in range(1, len(runs[0].targets)):
        for phase in TAX_PHASES:
            per_run = tuple(_difference(run, j, phase) for run in runs)
            present = [d[0] for d in per_run if d is not None]
            if present:
                rows.append(TaxRow(j, runs[0].path_names[j], phase, per_run, between_runs(present)))
    return rows


@dataclass(frozen=True)
class Change:
    run: str
    path: int                  # 0-based position
    path_name: str
    metric: str
    baseline: float
    value: float
    diff: float
    lo: float | None
    hi: float | None
    verdict: str               # "regression" | "improvement" | "no change" | "inconclusive" | "no interval"
    counted: bool = True       # counts toward --fail-on-regression (a path's own median in a multi-path run: no)


# k6 bench runs: a scenario's median minus direct's is paired by the scenarios' turns at best (1 s slices, not
# request by request; unpaired with --rounds 1): A/A taxes of one stack moved by about +-1 ms between runs here
# before the turns (bench/k6_gate_calibration.py), so a change counts from gate's default [regression] allowances
BENCH_FLOOR_MS, BENCH_RATIO = 1.0, 0.10


def smallest_effect(baseline: float, kind: str = KIND) -> float:
    """The smallest change that counts: latency-split's rule, max(0.2 ms, 2%); for k6 bench runs max(1 ms, 10%)."""
    if kind == BENCH_KIND:
        return max(BENCH_FLOOR_MS, BENCH_RATIO * abs(baseline))
    return max(0.2, 0.02 * abs(baseline))


def _verdict(diff: float, lo: float | None, hi: float | None, baseline: float, higher_is_better: bool,
             kind: str = KIND) -> str:
    if lo is None or hi is None:
        return "no interval"
    worse = (lo > 0) if not higher_is_better else (hi < 0)
    better = (hi < 0) if not higher_is_better else (lo > 0)
    big = abs(diff) >= smallest_effect(baseline, kind)
    if worse and big:
        return "regression"
    if better and big:
        return "improvement"
    # "no change" only where the interval rules out a change that counts, either way; where it still reaches
    # one, the two runs cannot tell (a regression that large could hide in them)
    effect = smallest_effect(baseline, kind)
    return "no change" if -effect < lo and hi < effect else "inconclusive"


def interval_apart(b_lo: float, b_hi: float, v_lo: float, v_hi: float, diff: float) -> tuple[float, float]:
    """The interval of a difference of two separate runs' figures from each one's own 95% interval."""
    se = math.hypot((b_hi - b_lo) / (2 * _Z), (v_hi - v_lo) / (2 * _Z))
    return diff - _Z * se, diff + _Z * se


def tax_changes(runs: list[Run]) -> list[Change]:
    """Every other run's tax per hop and phase against the baseline run's (each paired within its run)."""
    out = []
    base = runs[0]
    for run in runs[1:]:
        for j in range(1, min(len(base.path_names), len(run.path_names))):
            for phase in TAX_PHASES:
                b, v = _difference(base, j, phase), _difference(run, j, phase)
                ref = _median(base.targets[0], phase)[0]
                if b is None or v is None or ref is None:
                    continue
                diff = v[0] - b[0]
                lo, hi = interval_apart(b[1], b[2], v[1], v[2], diff)
                out.append(Change(run.label, j, base.path_names[j], f"{phase} tax", b[0], v[0], diff, lo, hi,
                                  _verdict(diff, lo, hi, ref, False, base.kind)))
    return out


def changes(runs: list[Run]) -> list[Change]:
    """Every other run against the baseline (runs[0]), per path and metric, then each hop's tax."""
    out = []
    base = runs[0]
    alone = len(base.path_names) == 1       # nothing paired: a path's own medians are what counts
    for run in runs[1:]:
        for i, name in enumerate(base.path_names):
            for metric in (*LATENCY_METRICS, *THROUGHPUT_METRICS):
                b, b_lo, b_hi = _median(base.targets[i], metric)
                v, v_lo, v_hi = _median(run.targets[i], metric)
                if b is None or v is None:
                    continue
                diff = v - b
                lo = hi = None
                if b_lo is not None and b_hi is not None and v_lo is not None and v_hi is not None:
                    lo, hi = interval_apart(b_lo, b_hi, v_lo, v_hi, diff)
                out.append(Change(run.label, i, name, metric, b, v, diff, lo, hi,
                                  _verdict(diff, lo, hi, b, metric in THROUGHPUT_METRICS, base.kind),
                                  counted=alone))
    return out + tax_changes(runs)
