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
    # one distinct value: no interval rather than a degenerate [0, 0] (issue 38)
    assert (d.interval.lo, d.interval.hi) == (None, None) and d.interval.note == "no interval (1 distinct value)"


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


# --- the interval's coverage when requests of one round share machine state (issue 15) ---------

def _simulated_run(rng: random.Random, *, rounds: int, per_round: int, delay_ms: float,
                   block_sd_ms: float, shared_sd_ms: float) -> tuple[list[float], list[int], list[float], list[int]]:
    """One latency-split run as the runner lays it out: per round a block of the baseline, then one
    of the candidate. Each round shifts both blocks alike (shared state) and each block on its own
    (a busy second that hits one path's block); requests add a skewed noise of their own."""
    a, ga, b, gb = [], [], [], []
    for r in range(rounds):
        shared = rng.gauss(0.0, shared_sd_ms)
        block_a, block_b = rng.gauss(0.0, block_sd_ms), rng.gauss(0.0, block_sd_ms)
        for _ in range(per_round):
            a.append(20.0 + shared + block_a + rng.gammavariate(2.0, 0.5))
            ga.append(r)
            b.append(20.0 + delay_ms + shared + block_b + rng.gammavariate(2.0, 0.5))
            gb.append(r)
    return a, ga, b, gb


def _coverage(runs: int, paired: bool, **kw: float) -> float:
    hits = 0
    for seed in range(runs):
        a, ga, b, gb = _simulated_run(random.Random(seed), **kw)  # type: ignore[arg-type]
        if paired:
            d = median_difference(a, b, baseline_groups=ga, candidate_groups=gb, resamples=400, seed=seed)
        else:
            d = median_difference(a, b, resamples=400, seed=seed)
        hits += d.interval.contains(kw["delay_ms"])
    return hits / runs


def test_round_resampled_interval_covers_a_known_delay_at_its_stated_level() -> None:
    cov = _coverage(200, True, rounds=8, per_round=4, delay_ms=1.0, block_sd_ms=1.0, shared_sd_ms=2.0)
    assert cov >= 0.90, cov


def test_round_resampled_interval_covers_with_few_rounds_too() -> None:
    cov = _coverage(200, True, rounds=4, per_round=8, delay_ms=1.0, block_sd_ms=1.0, shared_sd_ms=0.5)
    assert cov >= 0.90, cov


def test_request_resampling_undercovers_when_rounds_are_correlated() -> None:
    # the defect the round bootstrap fixes: independent resampling calls too much significant
    cov = _coverage(200, False, rounds=8, per_round=4, delay_ms=1.0, block_sd_ms=1.0, shared_sd_ms=0.0)
    assert cov < 0.88, cov


def test_without_round_noise_the_round_interval_is_not_much_wider() -> None:
    widths = {}
    for paired in (True, False):
        total = 0.0
        for seed in range(40):
            a, ga, b, gb = _simulated_run(random.Random(seed), rounds=8, per_round=4, delay_ms=1.0,
                                          block_sd_ms=0.0, shared_sd_ms=0.0)
            d = (median_difference(a, b, baseline_groups=ga, candidate_groups=gb, resamples=400, seed=seed)
                 if paired else median_difference(a, b, resamples=400, seed=seed))
            assert d.interval.lo is not None and d.interval.hi is not None
            total += d.interval.hi - d.interval.lo
        widths[paired] = total
    assert widths[True] < 1.6 * widths[False], widths


def test_rounds_are_paired_so_a_shift_shared_by_both_paths_cancels() -> None:
    rng = random.Random(4)
    a, ga, b, gb = [], [], [], []
    for r in range(6):
        shift = 50.0 * r                      # huge drift between rounds, identical for both paths
        for _ in range(5):
            x = rng.gauss(0.0, 0.1)
            a.append(10.0 + shift + x)
            b.append(10.5 + shift + x)
            ga.append(r)
            gb.append(r)
    d = median_difference(a, b, baseline_groups=ga, candidate_groups=gb)
    assert d.interval.method == "rounds" and d.interval.rounds == 6
    assert d.verdict == HIGHER and d.interval.lo is not None and d.interval.lo > 0


def test_fewer_than_three_rounds_fall_back_to_request_resampling() -> None:
    xs = [float(i) for i in range(20)]
    d = median_difference(xs, xs, baseline_groups=[i % 2 for i in range(20)],
                          candidate_groups=[i % 2 for i in range(20)])
    assert d.interval.method == "requests"
    assert median_ci(xs, groups=[0] * 20).method == "requests"
    assert median_ci(xs, groups=[i % 4 for i in range(20)]).method == "rounds"


def test_more_requests_bring_more_rounds_and_a_narrower_interval_when_blocks_drift() -> None:
    # on a real box each block drifts on its own (A/A total_ms at -n 400: ±1.4 ms over 16 rounds, ±0.45 ms
    # over 80): requests added inside 16 rounds barely narrow the paired interval, added rounds do
    from zgtool.latency.config import auto_rounds

    assert auto_rounds(50, 1) == 12 and auto_rounds(64, 1) == 16          # the defaults, as before
    assert auto_rounds(400, 1) == 50 and auto_rounds(2000, 8) == 31 and auto_rounds(200, 8) == 16
    for n, c in ((200, 1), (400, 1), (1000, 4), (4000, 8)):
        assert n // (auto_rounds(n, c) * c) >= 8       # past 16 rounds, at most one warm-up in 9 requests

    def width(rounds: int) -> float:
        total = 0.0
        for seed in range(20):
            a, ga, b, gb = _simulated_run(random.Random(seed), rounds=rounds, per_round=400 // rounds, delay_ms=0.0,
                                          block_sd_ms=1.0, shared_sd_ms=0.5)
            d = median_difference(a, b, baseline_groups=ga, candidate_groups=gb, resamples=400, seed=seed)
            assert d.interval.lo is not None and d.interval.hi is not None
            total += d.interval.hi - d.interval.lo
        return total / 20

    assert width(auto_rounds(400, 1)) < 0.7 * width(16)
