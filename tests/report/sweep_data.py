"""A real latency_sweep result file built from PointSummary records (two paths, five rates)."""

from __future__ import annotations

from pathlib import Path

from zgtool.latency.analysis.saturation import RATE
from zgtool.latency.schedule.sweep import PointSummary, SweepResult, judge, knee_rule, result_data
from zgtool.results import make_result, write_result


def _point(target: str, load: float, capacity: float) -> PointSummary:
    keeps_up = load <= capacity
    p99 = 20.0 if keeps_up else 400.0
    return PointSummary(target=target, load=load, num_ok=40, num_error=0, errors={},
                        achieved_rps=load if keeps_up else capacity, offered_rps=load, goodput_rps=load * 0.9,
                        duration_s=40 / load, ttft_ms={"count": 40, "p50": p99 / 2, "p99": p99},
                        itl_ms={"count": 400, "p50": 1.0, "p99": 3.0}, e2e_ms={"count": 40, "p50": 50, "p99": p99 + 30},
                        sent_rps=load)


def synthetic_sweep_file(folder: Path) -> Path:
    res = SweepResult(kind=RATE, unit="req/s", targets=["http://127.0.0.1:8000", "http://127.0.0.1:8080"],
                      rule=knee_rule(RATE, True), config={"num_requests": 40})
    for load in (1, 2, 4, 8, 16):
        res.points += [_point(res.targets[0], load, 8), _point(res.targets[1], load, 4)]
    judge(res, stream=True)
    return write_result(make_result("latency_sweep", result_data(res), command="zgtool latency-split --rate 1,2,4,8,16"),
                        folder / "sweep.json")
