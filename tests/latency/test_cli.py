"""`zgtool latency-split` end to end through the real CLI (`python -m zgtool`) in a subprocess."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from zgtest import run_zgtool

from zgtool.errors import ExitCode

FAST = ["--max-tokens", "4", "--warmup", "0", "--rounds", "2"]


def zg(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_zgtool(*args, cwd=cwd)


def test_json_result_is_versioned_with_definitions_and_raw_samples(origin: str, gateway: str,
                                                                   tmp_path: Path) -> None:
    out = tmp_path / "split.json"
    r = zg("latency-split", origin, gateway, "-n", "8", *FAST, "--json", "-o", str(out))   # 8: an interval
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert json.loads(out.read_text())["data"] == doc["data"]
    assert doc["schema"] == "zgtool.result/1" and doc["kind"] == "latency_split"
    data = doc["data"]
    assert {"ttft_ms", "tpot_ms", "itl_ms"} <= set(data["definitions"])
    direct, gw = data["targets"]
    assert len(direct["samples"]) == 8 and direct["samples"][0]["total_ms"] > 0
    assert "gw_auth_ms" in gw["phases"] and "gw_auth_ms" not in direct["phases"]
    p50 = direct["phases"]["total_ms"]
    assert p50["median_lo"] <= p50["summary"]["p50"] <= p50["median_hi"]
    assert any(d["phase"] == "total_ms" for d in data["differences"])
    assert [t["url"] for t in doc["target"]] == [origin, gateway]


def test_terminal_output_shows_waterfall_side_by_side_and_verdicts(origin: str, gateway: str) -> None:
    r = zg("latency-split", origin, gateway, "-n", "5", *FAST, "--no-stream")
    assert r.returncode == 0, r.stderr
    assert "waterfall" in r.stdout and "side by side" in r.stdout
    assert "gateway auth" in r.stdout and "network + client" in r.stdout
    assert "ITL (every gap)" not in r.stdout  # no stream, no ITL row


def test_unreachable_target_exits_3_before_measuring(origin: str, closed_port_url: str) -> None:
    r = zg("latency-split", origin, closed_port_url, "-n", "3", *FAST)
    assert r.returncode == ExitCode.UNREACHABLE
    assert "cannot connect" in r.stderr and r.stderr.count("\n") == 1
    assert "/3" not in r.stderr  # no progress: nothing was measured


def test_unknown_target_exits_2_listing_known_names(tmp_path: Path) -> None:
    r = zg("latency-split", "nosuchtarget", cwd=tmp_path)
    assert r.returncode == ExitCode.USAGE
    assert "unknown target 'nosuchtarget'" in r.stderr and "local" in r.stderr


def test_bad_flags_exit_2_with_one_line(origin: str, tmp_path: Path) -> None:
    for args in (["--max-tokens", "lots"], ["-n", "0"], ["--prompt", "epic"],
                 ["--prompt-file", str(tmp_path / "missing.txt")], ["--insecure", "--cacert", __file__]):
        r = zg("latency-split", origin, *args)
        assert r.returncode == ExitCode.USAGE, (args, r.stderr)
        assert r.stderr.startswith("zgtool: ") and r.stderr.count("\n") == 1, r.stderr


def test_prompt_file_is_sent(origin: str, tmp_path: Path) -> None:
    f = tmp_path / "p.txt"
    f.write_text("Tell me about gateways.")
    r = zg("latency-split", origin, "-n", "2", *FAST, "--prompt-file", str(f), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["data"]["config"]["prompt"] == "file:p.txt"


def test_a_target_whose_every_request_fails_exits_5_with_its_error_counts(origin: str,
                                                                          failing_origin: str) -> None:
    r = zg("latency-split", origin, failing_origin, "-n", "3", *FAST, "--json")
    assert r.returncode == ExitCode.UNRELIABLE   # nothing measured on one path: the run cannot judge it
    assert "all 3 requests failed (http_529:overloaded_error x3)" in r.stderr
    doc = json.loads(r.stdout)  # the result is still written, errors and all
    assert doc["data"]["targets"][1]["errors"] == {"http_529:overloaded_error": 3}
