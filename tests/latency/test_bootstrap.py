"""zgtool.bootstrap and zgtool.stats on distributions whose answers are known."""

from __future__ import annotations

import math
import random

import pytest

from zgtool.bootstrap import HIGHER, LOWER, NOT_SIGNIFICANT, median_ci, median_difference
from zgtool.stats import percentile, summarize


def test_percentiles_of_a_uniform_grid_are_the_grid_points() -> None:
    xs = list(range(101))  # 0..100: the p-th percentile is exactly p
    random.Random(1).shuffle(xs)
    for p in (50, 90, 95, 99):
        assert percentile(xs, p) == pytest.approx(p)
    s = summarize(xs)
    assert s["mean"] == pytest.approx(50) and s["p99"] == pytest.approx(99)
    assert s["stddev"] == pytest.approx(math.sqrt(sum((x - 50) ** 2 for x in xs) / 100))


def test_median_ci_of_a_normal_sample_covers_the_true_median_with_the_expected_width() -> None:
    rng = random.Random(7)
    xs = [rng.gauss(100.0, 10.0) for _ in range(400)]
    ci = median_ci(xs)
    assert ci.estimate == pytest.approx(percentile(xs, 50))
    assert ci.lo is not None and ci.hi is not None
    assert ci.lo <= 100.0 <= ci.hi
    # asymptotic SE of a normal median = 1.2533 * sigma / sqrt(n) -> 95% width ~ 2.46
    assert 1.5 < ci.hi - ci.lo < 3.5


def test_median_ci_covers_the_true_median_in_most_repeated_experiments() -> None:
    # exponential(scale 2): median = 2 ln 2; nominal 95% coverage, allow sampling slack
    true_median = 2 * math.log(2)
    hits = 0
    for seed in range(60):
        rng = random.Random(seed)
        xs = [rng.expovariate(0.5) for _ in range(120)]
        ci = median_ci(xs, resamples=1000, seed=seed)
        hits += ci.lo <= true_median <= ci.hi
    assert hits >= 51  # P(hits < 51 | p=0.95, n=60) < 0.5%


def test_median_ci_is_reproducible_for_a_seed() -> None:
    xs = [float(i % 17) for i in range(200)]
    assert median_ci(xs, seed=3) == median_ci(xs, seed=3)


def test_identical_samples_are_not_significant() -> None:
    rng = random.Random(2)
    xs = [rng.lognormvariate(0, 0.5) for _ in range(300)]
    d = median_difference(xs, list(xs))
    assert d.verdict == NOT_SIGNIFICANT and not d.significant
    assert d.interval.estimate == 0.0
    assert d.interval.lo <= 0.0 <= d.interval.hi


def test_constant_identical_samples_are_not_significant() -> None:
    d = median_difference([5.0] * 50, [5.0] * 50)
    assert d.verdict == NOT_SIGNIFICANT
    assert (d.interval.lo, d.interval.hi) == (0.0, 0.0)


def test_a_real_shift_is_detected_in_its_direction_with_an_interval_around_it() -> None:
    rng = random.Random(3)
    base = [rng.gauss(10.0, 1.0) for _ in range(200)]
    slower = [x + 5.0 for x in base]  # the same sample shifted: the true difference is exactly 5
    up = median_difference(base, slower)
    assert up.interval.estimate == pytest.approx(5.0)
    assert up.verdict == HIGHER and 4.0 < up.interval.lo <= 5.0 <= up.interval.hi < 6.0
    down = median_difference(slower, base)
    assert down.verdict == LOWER and down.interval.hi < 0


def test_two_samples_of_one_distribution_are_usually_not_significant() -> None:
    significant = 0
    for seed in range(30):
        rng = random.Random(100 + seed)
        a = [rng.gauss(0, 1) for _ in range(100)]
        b = [rng.gauss(0, 1) for _ in range(100)]
        significant += median_difference(a, b, resamples=1000, seed=seed).significant
    assert significant <= 5  # nominal false-positive rate 5%: 1.5 expected


def test_too_few_samples_give_no_interval_and_no_verdict() -> None:
    ci = median_ci([1.0, 2.0])
    assert ci.lo is None and ci.hi is None and ci.n == 2
    assert median_difference([1.0, 2.0], [10.0, 11.0]).verdict == NOT_SIGNIFICANT


def test_nan_and_none_are_ignored() -> None:
    ci = median_ci([1.0, float("nan"), 2.0, None, 3.0])  # type: ignore[list-item]
    assert ci.n == 3 and ci.estimate == 2.0


def test_bad_confidence_is_rejected() -> None:
    with pytest.raises(ValueError):
        median_ci([1.0, 2.0, 3.0], confidence=1.5)
