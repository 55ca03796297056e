"""`zgtool latency-split --slo/--cpu-pid` through the real CLI: the field's figures in the result."""

from __future__ import annotations

import json
import subprocess

from zgtest import run_zgtool

from zgtool.errors import ExitCode


def zg(*args: str) -> subprocess.CompletedProcess[str]:
    return run_zgtool(*args, columns=100)


def test_slo_and_cpu_pid_put_goodput_and_cpu_per_request_in_the_result(origin: str, gateway: str,
                                                                       origin_proc) -> None:  # noqa: ANN001
    r = zg("latency-split", origin, gateway, "-n", "8", "--max-tokens", "4", "--warmup", "0",
           "--slo", "ttft:60000 e2e:60000", "--cpu-pid", f"origin={origin_proc.proc.pid}", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)["data"]
    assert data["config"]["slo"] == {"ttft_ms": 60000.0, "e2e_ms": 60000.0}
    assert data["config"]["rounds"] == 4          # automatic: enough rounds to resample
    for t in data["targets"]:
        tp = t["throughput"]
        assert tp["requests_ok"] == 8 and tp["good_requests"] == 8 and tp["request_rps"] > 0
        assert tp["output_tokens"] > 0 and tp["input_tokens"] > 0 and tp["output_tok_s"] > 0
        assert t["cpu_ms_per_request"]["origin"] > 0
    assert all(d["method"] == "rounds" for d in data["differences"] if d["phase"] in ("total_ms", "ttft_ms"))


def test_the_human_output_has_a_throughput_line_per_target(origin: str) -> None:
    r = zg("latency-split", origin, "-n", "4", "--max-tokens", "4", "--warmup", "0", "--slo", "e2e:60000")
    assert r.returncode == 0, r.stderr
    assert "req/s" in r.stdout and "out tok/s" in r.stdout and "goodput" in r.stdout


def test_a_malformed_slo_or_cpu_pid_is_a_usage_error(origin: str) -> None:
    for args in (["--slo", "ttft=5"], ["--cpu-pid", "engine"], ["--cpu-pid", "x=999999999"]):
        r = zg("latency-split", origin, "-n", "3", *args)
        assert r.returncode == ExitCode.USAGE, (args, r.stderr)
