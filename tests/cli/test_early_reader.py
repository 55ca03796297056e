"""A reader that leaves early (`zgtool latency-split ... -o run.json | head`) must not cost the measurement: the
result file is written before the tables, so the broken pipe that ends the command at its next print comes
after it. Measured against engine_replay.py's openai-only server (tests/latency) and a gate over that file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from replay_servers import running


def _with_stdout_closed(*args: str) -> subprocess.CompletedProcess[str]:
    """`zgtool ARGS` whose stdout is a pipe nobody reads: closed before the command prints anything."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("ZGTOOL_DEBUG", None)
    read_end, write_end = os.pipe()
    os.close(read_end)                  # the reader is gone before the first byte
    try:
        return subprocess.run([sys.executable, "-m", "zgtool", *args], stdout=write_end, stderr=subprocess.PIPE,
                              text=True, timeout=120, env=env)
    finally:
        os.close(write_end)


def test_a_reader_that_leaves_early_does_not_lose_the_result_file(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    with running("openai-only", "m") as url:
        r = _with_stdout_closed("latency-split", url + "/v1", "--model", "m", "--api", "openai", "--no-stream",
                                "-n", "3", "--warmup", "0", "-o", str(out))
    assert r.returncode == 1 and "Traceback" not in r.stderr      # the broken pipe ended it, quietly
    doc = json.loads(out.read_text())
    assert doc["kind"] == "latency_split" and len(doc["data"]["targets"][0]["samples"]) == 3
    gated = tmp_path / "gate.json"
    r = _with_stdout_closed("gate", str(out), "-o", str(gated), "--allow-empty")
    assert json.loads(gated.read_text())["kind"] == "gate" and "Traceback" not in r.stderr
