"""Open-loop schedules and their bad input: no server needed (the CLI cases send nothing)."""

from __future__ import annotations

import statistics
import threading

import pytest
from zgtest import run_zgtool

from zgtool.errors import UsageError
from zgtool.latency.analysis.openloop import LAG_P99_LIMIT_MS, summarize_open_loop
from zgtool.latency.config import SplitConfig
from zgtool.latency.records import RequestSample
from zgtool.latency.schedule.arrivals import arrival_offsets_s, block_schedule, check_schedule, parse_rate
from zgtool.latency.schedule.openloop import DispatchRecord, block_seed


def test_constant_arrivals_are_evenly_spaced_from_zero() -> None:
    offsets = arrival_offsets_s(9, 20.0, "constant")
    assert offsets[0] == 0.0
    gaps = [b - a for a, b in zip(offsets, offsets[1:], strict=False)]
    assert all(g == pytest.approx(0.05, abs=1e-12) for g in gaps)


def test_poisson_schedule_is_reproducible_from_its_seed_and_has_the_asked_mean_gap() -> None:
    a = arrival_offsets_s(2000, 50.0, "poisson", seed=7)
    assert a == arrival_offsets_s(2000, 50.0, "poisson", seed=7)
    assert a != arrival_offsets_s(2000, 50.0, "poisson", seed=8)
    assert a[0] == 0.0 and list(a) == sorted(a)
    gaps = [b - a for a, b in zip(a, a[1:], strict=False)]
    # 1999 exponential gaps of mean 20 ms: the sample mean is within 3 standard errors (deterministic seed)
    assert statistics.fmean(gaps) == pytest.approx(0.02, abs=3 * 0.02 / len(gaps) ** 0.5)
    assert statistics.stdev(gaps) == pytest.approx(0.02, rel=0.15)   # exponential: sd = mean


def test_every_target_of_a_round_gets_the_same_draw_and_rounds_differ() -> None:
    assert block_seed(3, 1) == block_seed(3, 1)
    assert len({block_seed(3, r) for r in range(16)}) == 16


def test_a_slice_of_an_explicit_schedule_is_rebased_to_its_block_start() -> None:
    assert block_schedule([1.5, 1.75, 3.0]) == (0.0, 0.25, 1.5)
    assert check_schedule([0.0, 0.5, 0.4]) is not None
    assert check_schedule([0.0, -1.0]) is not None
    assert check_schedule([0.0, float("nan")]) is not None
    assert check_schedule([0.0, 0.0, 2.0]) is None


@pytest.mark.parametrize("kwargs, words", [
    ({"rate_rps": 0.0}, "--rate"),
    ({"rate_rps": -1.0}, "--rate"),
    ({"rate_rps": 5.0, "arrivals": "foo"}, "--arrivals"),
    ({"rate_rps": 5.0, "concurrency": 4}, "--max-in-flight"),
    ({"rate_rps": 5.0, "max_in_flight": -1}, "--max-in-flight"),
    ({"num_requests": 3, "schedule_s": (0.0, 1.0)}, "2 send times for 3"),
    ({"num_requests": 2, "schedule_s": (1.0, 0.5)}, "earlier"),
])
def test_open_loop_config_refuses_bad_values(kwargs: dict, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        SplitConfig(**kwargs)


def test_parse_rate_takes_one_positive_number() -> None:
    assert parse_rate("12.5") == 12.5
    for bad in ("0", "-1", "abc", "inf", "nan"):
        with pytest.raises(UsageError, match="--rate"):
            parse_rate(bad)


@pytest.mark.parametrize("args, words", [
    (["--rate", "0"], "--rate"),
    (["--rate", "-1"], "--rate"),
    (["--rate", "fast"], "--rate"),
    (["--rate", "5", "--arrivals", "foo"], "--arrivals"),
    (["--rate", "5", "-c", "4"], "--max-in-flight"),
])
def test_bad_open_loop_options_exit_2_with_one_line_and_send_nothing(
        closed_port_url: str, args: list[str], words: str) -> None:
    # a closed port: had anything been sent, the answer would be "cannot connect" (exit 3), not a usage error
    r = run_zgtool("latency-split", closed_port_url, "--api", "openai", "--model", "m", *args)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and words in lines[0], r.stderr
    assert "cannot connect" not in r.stderr


def _sample(i: int, rnd: int, due_s: float, sent_s: float, waited: bool = False) -> RequestSample:
    s = RequestSample(index=i, worker=0, round=rnd, ok=True, start_s=sent_s, total_ms=1.0)
    s.scheduled_s, s.dispatch_lag_ms, s.waited_for_worker = due_s, (sent_s - due_s) * 1e3, waited
    return s


def test_a_client_on_schedule_is_not_flagged_and_one_sending_late_is() -> None:
    cfg = SplitConfig(num_requests=20, rate_rps=100.0, arrivals="constant")
    on_time = [_sample(i, 0, i / 100, i / 100 + 0.0002) for i in range(20)]
    o = summarize_open_loop(on_time, cfg, DispatchRecord(blocks=1, wall_s=0.2, cpu_s=0.02, workers_max=2,
                                                         max_in_flight=256))
    assert not o.load_generator_behind and o.reason is None
    assert o.scheduled_rate_rps == pytest.approx(100.0) and o.achieved_rate_rps == pytest.approx(100.0, rel=0.01)
    assert o.client_cpu_share == pytest.approx(0.1)
    # the same schedule sent at half the pace: every send 5 ms later than the one before it
    late = [_sample(i, 0, i / 100, i / 50) for i in range(20)]
    o = summarize_open_loop(late, cfg)
    assert o.load_generator_behind
    assert o.achieved_rate_rps == pytest.approx(50.0, rel=0.01)
    assert "against a schedule of 100.0 req/s" in (o.reason or "")
    assert f"> {LAG_P99_LIMIT_MS:g} ms" in (o.reason or "")


def test_one_late_request_in_a_short_block_is_within_the_count_slack() -> None:
    """4 requests 10 ms apart, the last one 2 ms late: 3 sends in 32 ms is 94% of the rate, but one
    request of slack keeps it from being called behind (the lag rule still sees a real delay)."""
    cfg = SplitConfig(num_requests=4, rate_rps=100.0, arrivals="constant")
    s = [_sample(i, 0, i / 100, i / 100) for i in range(3)] + [_sample(3, 0, 0.03, 0.032)]
    o = summarize_open_loop(s, cfg)
    assert "req/s against a schedule" not in (o.reason or "")


def test_a_request_that_waited_for_a_worker_is_flagged() -> None:
    cfg = SplitConfig(num_requests=3, rate_rps=10.0)
    s = [_sample(0, 0, 0.0, 0.0), _sample(1, 0, 0.1, 0.1, waited=True), _sample(2, 0, 0.2, 0.2)]
    o = summarize_open_loop(s, cfg, DispatchRecord(max_in_flight=1))
    assert o.load_generator_behind and o.waited_for_worker == 1
    assert "1 request(s) were due while every worker was busy (max in flight 1)" in (o.reason or "")


def test_open_loop_throughput_counts_a_block_as_k_gaps_of_its_schedule_not_k_minus_one() -> None:
    from zgtool.latency.analysis.phases import measured_duration_s

    # two blocks of 5 sends at 20 req/s (0.05 s apart), each answered in 2 ms: 10 requests over 0.5 s
    samples = []
    for rnd, t0 in ((0, 0.0), (1, 1.0)):
        for k in range(5):
            due = t0 + 0.05 * k
            samples.append(RequestSample(index=len(samples), worker=0, round=rnd, ok=True, start_s=due + 0.0003,
                                         total_ms=2.0, scheduled_s=due))
    assert measured_duration_s(samples) == pytest.approx(0.5, abs=0.002)
    closed = [RequestSample(index=s.index, worker=0, round=s.round, ok=True, start_s=s.start_s, total_ms=2.0)
              for s in samples]
    assert measured_duration_s(closed) == pytest.approx(2 * (0.2 + 0.002), abs=1e-9)   # first start -> last end


class _CountingSession:
    """A stand-in for one worker's keep-alive Session: records which worker answered, waits on `gate` if set."""

    def __init__(self, used: list[int], gate: threading.Barrier | None) -> None:
        self.used, self.gate = used, gate

    def measure(self, index: int, worker: int, rnd: int, t_run0_ns: int) -> RequestSample:
        if self.gate is not None:
            self.gate.wait(timeout=30)
        self.used.append(worker)
        return RequestSample(index=index, worker=worker, round=rnd, ok=True, total_ms=1.0)

    def close(self) -> None:
        pass


def _run_pool(n: int, gate: threading.Barrier | None, quiet_before: set[int]) -> tuple[list[int], int]:
    """n requests due at once through one WorkerPool; before request k in quiet_before, every worker is idle
    again. Returns the workers that answered and the pool's size."""
    from time import perf_counter_ns

    from zgtest import wait_until

    from zgtool.latency.schedule.openloop import WorkerPool, run_block

    used: list[int] = []
    pool = WorkerPool(lambda: _CountingSession(used, gate), 256, perf_counter_ns())
    sent = iter(range(n))

    def before_send() -> None:
        if next(sent) in quiet_before:
            wait_until(lambda: len(pool.idle) == pool.size, 30, "every worker idle again")

    out: list[RequestSample] = []
    try:
        run_block(pool, 0, [0.0] * n, 0, out, DispatchRecord(), before_send=before_send)
    finally:
        pool.close()
    assert sorted(s.index for s in out) == list(range(n))
    return used, pool.size


def test_requests_one_after_another_ride_one_warm_connection_not_one_per_idle_worker() -> None:
    # each request is sent once the last is answered: the worker that answered it (its keep-alive connection
    # open) takes the next, where a shared queue handed them round the 16 idle workers, each connecting anew
    used, size = _run_pool(12, None, quiet_before=set(range(1, 12)))
    assert size >= 16 and len(set(used)) == 1


def test_overlapping_requests_use_as_many_workers_as_are_in_flight() -> None:
    # three at once, twice: the three workers that just went idle take the second three
    used, _ = _run_pool(6, threading.Barrier(3), quiet_before={3})
    assert len(set(used)) == 3 and set(used[:3]) == set(used[3:])


def test_the_lag_limit_grows_with_the_gap_between_arrivals_so_a_busy_boxs_few_ms_at_2_rps_is_on_schedule() -> None:
    """At 2 req/s a send 8 ms late (a busy box's run queue) shifts an arrival by 1.6% of its 500 ms gap: the
    server still saw the asked load. The limit is 5% of the gap there (25 ms); 5 ms at 10 req/s and above."""
    from zgtool.latency.analysis.openloop import lag_limit_ms

    assert lag_limit_ms(2.0) == pytest.approx(25.0)
    assert lag_limit_ms(10.0) == lag_limit_ms(200.0) == lag_limit_ms(None) == LAG_P99_LIMIT_MS
    cfg = SplitConfig(num_requests=40, rate_rps=2.0, arrivals="constant")
    busy = [_sample(i, 0, i / 2, i / 2 + (0.0086 if i in (7, 31) else 0.0007)) for i in range(40)]
    o = summarize_open_loop(busy, cfg)
    assert o.dispatch_lag_p99_ms is not None and o.dispatch_lag_p99_ms > LAG_P99_LIMIT_MS
    assert not o.load_generator_behind and o.reason is None and o.lag_limit_ms == pytest.approx(25.0)
    # the same run with two sends 60 ms late: over the limit, flagged and the reason names it
    late = [_sample(i, 0, i / 2, i / 2 + (0.060 if i in (7, 31) else 0.0007)) for i in range(40)]
    o = summarize_open_loop(late, cfg)
    assert o.load_generator_behind and "dispatch lag p99" in (o.reason or "") and "> 25 ms" in (o.reason or "")
    # an explicit schedule (a dataset's arrivals) is judged by the rate it draws
    sched = SplitConfig(num_requests=40, schedule_s=tuple(i / 2 for i in range(40)))
    assert summarize_open_loop(busy, sched).lag_limit_ms == pytest.approx(25.0)
