"""bench/front_floors.py end to end: both systems answer every request (serving_inproc's checked
stand-in connections) and the last line is one JSON object with CPU microseconds per request per
system and concurrency, their ratio and the CPU's name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_front_floors_measures_uvicorns_floor_and_a_bare_protocol_at_each_concurrency() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "front_floors.py"), "--requests", "300",
                           "--rounds", "1", "--concurrency", "1,4"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["bench"] == "front_floors" and result["cpu"] != "unknown"
    for system in ("uvicorn_floor", "bare_protocol"):
        assert set(result["cpu_us_per_req"][system]) == {"c1", "c4"}
        assert all(v > 0 for v in result["cpu_us_per_req"][system].values())
    assert set(result["ratio_bare_over_floor"]) == {"c1", "c4"}
