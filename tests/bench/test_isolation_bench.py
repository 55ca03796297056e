"""bench/isolation.py end to end on dummy:tiny: the last line is one JSON object with a row per
class (ratios to the quiet run), and no request is lost (issue 22, Proof)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_isolation_bench_reports_each_class_against_a_quiet_run_and_loses_nothing() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "isolation.py"), "--rounds", "1",
                           "--classes", "poison_params"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert set(result["classes"]) == {"quiet", "poison_params"}
    poison = result["classes"]["poison_params"]
    assert poison["hostile_sent"] > 0 and poison["victim_runs"] == 16
    assert poison["victims_failed"] == 0 and poison["hostile_5xx"] == 0
    assert result["requests_lost"] == 0 and result["kv_blocks_used_after"] == {"quiet": 0}
    assert result["classes"]["quiet"]["ttft_p99_ratio"] == 1.0
    assert any(line.startswith("poison_params") for line in lines[:-1])
