"""Run a bench/ script as a user would and read its last line, the one JSON object every bench ends with."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def run_bench(script: str, *args: str, timeout_s: float = 300) -> dict[str, Any]:
    """bench/``script`` with ``args``: its JSON result; the test fails, with the output, when it exits non-zero."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), *args],
                          capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result
