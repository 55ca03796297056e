"""What a latency difference must clear to matter, what a run could have detected, and how a
latency's own interval is drawn (issue 25: A/A false positives, power, negative latency bounds).

Calibrated by bench/verdict_calibration.py (known delays through a delay proxy, A/A runs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

from zgtool.bootstrap import LINEAR, LOG

# A difference below max(floor, share x baseline median) is "negligible", significant or not.
# 0.2 ms: in bench/verdict_calibration.py's A/A runs on this 2-core box (null engine, the same URL twice,
# c=1, 24-50 requests a path, ~120 runs) every significant difference with fresh connections was 0.02-0.18
# ms (up to 0.84 ms with the old kept connections): real within the run, gone in the next. Intervals that
# miss the tax a hop reproducibly adds across runs miss it by < 0.2 ms in 97% of runs. A 0.5 ms hop clears
# it. 2%: on long answers the same drift scales with the latency; a judgement, not calibrated here (no
# significant A/A total on dummy:small, whose intervals are tens of ms wide on this box).
MIN_EFFECT_FLOOR_MS = 0.2
MIN_EFFECT_SHARE = 0.02
POWER = 0.8                       # mde_ms: the effect detected in 80% of runs

CI_LOG = "log"                            # bootstrap of log latency, back-transformed: bounds > 0
CI_CLIPPED = "linear, clipped at 0"       # some values are exactly 0: linear, the lower bound clipped
CI_LINEAR = "linear"                      # values can be negative (a remainder): linear, unclipped


def min_effect_ms(baseline_median_ms: float | None) -> float:
    """The smallest difference of a figure that matters, given the baseline's median of it."""
    if baseline_median_ms is None or math.isnan(baseline_median_ms):
        return MIN_EFFECT_FLOOR_MS
    return max(MIN_EFFECT_FLOOR_MS, MIN_EFFECT_SHARE * abs(baseline_median_ms))


def comparisons(num_candidates: int, family_size: int) -> int:
    """m of the family-wise adjustment: every candidate in every configuration compared."""
    return max(1, num_candidates) * max(1, family_size)


def adjusted_confidence(confidence: float, m: int) -> float:
    """Bonferroni: each of m comparisons at 1 - alpha/m keeps the family's false-positive rate <= alpha."""
    return 1.0 - (1.0 - confidence) / max(1, m)


def mde_ms(lo: float | None, hi: float | None, confidence: float, m: int = 1) -> float | None:
    """The smallest true difference this run would call significant (at the family-adjusted level)
    with POWER: (z(1 - alpha/2m) + z(POWER)) x SE, SE read off the interval's width."""
    if lo is None or hi is None:
        return None
    nd = NormalDist()
    alpha = 1.0 - confidence
    se = (hi - lo) / (2.0 * nd.inv_cdf(1.0 - alpha / 2.0))
    return (nd.inv_cdf(1.0 - alpha / (2.0 * max(1, m))) + nd.inv_cdf(POWER)) * se


def is_negligible(diff_ms: float | None, lo: float | None, hi: float | None, significant: bool,
                  min_effect: float) -> bool:
    """Too small to matter: the estimate is below min_effect, and either the interval excludes 0
    (a real but tiny difference) or it lies within +-min_effect (no difference that matters).
    A small estimate with a wide interval is not negligible: it is inconclusive (see mde_ms)."""
    if diff_ms is None or math.isnan(diff_ms) or abs(diff_ms) >= min_effect:
        return False
    if significant:
        return True
    return lo is not None and hi is not None and -min_effect < lo and hi < min_effect


def ci_method(values: Sequence[float]) -> str:
    """How a latency's median interval is drawn: on log latency when every value is > 0."""
    if values and min(values) > 0:
        return CI_LOG
    if values and min(values) >= 0:
        return CI_CLIPPED
    return CI_LINEAR


def bootstrap_scale(method: str) -> str:
    return LOG if method == CI_LOG else LINEAR
