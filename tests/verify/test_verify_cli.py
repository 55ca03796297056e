"""`zgtool verify` end to end: one --quick run (module fixture) checked several ways, Ctrl-C, bad flags."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from verify_run import MARK, MODEL, left_over, owned

ZG = [sys.executable, "-m", "zgtool"]


@pytest.mark.slow
def test_quick_verify_exits_0_and_prints_the_verdict_and_report_path(quick_run) -> None:  # noqa: ANN001
    proc, out, _ = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Verdict:" in proc.stdout and "Gateway tax" in proc.stdout
    assert str(out / "report.html") in proc.stdout.replace("\n", "")


@pytest.mark.slow
def test_quick_verify_writes_every_result_and_a_report(quick_run) -> None:  # noqa: ANN001
    _, out, _ = quick_run
    from zgtool.results import load_result

    kinds = {load_result(f)["kind"] for f in out.glob("*.json")}
    assert {"probe.all", "latency_split", "engine.metrics", "dcgm.watch", "gate", "verify"} <= kinds
    assert len(list(out.glob("latency_split-*.json"))) == 4
    html = (out / "report.html").read_text()
    assert html.startswith("<!DOCTYPE html>") and 'id="waterfall"' in html
    verify = load_result(out / "verify.json")["data"]
    assert {s["name"]: s["status"] for s in verify["stages"]}["report"] == "ok"
    assert verify["verdict"]["rows"] and verify["urls"]["direct"].startswith("http://127.0.0.1:")


@pytest.mark.slow
def test_quick_verify_records_why_a_stage_was_skipped(quick_run) -> None:  # noqa: ANN001
    _, out, _ = quick_run
    stages = json.loads((out / "verify.json").read_text())["data"]["stages"]
    for s in stages:
        assert s["status"] in ("ok", "skipped") or (s["name"], s["status"]) == ("gate", "breached"), s
        if s["status"] == "skipped":
            assert s["reason"]
    k6 = next(s for s in stages if s["name"] == "k6")
    assert k6["status"] == "ok" or "k6" in k6["reason"]


@pytest.mark.slow
def test_quick_verify_leaves_no_process_behind(quick_run) -> None:  # noqa: ANN001
    _, out, leftovers = quick_run
    assert leftovers == []
    for pid in json.loads((out / "verify.json").read_text())["data"]["pids"]:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


@pytest.mark.slow
def test_sigint_stops_every_child_and_exits_130_with_one_line(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark, "PYTHONUNBUFFERED": "1"}
    out = tmp_path / "run"
    proc = subprocess.Popen([*ZG, "verify", "--quick", "--no-k6", "--model", MODEL, "--out-dir", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 180
        # interrupt once the engine, pygw and nginx are up and measuring has begun
        while time.monotonic() < deadline and not (out / "probe.all-direct.json").exists():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        children = [p for p in owned(mark, out) if p != proc.pid]
        assert len(children) >= 3  # engine, pygw, nginx master (+ workers)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130
    last = [line for line in err.strip().splitlines() if line.startswith("zgtool:")]
    assert len(last) == 1 and "interrupted" in last[0] and "Traceback" not in err
    assert left_over(mark, out) == []
    stages = json.loads((out / "verify.json").read_text())["data"]["stages"]
    assert any(s["status"] == "interrupted" for s in stages)


def test_unknown_gateway_exits_2_naming_the_choices(tmp_path: Path) -> None:
    proc = subprocess.run([*ZG, "verify", "--gateway", "envoy", "--out-dir", str(tmp_path / "o")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and "nginx, pygw, stack" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_missing_policy_file_exits_2(tmp_path: Path) -> None:
    proc = subprocess.run([*ZG, "verify", "--policy", str(tmp_path / "none.toml")], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "no such file" in proc.stderr
