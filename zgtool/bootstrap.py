"""Bootstrap confidence intervals and the significance of a difference between two samples.

Percentile bootstrap (Efron), seeded, so the same samples always give the same interval.
A difference whose interval contains zero is "not significant" — never a saving or a cost.

Requests measured in one round (latency-split's block of one path, then the other) share
machine state: a busy second, a warm cache, a frequency step. Resampling single requests
treats them as independent and gives intervals that are too narrow (issue 15: the wire's tax
fell outside zgtool's 95% interval in 4 of 5 runs). When each value carries its round, the
rounds are resampled instead (a cluster bootstrap), paired between the two paths — round r of
the baseline goes with round r of the candidate, so the state they shared cancels in the
difference. With few rounds the spread of a cluster bootstrap is too small by about
(R-1)/R and its tails too light, so the interval is widened about the estimate by
t(R-1)/z * sqrt(R/(R-1)); tests/latency/test_bootstrap.py checks that 95% intervals cover a
known injected delay in >= 90% of simulated runs with round-correlated noise.

A latency's own interval can be drawn on log latency (`median_ci(..., scale=LOG)`): widened and
back-transformed there, its bounds stay positive however few rounds there are. A difference
keeps the linear scale (it can be negative) and can carry a family-adjusted interval
(Bonferroni: confidence 1 - alpha/m over m comparisons) drawn from the same resamples.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from zgtool.stats import percentile

DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95
MIN_SAMPLES = 3          # below this a resampled median says nothing useful
MIN_ROUNDS = 3           # fewer rounds than this: resample requests (and say so)
MIN_DISTINCT = 3         # fewer distinct values: a resampled median can only land on them, so no interval
_MAX_CELLS = 4_000_000   # resample in chunks above this many floats (memory bound)

NOT_SIGNIFICANT = "not significant"
HIGHER = "higher"
LOWER = "lower"

BY_ROUNDS = "rounds"      # Interval.method: paired cluster bootstrap over rounds
BY_REQUESTS = "requests"  # Interval.method: every request resampled independently
LINEAR = "linear"         # median_ci scale: bootstrap the values themselves
LOG = "log"               # median_ci scale: bootstrap log values, back-transform (bounds stay > 0)


@dataclass(frozen=True)
class Interval:
    """A point estimate with its bootstrap interval; lo/hi are None when n < MIN_SAMPLES."""

    estimate: float
    lo: float | None
    hi: float | None
    confidence: float
    resamples: int
    n: int
    method: str = BY_REQUESTS
    rounds: int | None = None
    note: str | None = None    # why lo/hi are None though n >= MIN_SAMPLES: "no interval (k distinct values)"

    def contains(self, x: float) -> bool:
        return self.lo is None or self.hi is None or self.lo <= x <= self.hi


@dataclass(frozen=True)
class Difference:
    """candidate - baseline of a statistic (e.g. median), with its interval and verdict."""

    interval: Interval
    verdict: str          # HIGHER | LOWER | NOT_SIGNIFICANT
    adjusted: Interval | None = None   # at 1 - (1 - confidence) / family_size; None without an interval

    @property
    def significant(self) -> bool:
        return self.verdict != NOT_SIGNIFICANT

    @property
    def significant_adjusted(self) -> bool:
        """The family-adjusted interval excludes 0 (the same as `significant` for a family of one)."""
        iv = self.adjusted
        return iv is not None and iv.lo is not None and iv.hi is not None and (iv.lo > 0 or iv.hi < 0)


def _ok(v: Any) -> bool:
    return v is not None and not math.isnan(float(v))


def _clean(values: Sequence[float]) -> list[float]:
    return [float(v) for v in values if _ok(v)]


def _clean_grouped(values: Sequence[float], groups: Sequence[Hashable]) -> tuple[list[float], list[Hashable]]:
    if len(values) != len(groups):
        raise ValueError(f"{len(values)} values but {len(groups)} groups")
    pairs = [(float(v), g) for v, g in zip(values, groups, strict=True) if _ok(v)]
    return [v for v, _ in pairs], [g for _, g in pairs]


def _resampled_medians(xs: list[float], resamples: int, rng: Any) -> list[float]:
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


def _weighted_medians(xs: list[float], group_idx: list[int], weights: Any) -> Any:
    """Median of the pooled sample in which every value of group g appears weights[:, g] times,
    for every row of `weights` (resamples x groups); NaN where a row has no value at all.

    Equal to np.median of the expanded sample: the mean of its two middle order statistics."""
    import numpy as np

    order = np.argsort(np.asarray(xs, dtype=np.float64), kind="stable")
    vals = np.asarray(xs, dtype=np.float64)[order]
    w = weights[:, np.asarray(group_idx, dtype=np.int64)[order]]          # [B, N]
    cum = np.cumsum(w, axis=1)
    total = cum[:, -1]
    lo_pos = (total - 1) // 2
    hi_pos = total // 2
    lo_i = np.minimum((cum > lo_pos[:, None]).argmax(axis=1), vals.size - 1)
    hi_i = np.minimum((cum > hi_pos[:, None]).argmax(axis=1), vals.size - 1)
    med = (vals[lo_i] + vals[hi_i]) / 2.0
    return np.where(total > 0, med, np.nan)


def _round_weights(num_rounds: int, resamples: int, rng: Any) -> Any:
    """How often each round is drawn in each resample (R draws with replacement)."""
    import numpy as np

    draws = rng.integers(0, num_rounds, size=(resamples, num_rounds))
    w = np.zeros((resamples, num_rounds), dtype=np.int64)
    np.add.at(w, (np.arange(resamples)[:, None], draws), 1)
    return w


def t_quantile(p: float, df: int) -> float:
    """Student t quantile (Cornish-Fisher expansion in the normal quantile; within 1% for df >= 2)."""
    z = NormalDist().inv_cdf(p)
    if df <= 0:
        return math.inf
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    g4 = (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160
    return z + g1 / df + g2 / df ** 2 + g3 / df ** 3 + g4 / df ** 4


def small_cluster_factor(num_rounds: int, confidence: float) -> float:
    """Widening of a cluster-bootstrap percentile interval built from `num_rounds` clusters."""
    p = 1.0 - (1.0 - confidence) / 2.0
    r = num_rounds
    return t_quantile(p, r - 1) / NormalDist().inv_cdf(p) * math.sqrt(r / (r - 1))


def _bounds(dist: Sequence[float], confidence: float) -> tuple[float, float]:
    alpha = (1.0 - confidence) / 2.0
    clean = [d for d in dist if not math.isnan(d)]
    return percentile(clean, 100.0 * alpha), percentile(clean, 100.0 * (1.0 - alpha))


def _widen(est: float, lo: float, hi: float, factor: float) -> tuple[float, float]:
    return est - (est - lo) * factor, est + (hi - est) * factor


def _check(confidence: float, resamples: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), not {confidence}")
    if resamples < 100:
        raise ValueError(f"at least 100 resamples are needed, not {resamples}")


def _round_index(*group_lists: Sequence[Hashable]) -> dict[Hashable, int]:
    labels: dict[Hashable, int] = {}
    for gs in group_lists:
        for g in gs:
            labels.setdefault(g, len(labels))
    return labels


def median_ci(values: Sequence[float], *, groups: Sequence[Hashable] | None = None,
              confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES,
              seed: int = 0, scale: str = LINEAR) -> Interval:
    """The sample median with a percentile-bootstrap interval; rounds resampled when `groups`
    (each value's round) are given and there are at least MIN_ROUNDS of them.

    scale=LOG (every value > 0): the interval of the median of log values, back-transformed, so
    both bounds are positive; the estimate stays the linear sample median."""
    _check(confidence, resamples)
    if groups is not None:
        xs, gs = _clean_grouped(values, groups)
    else:
        xs, gs = _clean(values), []
    if scale == LOG:
        if any(x <= 0 for x in xs):
            raise ValueError("a log-scale interval needs every value > 0")
        iv = _median_ci([math.log(x) for x in xs], gs, confidence, resamples, seed)
        est = percentile(xs, 50)
        lo = None if iv.lo is None else min(math.exp(iv.lo), est)
        hi = None if iv.hi is None else max(math.exp(iv.hi), est)
        return Interval(est, lo, hi, iv.confidence, iv.resamples, iv.n, iv.method, iv.rounds, iv.note)
    if scale != LINEAR:
        raise ValueError(f"scale must be {LINEAR!r} or {LOG!r}, not {scale!r}")
    return _median_ci(xs, gs, confidence, resamples, seed)


def no_interval(k: int) -> str:
    return f"no interval ({k} distinct value{'s' if k != 1 else ''})"


def _median_ci(xs: list[float], gs: list[Hashable], confidence: float, resamples: int, seed: int) -> Interval:
    import numpy as np

    est = percentile(xs, 50)
    if len(xs) < MIN_SAMPLES:
        return Interval(est, None, None, confidence, 0, len(xs))
    distinct = len(set(xs))
    if distinct < MIN_DISTINCT:
        # every resampled median is one of the values or the mean of two: bounds such as [0.00, 0.00] for a
        # self-report that is always 0, or [0.00, x] for a mix of two values, are the resample's artefact
        return Interval(est, None, None, confidence, 0, len(xs), note=no_interval(distinct))
    rng = np.random.default_rng(seed)
    labels = _round_index(gs)
    if len(labels) >= MIN_ROUNDS:
        w = _round_weights(len(labels), resamples, rng)
        dist = _weighted_medians(xs, [labels[g] for g in gs], w).tolist()
        lo, hi = _widen(est, *_bounds(dist, confidence), small_cluster_factor(len(labels), confidence))
        return Interval(est, lo, hi, confidence, resamples, len(xs), BY_ROUNDS, len(labels))
    lo, hi = _bounds(_resampled_medians(xs, resamples, rng), confidence)
    return Interval(est, lo, hi, confidence, resamples, len(xs), BY_REQUESTS, len(labels) or None)


def median_difference(baseline: Sequence[float], candidate: Sequence[float], *,
                      baseline_groups: Sequence[Hashable] | None = None,
                      candidate_groups: Sequence[Hashable] | None = None,
                      confidence: float = DEFAULT_CONFIDENCE, resamples: int = DEFAULT_RESAMPLES,
                      seed: int = 0, family_size: int = 1) -> Difference:
    """median(candidate) - median(baseline).

    With groups for both (each value's round), the same rounds are drawn for both paths in
    every resample (paired cluster bootstrap); otherwise both are resampled independently,
    request by request. The verdict is HIGHER/LOWER only when the whole interval lies
    above/below zero. `adjusted` is the interval at 1 - (1 - confidence) / family_size, from the
    same resamples (Bonferroni over the family of comparisons a headline picks from).
    """
    import numpy as np

    _check(confidence, resamples)
    if family_size < 1:
        raise ValueError(f"family_size must be at least 1, not {family_size}")
    adj_conf = 1.0 - (1.0 - confidence) / family_size
    paired = baseline_groups is not None and candidate_groups is not None
    if paired:
        assert baseline_groups is not None and candidate_groups is not None
        a, ga = _clean_grouped(baseline, baseline_groups)
        b, gb = _clean_grouped(candidate, candidate_groups)
    else:
        a, b, ga, gb = _clean(baseline), _clean(candidate), [], []
    est = percentile(b, 50) - percentile(a, 50) if a and b else math.nan
    n = min(len(a), len(b))
    if n < MIN_SAMPLES:
        return Difference(Interval(est, None, None, confidence, 0, n), NOT_SIGNIFICANT)
    distinct = len(set(a) | set(b))
    if distinct < MIN_DISTINCT:       # e.g. an engine phase that is 0 on both paths: [+0.00, +0.00] says nothing
        return Difference(Interval(est, None, None, confidence, 0, n, note=no_interval(distinct)), NOT_SIGNIFICANT)
    rng = np.random.default_rng(seed)
    labels = _round_index(ga, gb)
    rounds: int | None
    if paired and len(labels) >= MIN_ROUNDS:
        w = _round_weights(len(labels), resamples, rng)
        da = _weighted_medians(a, [labels[g] for g in ga], w)
        db = _weighted_medians(b, [labels[g] for g in gb], w)
        dist = (db - da).tolist()
        method, rounds = BY_ROUNDS, len(labels)
    else:
        da_l = _resampled_medians(a, resamples, rng)
        db_l = _resampled_medians(b, resamples, rng)
        dist = [y - x for x, y in zip(da_l, db_l, strict=True)]
        method, rounds = BY_REQUESTS, len(labels) or None

    def at(conf: float) -> Interval:
        lo, hi = _bounds(dist, conf)
        if method == BY_ROUNDS:
            lo, hi = _widen(est, lo, hi, small_cluster_factor(len(labels), conf))
        return Interval(est, lo, hi, conf, resamples, n, method, rounds)

    iv = at(confidence)
    assert iv.lo is not None and iv.hi is not None
    verdict = HIGHER if iv.lo > 0 else LOWER if iv.hi < 0 else NOT_SIGNIFICANT
    return Difference(iv, verdict, iv if family_size == 1 else at(adj_conf))
