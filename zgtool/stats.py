"""Percentiles and summaries: computed here and nowhere else."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

PERCENTILES = (50, 90, 95, 99)


def percentile(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile (numpy's default 'linear' method); NaN when empty."""
    if not values:
        return math.nan
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    rank = (p / 100.0) * (len(xs) - 1)
    lo = math.floor(rank)
    hi = math.ceil(rank)
    frac = rank - lo
    return float(xs[lo] + (xs[hi] - xs[lo]) * frac)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """count, mean, stddev, min, max and p50/p90/p95/p99 of a sample."""
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    out: dict[str, float] = {"count": float(len(vals))}
    if not vals:
        return out
    out["mean"] = statistics.fmean(vals)
    out["stddev"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
    out["min"] = min(vals)
    out["max"] = max(vals)
    for p in PERCENTILES:
        out[f"p{p}"] = percentile(vals, p)
    return out
