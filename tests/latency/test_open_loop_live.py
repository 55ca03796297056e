"""Open-loop latency-split against real local servers: the null engine, and a slow origin for a client that
cannot keep up. Assertions are on counts and schedules, never on how fast this machine is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
from zgtest import ZGTOOL, run_zgtool, wait_until

from zgtool.latency.analysis.openloop import summarize_open_loop
from zgtool.latency.config import SplitConfig
from zgtool.latency.records import RequestSample
from zgtool.latency.schedule.openloop import OpenLoopLog
from zgtool.latency.schedule.runner import measure_targets
from zgtool.targets import Target

FIXTURE = Path(__file__).with_name("fixture_server.py")


def _healthy(url: str) -> bool:
    import httpx

    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def null_engine() -> Iterator[str]:
    from zgtool.http.net import free_port

    port = free_port()
    proc = subprocess.Popen([*ZGTOOL, "serve", "--model", "null", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: proc.poll() is not None or _healthy(url), 90, "the null engine's /health")
        if proc.poll() is not None:
            pytest.fail(f"null engine did not start: {proc.stderr.read().decode() if proc.stderr else ''}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def slow_origin() -> Iterator[str]:
    """Streams each token 50 ms apart (asyncio sleeps: slow without taking CPU)."""
    proc = subprocess.Popen([sys.executable, str(FIXTURE), "origin", "--token-delay-ms", "50"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = proc.stdout.readline() if proc.stdout else ""
    assert line.startswith("PORT "), line
    yield f"http://127.0.0.1:{int(line.split()[1])}"
    proc.terminate()
    proc.wait(timeout=10)


def _engine(url: str, name: str = "engine") -> Target:
    return Target(name, url)


def _by_round(samples: list[RequestSample]) -> dict[int, list[RequestSample]]:
    out: dict[int, list[RequestSample]] = defaultdict(list)
    for s in samples:
        out[s.round].append(s)
    return out


def test_constant_rate_sends_every_request_on_its_schedule_and_says_whether_it_kept_it(null_engine: str) -> None:
    cfg = SplitConfig(num_requests=24, warmup=1, stream=True, rate_rps=40.0, arrivals="constant", rounds=3,
                      resamples=100)
    log = OpenLoopLog()
    (samples,) = measure_targets([_engine(null_engine)], cfg, open_loop=log)
    assert [s.index for s in samples] == list(range(24)) and all(s.ok for s in samples)
    for block in _by_round(samples).values():
        due = sorted(s.scheduled_s for s in block if s.scheduled_s is not None)
        assert len(due) == 8
        assert all(b - a == pytest.approx(0.025, abs=1e-6) for a, b in zip(due, due[1:], strict=False))
    for s in samples:
        assert s.dispatch_lag_ms is not None and s.dispatch_lag_ms >= 0   # never sent before it was due
        assert s.start_s >= s.scheduled_s
        # from due time is never less than from actual send, and differs by exactly the lag
        assert s.total_from_scheduled_ms is not None and s.total_ms is not None
        assert s.total_from_scheduled_ms >= s.total_ms
        # total counts from the request's start: it adds the start's lag; the dispatch lag runs on to when the
        # first byte left (issue 38), so it holds that lag and any slip between the start and the send
        start_lag_ms = (s.start_s - s.scheduled_s) * 1e3
        assert s.total_from_scheduled_ms - s.total_ms == pytest.approx(start_lag_ms, abs=1e-6)
        assert s.dispatch_lag_ms >= start_lag_ms - 1e-6
        assert s.ttft_from_scheduled_ms is not None and s.ttft_ms is not None
        assert s.ttft_from_scheduled_ms >= s.ttft_ms
    o = summarize_open_loop(samples, cfg, log.records["engine"])
    assert o.requests_sent == 24 and o.target_rate_rps == 40.0
    assert o.scheduled_rate_rps == pytest.approx(40.0, rel=1e-4)
    assert o.achieved_rate_rps is not None and o.achieved_rate_rps <= o.scheduled_rate_rps * (1 + 1e-9)
    assert o.client_cpu_s is not None and o.client_cpu_s > 0 and o.workers_max is not None
    assert o.in_flight_max is not None and 1 <= o.in_flight_max <= o.workers_max
    # the flag tells the truth either way: no silent shortfall on a busy machine
    kept = o.achieved_rate_rps >= 0.95 * o.scheduled_rate_rps
    assert o.load_generator_behind or kept
    assert o.load_generator_behind == (o.reason is not None)


def test_an_explicit_schedule_is_followed_block_by_block(null_engine: str) -> None:
    schedule = (0.0, 0.01, 0.05, 0.06, 0.2, 0.23)
    cfg = SplitConfig(num_requests=6, warmup=0, stream=False, schedule_s=schedule, rounds=2, resamples=100)
    (samples,) = measure_targets([_engine(null_engine)], cfg)
    blocks = _by_round(samples)
    for rnd, want in ((0, (0.0, 0.01, 0.05)), (1, (0.0, 0.14, 0.17))):
        due = sorted(s.scheduled_s for s in blocks[rnd] if s.scheduled_s is not None)
        assert [d - due[0] for d in due] == pytest.approx(list(want), abs=1e-6)
    o = summarize_open_loop(samples, cfg)
    assert o.arrivals == "schedule" and o.target_rate_rps is None


def test_a_client_with_one_worker_against_a_slow_target_is_flagged_behind(slow_origin: str) -> None:
    """Each answer takes >= 16 x 50 ms; one worker cannot send 20 req/s, so requests wait for it."""
    cfg = SplitConfig(num_requests=6, warmup=0, stream=True, rate_rps=20.0, arrivals="constant", rounds=1,
                      max_in_flight=1, resamples=100)
    log = OpenLoopLog()
    (samples,) = measure_targets([Target("slow", slow_origin, api="anthropic", model="m")], cfg, open_loop=log)
    o = summarize_open_loop(samples, cfg, log.records["slow"])
    assert o.load_generator_behind
    assert o.waited_for_worker >= 4 and o.workers_max == 1 and o.in_flight_max == 1
    assert o.achieved_rate_rps is not None and o.achieved_rate_rps < 0.95 * 20.0
    assert "every worker was busy (max in flight 1)" in (o.reason or "")
    # and the latency from due time shows the queue the client hid
    late = max(samples, key=lambda s: s.scheduled_s or 0)
    assert late.total_from_scheduled_ms is not None and late.total_ms is not None
    assert late.total_from_scheduled_ms > late.total_ms


def test_a_dispatcher_slowed_by_a_cpu_hog_is_flagged_behind(null_engine: str) -> None:
    """Each hand-off first burns 20 ms of CPU in the dispatcher: 100 req/s cannot be kept."""

    def hog() -> None:      # this thread's own CPU time: at least 20 ms of wall time per send
        end = time.thread_time() + 0.02
        while time.thread_time() < end:
            pass

    cfg = SplitConfig(num_requests=10, warmup=0, stream=False, rate_rps=100.0, arrivals="constant", rounds=1,
                      resamples=100)
    log = OpenLoopLog(before_send=hog)
    (samples,) = measure_targets([_engine(null_engine)], cfg, open_loop=log)
    o = summarize_open_loop(samples, cfg, log.records["engine"])
    assert o.load_generator_behind
    assert o.achieved_rate_rps is not None and o.achieved_rate_rps < 0.95 * 100.0
    assert o.dispatch_lag_max_ms is not None and o.dispatch_lag_max_ms >= 9 * (20 - 10)   # 10 ms behind per send
    assert "against a schedule of 100.0 req/s" in (o.reason or "")
    assert o.waited_for_worker == 0          # the client itself, not its pool


def test_latency_split_rate_prints_the_schedule_check_and_writes_it_to_json(null_engine: str, tmp_path: Path) -> None:
    """An A/A run at a feasible rate: both targets get the same Poisson draw per round (paired)."""
    out = tmp_path / "r.json"
    r = run_zgtool("latency-split", null_engine, null_engine, "--api", "anthropic", "-n", "12",
                   "--rounds", "3", "--warmup", "1", "--no-stream", "--rate", "30", "--arrivals", "poisson",
                   "-o", out)
    assert r.returncode in (0, 5), r.stderr      # 5: this (busy) machine's client fell behind, and said so
    assert "Open loop (poisson arrivals; lag limit 5 ms):" in r.stdout
    assert "req/s schedule (target 30)" in r.stdout and "from due time p50" in r.stdout
    # each path's title says how it was loaded: the rate and the pool it grew to, not -c's one connection
    assert "open loop 30 req/s, keep-alive, " in r.stdout and " workers, ok " in r.stdout and "keep-alive, 1 conn" not in r.stdout
    data = json.loads(out.read_text())["data"]
    assert data["config"]["open_loop"]["rate_rps"] == 30.0
    targets = data["targets"]
    for t in targets:
        o = t["open_loop"]
        assert o["requests_sent"] == 12 and o["target_rate_rps"] == 30.0
        assert {"dispatch_lag_p50_ms", "dispatch_lag_p99_ms", "dispatch_lag_max_ms", "client_cpu_share",
                "achieved_rate_rps", "load_generator_behind"} <= set(o)
        if r.returncode == 5:
            assert "fell behind" in r.stderr
        assert (r.returncode == 5) == any(x["open_loop"]["load_generator_behind"] for x in targets)
        assert all(s["total_from_scheduled_ms"] >= s["total_ms"] for s in t["samples"])

    def relative(t: dict, rnd: int) -> list[float]:
        due = sorted(s["scheduled_s"] for s in t["samples"] if s["round"] == rnd)
        return [d - due[0] for d in due]

    for rnd in range(3):
        assert relative(targets[0], rnd) == pytest.approx(relative(targets[1], rnd), abs=1e-6)


def test_a_bug_in_a_worker_stops_the_run_instead_of_hanging_it(null_engine: str) -> None:
    class Broken:
        def before(self) -> None:
            raise RuntimeError("hook bug")

        def after(self, token: object, sample: RequestSample) -> None:
            pass

    cfg = SplitConfig(num_requests=4, warmup=0, stream=False, rate_rps=50.0, rounds=1, resamples=100)
    with pytest.raises(RuntimeError, match="hook bug"):
        measure_targets([_engine(null_engine)], cfg, hooks=[Broken()])
