"""Bootstrap confidence intervals and the significance of a difference between two samples.

Percentile bootstrap (Efron): resample with replacement, take the statistic of every
resample, read the interval off the resampled distribution with zgtool.stats.percentile.
Seeded, so the same samples always give the same interval. A difference whose interval
contains zero is "not significant" — never reported as a saving or a cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from zgtool.stats import percentile

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95
MIN_SAMPLES = 3          # below this a resampled median says nothing useful
_MAX_CELLS = 4_000_000   # resample in chunks above this many floats (memory bound)

NOT_SIGNIFICANT = "not significant"
HIGHER = "higher"
LOWER = "lower"


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap interval; lo/hi are None when n < MIN_SAMPLES."""

    estimate: float
    lo: float | None
    hi: float | None
    confidence: float
    resamples: int
    n: int

    def contains(self, x: float) -> bool:
        return self.lo is None or self.hi is None or self.lo <= x <= self.hi


@dataclass(frozen=True)
class Difference:
    """candidate - baseline of a statistic (e.g. median), with its interval and verdict."""

    interval: Interval
    verdict: str          # HIGHER | LOWER | NOT_SIGNIFICANT

    @property
    def significant(self) -> bool:
        return self.verdict != NOT_SIGNIFICANT


def _clean(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if v is not None and not math.isnan(float(v))]


def _resampled_medians(xs: list[float], resamples: int, rng) -> list[float]:
    import numpy as np

    arr = np.asarray(xs, dtype=np.float64)
    n = arr.size
    out: list[float] = []
    chunk = max(1, _MAX_CELLS // n)
    done = 0
    while done < resamples:
        b = min(chunk, resamples - done)
        idx = rng.integers(0, n, size=(b, n))
        # np.median averages the two middle values: the same as stats.percentile(x, 50).
        out.extend(np.median(arr[idx], axis=1).tolist())
        done += b
    return out


def _bounds(dist: list[float], confidence: float) -> tuple[float, float]:
    alpha = (1.0 - confidence) / 2.0
    return percentile(dist, 100.0 * alpha), percentile(dist, 100.0 * (1.0 - alpha))


def _check(confidence: float, resamples: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), not {confidence}")
    if resamples < 100:
        raise ValueError(f"at least 100 resamples are needed, not {resamples}")


def median_ci(values: Sequence[float], *, confidence: float = DEFAULT_CONFIDENCE,
              resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> Interval:
    """The sample median with a percentile-bootstrap interval."""
    import numpy as np

    _check(confidence, resamples)
    xs = _clean(values)
    est = percentile(xs, 50)
    if len(xs) < MIN_SAMPLES:
        return Interval(est, None, None, confidence, 0, len(xs))
    dist = _resampled_medians(xs, resamples, np.random.default_rng(seed))
    lo, hi = _bounds(dist, confidence)
    return Interval(est, lo, hi, confidence, resamples, len(xs))


def median_difference(baseline: Sequence[float], candidate: Sequence[float], *,
                      confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES,
                      seed: int = 0) -> Difference:
    """median(candidate) - median(baseline), both resampled independently.

    The verdict is HIGHER/LOWER only when the whole interval lies above/below zero.
    """
    import numpy as np

    _check(confidence, resamples)
    a, b = _clean(baseline), _clean(candidate)
    est = percentile(b, 50) - percentile(a, 50) if a and b else math.nan
    n = min(len(a), len(b))
    if n < MIN_SAMPLES:
        return Difference(Interval(est, None, None, confidence, 0, n), NOT_SIGNIFICANT)
    rng = np.random.default_rng(seed)
    da = _resampled_medians(a, resamples, rng)
    db = _resampled_medians(b, resamples, rng)
    lo, hi = _bounds([y - x for x, y in zip(da, db, strict=True)], confidence)
    verdict = HIGHER if lo > 0 else LOWER if hi < 0 else NOT_SIGNIFICANT
    return Difference(Interval(est, lo, hi, confidence, resamples, n), verdict)
