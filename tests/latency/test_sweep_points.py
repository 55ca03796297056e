"""Per-point figures of an open-loop sweep point from its samples (zgtool.latency.schedule.sweep.answered_rps):
the rate the answers kept, robust to one slow answer, falling to the service rate once a queue grows."""

from __future__ import annotations

import pytest

from zgtool.latency.records import RequestSample
from zgtool.latency.schedule.sweep import answered_rps


def _served(rate_rps: float, n: int, service_s: float, *, servers: int = 1, rnd: int = 0,
            slow: dict[int, float] | None = None) -> list[RequestSample]:
    """n requests due every 1/rate s, served first come first served by `servers` of `service_s` each."""
    free = [0.0] * servers
    out = []
    for i in range(n):
        due = i / rate_rps
        k = min(range(servers), key=lambda j: free[j])
        start = max(due, free[k])
        end = start + service_s + (slow or {}).get(i, 0.0)
        free[k] = end
        s = RequestSample(index=i, worker=0, round=rnd, ok=True, start_s=due, total_ms=(end - due) * 1e3)
        s.scheduled_s, s.total_from_scheduled_ms = due, (end - due) * 1e3
        out.append(s)
    return out


def test_a_path_that_keeps_up_answers_at_the_schedules_rate() -> None:
    assert answered_rps(_served(10, 24, 0.05)) == pytest.approx(10, rel=1e-6)


def test_one_slow_answer_is_not_a_queue() -> None:
    # the last request of the block took 1.5 s longer: first-to-last answer spans would read 6 req/s
    assert answered_rps(_served(10, 24, 0.05, slow={23: 1.5})) == pytest.approx(10, rel=1e-6)


def test_a_saturated_path_answers_at_its_service_rate() -> None:
    # 20 req/s offered to one server of 100 ms: it answers 10 req/s, the queue growing all block long
    assert answered_rps(_served(20, 40, 0.1)) == pytest.approx(10, rel=0.1)
    # two servers of 100 ms: 20 req/s capacity, 40 offered
    assert answered_rps(_served(40, 80, 0.1, servers=2)) == pytest.approx(20, rel=0.1)


def test_blocks_add_up_and_failed_or_unscheduled_requests_do_not_count() -> None:
    two = _served(10, 12, 0.05, rnd=0) + _served(10, 12, 0.05, rnd=1)
    failed = RequestSample(index=99, worker=0, round=0, ok=False)
    assert answered_rps([*two, failed]) == pytest.approx(10, rel=1e-6)
    assert answered_rps([RequestSample(index=0, worker=0, round=0, ok=True, total_ms=5.0)]) is None
