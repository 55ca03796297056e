"""-c and --rate as typed: one load stays one measurement, a list or `--rate sweep` is a sweep
(zgtool.latency.schedule.sweep.parse_load, point_config)."""

from __future__ import annotations

import pytest

from zgtool.errors import UsageError
from zgtool.latency.analysis.saturation import CONCURRENCY, RATE
from zgtool.latency.config import SplitConfig
from zgtool.latency.schedule.sweep import SweepSpec, parse_load, point_config


def test_one_concurrency_or_one_rate_is_not_a_sweep() -> None:
    assert parse_load("4", None) == (4, None, None)
    assert parse_load(4, None) == (4, None, None)
    assert parse_load("1", "2.5") == (1, "2.5", None)     # one rate: parsed where it always was


def test_lists_are_sweeps_in_ascending_order() -> None:
    c, r, spec = parse_load("16,1,4", None)
    assert (c, r) == (1, None) and spec == SweepSpec(CONCURRENCY, (1.0, 4.0, 16.0))
    c, r, spec = parse_load("1", "8, 1,2rps,4")
    assert (c, r) == (1, None) and spec == SweepSpec(RATE, (1.0, 2.0, 4.0, 8.0))
    assert parse_load("1", "SWEEP")[2] == SweepSpec(RATE, auto=True)


@pytest.mark.parametrize(("c", "rate", "says"), [
    ("1", "1,x", "'x' is not a number"),
    ("0,2", None, "every load must be positive, not 0"),
    ("1,2.5", None, "'2.5' is not a whole number"),
    ("2,2", None, "listed twice"),
    ("1,4", "sweep", "sweep one load axis at a time"),
    ("1,4", "1,2", "sweep one load axis at a time"),
    ("4", "sweep", "capped by --max-in-flight"),
    ("1,4", "3", "a rate is open loop"),
    ("1", "1,", "'' is not a number"),
    ("1", "-1,2", "every load must be positive"),
])
def test_bad_loads_are_one_line_usage_errors(c: str, rate: str | None, says: str) -> None:
    with pytest.raises(UsageError) as exc:
        parse_load(c, rate)
    assert says in exc.value.message and "\n" not in exc.value.message


def test_a_concurrency_point_keeps_every_stream_busy() -> None:
    cfg = SplitConfig(num_requests=6)
    one, sixteen = point_config(cfg, CONCURRENCY, 1), point_config(cfg, CONCURRENCY, 16)
    assert (one.concurrency, one.num_requests) == (1, 6)
    assert (sixteen.concurrency, sixteen.num_requests, sixteen.effective_rounds) == (16, 32, 1)
    assert point_config(SplitConfig(num_requests=200), CONCURRENCY, 4).effective_rounds == 12


def test_a_rate_point_is_open_loop_at_that_rate_for_long_enough() -> None:
    p = point_config(SplitConfig(num_requests=40), RATE, 2.0)
    assert p.open_loop and p.rate_rps == 2.0 and p.concurrency == 1 and p.num_requests == 40
    assert p.effective_rounds == 1                        # one steady block per path, not bursts
    fast = point_config(SplitConfig(num_requests=40), RATE, 80.0)
    assert fast.num_requests == 400                       # 5 s of sends: past a batching engine's batch
    assert point_config(SplitConfig(num_requests=40, rounds=2), RATE, 2.0).effective_rounds == 2
