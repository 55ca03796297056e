"""Rates with Wilson 95% intervals, as the calibration benchmarks report them (bench/gate_calibration.py,
bench/verdict_calibration.py)."""

from __future__ import annotations

import math
from typing import Any


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of k successes in n trials (nan, nan for n = 0)."""
    if n == 0:
        return (math.nan, math.nan)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def rate(k: int, n: int) -> dict[str, Any]:
    lo, hi = wilson(k, n)
    return {"k": k, "n": n, "rate": k / n if n else None, "wilson_lo": lo, "wilson_hi": hi}


def fmt_rate(r: dict[str, Any]) -> str:
    if not r["n"]:
        return "  n/a"
    return f"{r['rate']:6.1%} [{r['wilson_lo']:.1%}, {r['wilson_hi']:.1%}] ({r['k']}/{r['n']})"
