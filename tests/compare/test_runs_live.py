"""`latency-split --runs K` against a live engine: K whole runs, then the between-run comparison."""

from __future__ import annotations

import json
from pathlib import Path

from engine_live import child
from zgtest import run_zgtool


def test_runs_k_writes_each_run_and_answers_with_the_between_run_interval_first(tmp_path: Path) -> None:
    out = tmp_path / "night.json"
    with child(tmp_path, keyed=False, model="null") as live:
        done = run_zgtool("latency-split", live.url, live.url, "-n", "8", "--runs", "2", "--quiet", "-o", out,
                          timeout_s=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[0].startswith("Across 2 runs, path 2 (")
    for k in (1, 2):
        run = json.loads((tmp_path / f"night-run{k}.json").read_text())
        assert run["kind"] == "latency_split"
        assert f"run {k} of 2 (night-run{k}.json)" in done.stderr
    summary = json.loads(out.read_text())
    assert summary["kind"] == "compare" and len(summary["data"]["runs"]) == 2


def test_runs_below_one_is_a_usage_error() -> None:
    done = run_zgtool("latency-split", "http://127.0.0.1:9", "--runs", "0")
    assert done.returncode == 2 and "--runs" in done.stderr
