"""bench/serving_inproc.py end to end: every answer of every cell is checked (a 200 with a complete
body, JSON or SSE), and the last line is one JSON object with CPU microseconds per request per cell
and the garbage collections that ran while serving (none)."""

from __future__ import annotations

from bench_run import run_bench


def test_serving_inproc_answers_every_request_and_reports_cpu_per_request_per_cell() -> None:
    result = run_bench("serving_inproc.py", "--requests", "200", "--rounds", "1", "--warmup", "20",
                       "--modes", "t1,t16s", "--concurrency", "1,4")
    cells = result["cpu_us_per_req"]
    assert set(cells) == {"t1_c1", "t1_c4", "t16s_c1", "t16s_c4"}
    assert all(v > 0 for v in cells.values())
    assert result["cpu"] and result["cpu"] != "unknown"     # the CPU the figures belong to
    # serve's collector threshold (run.freeze_heap): a request's objects die by reference counting, so
    # serving runs no collection (CPython's default threshold collected every ~20 requests)
    assert result["gc_collections"] == 0
