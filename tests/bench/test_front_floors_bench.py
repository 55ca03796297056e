"""bench/front_floors.py end to end: both systems answer every request (serving_inproc's checked
stand-in connections) and the last line is one JSON object with CPU microseconds per request per
system and concurrency, their ratio and the CPU's name."""

from __future__ import annotations

from bench_run import run_bench


def test_front_floors_measures_uvicorns_floor_and_a_bare_protocol_at_each_concurrency() -> None:
    result = run_bench("front_floors.py", "--requests", "300", "--rounds", "1", "--concurrency", "1,4")
    assert result["bench"] == "front_floors" and result["cpu"] != "unknown"
    for system in ("uvicorn_floor", "bare_protocol"):
        assert set(result["cpu_us_per_req"][system]) == {"c1", "c4"}
        assert all(v > 0 for v in result["cpu_us_per_req"][system].values())
    assert set(result["ratio_bare_over_floor"]) == {"c1", "c4"}
