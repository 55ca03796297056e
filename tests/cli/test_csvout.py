"""zgtool/csvout.py on result dicts: units kept in column names, nested fields flattened, a bench result's
raw points one row each, any other kind as its scalars plus one table per list of records."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from zgtool.csvout import flatten, write_csv
from zgtool.errors import UsageError


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_unitless_ms_dicts_get_ms_on_each_column_and_lists_join() -> None:
    row = flatten({"total_ms": 5.0, "server_timing": {"queue": 0.1, "total_ms": 2.0},
                   "engine": {"prefill_ms": 1.0, "other_ms": {"detok": 0.2}}, "itl_ms": [1.0, 2.5],
                   "hop_reports": {"gw_auth": 0.01}, "error": None})
    assert row == {"total_ms": 5.0, "server_timing.queue_ms": 0.1, "server_timing.total_ms": 2.0,
                   "engine.prefill_ms": 1.0, "engine.other.detok_ms": 0.2, "itl_ms": "1.0;2.5",
                   "hop_reports.gw_auth_ms": 0.01, "error": ""}


def _trend(n: int) -> dict:
    return {"count": n, "avg": 2.0, "min": 1.0, "p50": 2.0, "p90": 3.0, "p95": 3.5, "p99": 4.0, "max": 5.0,
            "unit": "ms"}


def test_bench_scenarios_phases_and_every_raw_point(tmp_path: Path) -> None:
    data = {"scenarios": {"direct": {"name": "direct", "url": "http://x", "requests": 3, "failures": 0,
                                     "achieved_rps": 9.5, "http_req_duration": _trend(3)}},
            "points": {"direct": {"http_req_duration": [1.0, 2.0, 3.0], "http_req_waiting": [0.5, 1.5, 2.5]}}}
    files = write_csv({"kind": "bench.k6", "data": data}, tmp_path)
    assert [f.name for f in files] == ["bench_scenarios.csv", "bench_phases.csv", "bench_points.csv"]
    assert _rows(tmp_path / "bench_scenarios.csv") == [{"scenario": "direct", "url": "http://x", "requests": "3",
                                                        "failures": "0", "achieved_rps": "9.5"}]
    phase = _rows(tmp_path / "bench_phases.csv")[0]
    assert phase["metric"] == "http_req_duration" and phase["p95_ms"] == "3.5" and "unit" not in phase
    points = _rows(tmp_path / "bench_points.csv")
    assert len(points) == 6 and points[0] == {"path": "direct", "metric": "http_req_duration", "index": "0",
                                              "value_ms": "1.0"}


def test_a_ramp_gives_one_row_per_path_per_rate_step(tmp_path: Path) -> None:
    step = {"rate_rps": 5.0, "step_s": 5.0, "requests": 25, "achieved_rps": 5.0, "failures": 0, "p50_ms": 1.0,
            "p95_ms": 2.0, "p99_ms": 3.0}
    data = {"paths": [{"name": n, "url": "http://x", "steps": [step, {**step, "rate_rps": 10.0}], "knee_rps": 10.0,
                       "knee_reason": "p95", "baseline_p95_ms": 2.0, "dropped_iterations": 0} for n in ("a", "b")],
            "notes": [], "ttft_at_knee": []}
    write_csv({"kind": "bench.k6.ramp", "data": data}, tmp_path)
    steps = _rows(tmp_path / "bench_ramp_steps.csv")
    assert [(r["path"], r["step"], r["rate_rps"]) for r in steps] == \
        [("a", "0", "5.0"), ("a", "1", "10.0"), ("b", "0", "5.0"), ("b", "1", "10.0")]
    assert [r["knee_rps"] for r in _rows(tmp_path / "bench_ramp_paths.csv")] == ["10.0", "10.0"]


def test_another_kind_gives_its_scalars_and_a_table_per_list_of_records(tmp_path: Path) -> None:
    data = {"passed": True, "wall_s": 1.5, "rows": [{"rule": "a", "value_ms": 1}, {"rule": "b", "value_ms": 2}]}
    files = write_csv({"kind": "gate", "data": data}, tmp_path, prefix="g.")
    assert [f.name for f in files] == ["g.gate.csv", "g.gate_rows.csv"]
    assert _rows(tmp_path / "g.gate.csv") == [{"passed": "True", "wall_s": "1.5"}]
    assert [r["rule"] for r in _rows(tmp_path / "g.gate_rows.csv")] == ["a", "b"]


def test_not_a_result_or_a_file_in_the_way_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="not a zgtool result"):
        write_csv({"data": {}}, tmp_path)
    f = tmp_path / "f"
    f.write_text("")
    with pytest.raises(UsageError, match="not a folder"):
        write_csv({"kind": "gate", "data": {}}, f)
