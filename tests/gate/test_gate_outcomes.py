"""Gate outcomes CI can trust: a paired interval for regressions, a separate "unreliable
measurement" outcome (exit 5) for the load generator's own health, and CI-readable summaries."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from zgtool.gate import LoadedResult, evaluate, parse_policy

PAIRED = '[paired]\nfields = ["total_ms"]\nmaterial = "5%"\nmaterial_ms = 0.5\n'


def split_data(*targets: tuple[str, float], n: int = 120, rounds: int = 12, seed: int = 1,
               noise_ms: float = 1.0, ok: bool = True) -> dict[str, Any]:
    """A latency_split result's data: targets measured in interleaved rounds, each round sharing a
    machine-state offset (as on a real box), each request its own noise."""
    rng = random.Random(seed)
    offsets = [rng.gauss(0, noise_ms) for _ in range(rounds)]
    out = []
    for name, median_ms in targets:
        samples = []
        for i in range(n):
            r = i * rounds // n
            total = median_ms + offsets[r] + rng.gauss(0, noise_ms * 0.5)
            samples.append({"index": i, "round": r, "ok": ok, "total_ms": total if ok else None,
                            "ttft_ms": None})
        out.append({"name": name, "samples": samples, "num_ok": n if ok else 0, "num_error": 0 if ok else n})
    return {"config": {"rounds": rounds}, "definitions": {"total_ms": "...", "ttft_ms": "..."}, "targets": out}


def test_a_candidate_as_fast_as_the_baseline_passes_the_paired_gate(write, policy_file, cli):
    res = write("pair.json", "latency_split", split_data(("base", 40.0), ("cand", 40.0)))
    proc = cli("gate", "--policy", policy_file(PAIRED), res)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cand vs base: total_ms" in proc.stdout


def test_a_material_paired_regression_fails_with_its_interval(write, policy_file, cli, tmp_path: Path):
    res = write("pair.json", "latency_split", split_data(("base", 40.0), ("cand", 46.0)))
    out = tmp_path / "gate.json"
    proc = cli("gate", "--policy", policy_file(PAIRED), res, "-o", out)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = json.loads(out.read_text())["data"]["rows"][0]
    assert row["status"] == "fail" and row["group"] == "paired"
    assert "slower, significant: interval [" in row["why"] and "excludes 0" in row["why"]
    assert json.loads(out.read_text())["data"]["verdict"] == "fail"


def test_a_significant_but_immaterial_difference_passes():
    data = split_data(("base", 40.0), ("cand", 40.8), noise_ms=0.05)  # +2%: below the 5% materiality
    report = evaluate(parse_policy(PAIRED), [LoadedResult("pair.json", {"kind": "latency_split", "data": data})])
    (row,) = report.rows
    assert row.status == "pass" and "significant but within the" in row.why and "allowance" in row.why


def test_every_comparison_shares_the_family_wise_confidence():
    data = split_data(("base", 40.0), ("c1", 40.0), ("c2", 40.0))
    policy = parse_policy('[paired]\nfields = ["total_ms"]\nconfidence = 0.9\n')
    rows = evaluate(policy, [LoadedResult("p", {"kind": "latency_split", "data": data})]).rows
    assert len(rows) == 2 and all("95.00% confidence per comparison" in r.detail for r in rows)


def test_a_paired_field_the_result_does_not_define_is_a_usage_error(write, policy_file, cli):
    res = write("pair.json", "latency_split", split_data(("base", 40.0), ("cand", 40.0)))
    proc = cli("gate", "--policy", policy_file('[paired]\nfields = ["totl_ms"]\n'), res)
    assert proc.returncode == 2
    assert "'totl_ms' is not a per-request field" in proc.stderr and "total_ms" in proc.stderr


def test_a_field_without_values_on_one_side_skips_rather_than_fails():
    data = split_data(("base", 40.0), ("cand", 40.0))   # ttft_ms is None: a non-streaming run
    rows = evaluate(parse_policy('[paired]\nfields = ["ttft_ms"]\n'),
                    [LoadedResult("p", {"kind": "latency_split", "data": data})]).rows
    assert [r.status for r in rows] == ["skip"]


def test_a_load_generator_rule_breach_is_an_unreliable_measurement_not_a_gate_failure(write, k6_data, cli):
    data = k6_data()
    data["dropped_iterations"] = 7
    res = write("bench.json", "bench.k6", data)
    proc = cli("gate", res)  # the default policy
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "measurement is unreliable" in proc.stderr and "the load generator kept the rate" in proc.stderr
    assert "UNRELIABLE MEASUREMENT" in proc.stdout


def test_a_gate_breach_in_a_healthy_run_still_exits_1(write, k6_data, cli):
    res = write("bench.json", "bench.k6", k6_data(failures=30))   # 10% failed
    proc = cli("gate", res)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "failure_rate is 0.1: 0.1 < 0.01 does not hold" in proc.stdout


def test_a_run_where_no_request_succeeded_is_never_a_pass(write, policy_file, cli):
    res = write("pair.json", "latency_split", split_data(("base", 40.0), ("cand", 40.0), ok=False))
    proc = cli("gate", "--policy", policy_file(PAIRED), res)
    assert proc.returncode == 5
    assert "every request failed on base (0 of 120 succeeded)" in proc.stderr, proc.stderr


def test_a_baseline_of_other_targets_is_a_usage_error(write, cli):
    cur = write("cur.json", "latency_split", split_data(("direct", 40.0), ("stack", 41.0)))
    base = write("base.json", "latency_split", split_data(("direct", 40.0), ("litellm", 41.0)))
    proc = cli("gate", cur, "--baseline", base)
    assert proc.returncode == 2
    assert "compare runs of the same targets" in proc.stderr


def test_an_unknown_paired_field_names_its_line(policy_file, write, cli, k6_data):
    res = write("bench.json", "bench.k6", k6_data())
    proc = cli("gate", "--policy", policy_file('[paired]\nfields = ["total_ms"]\nmaterail = "5%"\n'), res)
    assert proc.returncode == 2
    assert "line 3: [paired]: unknown field 'materail'" in proc.stderr


def test_summary_markdown_appends_and_junit_lists_every_check(write, policy_file, cli, tmp_path: Path):
    res = write("pair.json", "latency_split", split_data(("base", 40.0), ("cand", 46.0)))
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    junit = tmp_path / "gate.xml"
    proc = cli("gate", "--policy", policy_file(PAIRED), res, "--summary-md", summary, "--junit", junit)
    assert proc.returncode == 1
    md = summary.read_text()
    assert md.startswith("earlier step\n") and "### zgtool gate: ❌ **FAIL**" in md
    assert "| ❌ | cand vs base: total_ms |" in md
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "1" and suite.get("failures") == "1"
    case = suite.find("testcase")
    assert case is not None and case.find("failure") is not None


def test_junit_reports_an_unreliable_measurement_as_an_error(write, k6_data, cli, tmp_path: Path):
    data = k6_data()
    data["dropped_iterations"] = 3
    junit = tmp_path / "gate.xml"
    proc = cli("gate", write("bench.json", "bench.k6", data), "--junit", junit)
    assert proc.returncode == 5
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite is not None and suite.get("errors") == "1" and suite.get("failures") == "0"


def test_a_pass_whose_interval_reaches_past_the_allowance_is_marked_inconclusive(write, policy_file, cli,
                                                                                  tmp_path: Path):
    # the machine's drift as wide as the path itself (vLLM at -c 8 on 2 busy cores: [-253, +119] ms against
    # a 33.8 ms allowance): nothing significant, and a regression of 10 ms would have passed as well
    res = write("pair.json", "latency_split", split_data(("base", 40.0), ("cand", 40.0), noise_ms=12.0, n=24,
                                                         rounds=4))
    out, md = tmp_path / "gate.json", tmp_path / "summary.md"
    proc = cli("gate", "--policy", policy_file(PAIRED), res, "-o", out, "--summary-md", md)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())["data"]
    (row,) = data["rows"]
    assert row["status"] == "pass" and row["inconclusive"] is True and data["inconclusive"] == 1
    assert "inconclusive: the interval reaches +" in row["why"] and "allowance" in row["why"]
    assert "1 passed (1 inconclusive), 0 failed" in proc.stdout
    assert "1 passed (1 inconclusive)" in md.read_text() and "⚠️" in md.read_text()
    html = tmp_path / "report.html"
    assert cli("report", "html", out, "-o", html).returncode == 0
    page = html.read_text()
    assert '<span class="badge warn">pass (inconclusive)</span>' in page and "1 pass (1 inconclusive)" in page


def test_a_narrow_interval_passes_without_the_mark(write, policy_file, cli, tmp_path: Path):
    res = write("pair.json", "latency_split", split_data(("base", 40.0), ("cand", 40.0), noise_ms=0.05))
    out = tmp_path / "gate.json"
    proc = cli("gate", "--policy", policy_file(PAIRED), res, "-o", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(out.read_text())["data"]
    assert data["rows"][0]["inconclusive"] is False and data["inconclusive"] == 0
    assert "inconclusive" not in proc.stdout


def test_a_policy_that_will_not_pass_blind_calls_an_inconclusive_run_unreliable(write, policy_file, cli):
    res = write("pair.json", "latency_split", split_data(("base", 40.0), ("cand", 40.0), noise_ms=12.0, n=24,
                                                         rounds=4))
    proc = cli("gate", "--policy", policy_file(PAIRED + 'inconclusive = "unreliable"\n'), res)
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "measurement is unreliable" in proc.stderr and "cand vs base: total_ms" in proc.stderr
    # a real regression is still a failure, not an unjudgeable run
    res = write("reg.json", "latency_split", split_data(("base", 40.0), ("cand", 46.0)))
    assert cli("gate", "--policy", policy_file(PAIRED + 'inconclusive = "unreliable"\n'), res).returncode == 1


def test_an_unknown_inconclusive_mode_is_a_policy_error_naming_the_choices():
    import pytest

    from zgtool.gate.policy import PolicyError

    with pytest.raises(PolicyError, match="inconclusive must be one of 'warn', 'unreliable'"):
        parse_policy(PAIRED + 'inconclusive = "fail"\n')
