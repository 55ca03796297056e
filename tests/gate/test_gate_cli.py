"""`zgtool gate` end to end: exit 0/1/2 with the right rows, baseline regression."""

from __future__ import annotations

import json

POLICY = """
[[rule]]
name = "direct much faster than gateway"
kind = "bench.k6"
check = "direct.http_req_duration.p95 <= 0.6 * gateway.http_req_duration.p95"

[[rule]]
kind = "bench.k6"
check = "failure_rate < 0.01"

[[rule]]
kind = "latency_split"
check = "ttft_ms.p50 < 50"
"""


def test_passing_result_exits_0_with_a_pass_row_per_rule(write, policy_file, cli, k6_data):
    res = write("bench.json", "bench.k6", k6_data(direct_p95=5.0, gateway_p95=10.0))
    proc = cli("gate", "--policy", policy_file(POLICY), res, "--json")
    assert proc.returncode == 0, proc.stderr
    gate = json.loads(proc.stdout)
    assert gate["kind"] == "gate" and gate["data"]["policy"].endswith("gates.toml")
    rows = gate["data"]["rows"]
    assert [r["status"] for r in rows] == ["pass", "pass", "skip"]
    assert rows[0]["values"] == [5.0, 6.0]
    assert "PASS" in proc.stderr and "direct much faster than gateway" in proc.stderr


def test_breached_rule_exits_1_and_shows_the_measured_values(write, policy_file, cli, k6_data):
    res = write("bench.json", "bench.k6", k6_data(direct_p95=9.0, gateway_p95=10.0, failures=6))
    proc = cli("gate", "--policy", policy_file(POLICY), res)
    assert proc.returncode == 1
    assert "9 <= 6" in proc.stdout  # measured left and right side of the ratio rule
    assert "0.02 < 0.01" in proc.stdout
    assert "gate failed: 2 of 3 checks breached" in proc.stderr
    # what failed stands last, above the verdict, in full; a pass is its rule and outcome alone
    passing_first = '[[rule]]\nname = "a rule that holds"\nkind = "bench.k6"\ncheck = "failure_rate < 0.5"\n'
    proc = cli("gate", "--policy", policy_file(passing_first + POLICY), res)
    lines = proc.stdout.splitlines()
    starts = [ln.split()[0] for ln in lines if ln[:4] in ("PASS", "FAIL", "SKIP")]
    assert starts == ["PASS", "FAIL", "FAIL", "FAIL:"]
    held = lines.index(next(ln for ln in lines if ln.startswith("PASS")))
    assert "a rule that holds" in lines[held] and "bench.json · " not in lines[held + 1]
    assert "bench.json · " in proc.stdout


def test_latency_split_rule_applies_only_to_its_kind(write, policy_file, cli):
    fast = write("ls.json", "latency_split", {"ttft_ms": {"p50": 12.0, "p95": 30.0}})
    slow = write("ls2.json", "latency_split", {"ttft_ms": {"p50": 80.0, "p95": 90.0}})
    ok = cli("gate", "-p", policy_file(POLICY), fast, "--json")
    assert ok.returncode == 0, ok.stderr
    assert [r["status"] for r in json.loads(ok.stdout)["data"]["rows"]] == ["skip", "skip", "pass"]
    assert cli("gate", "-p", policy_file(POLICY), fast, slow).returncode == 1


def test_malformed_policy_exits_2_naming_line_and_problem(write, policy_file, cli, k6_data):
    res = write("bench.json", "bench.k6", k6_data())
    bad = policy_file('[[rule]]\nname = "x"\ncheck = "direct.http_req_duration.p95 < __import__(\'os\')"\n')
    proc = cli("gate", "--policy", bad, res)
    assert proc.returncode == 2
    assert "gates.toml line 3" in proc.stderr and "not allowed" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_rule_on_a_missing_field_exits_2_naming_the_field(write, policy_file, cli, k6_data):
    res = write("bench.json", "bench.k6", k6_data())
    proc = cli("gate", "--policy", policy_file('rules = ["direct.http_req_duration.p98 < 5"]\n'), res)
    assert proc.returncode == 2
    assert "line 1" in proc.stderr and "'direct.http_req_duration.p98' not found" in proc.stderr
    assert "did you mean" in proc.stderr


def test_missing_field_with_skip_missing_is_a_skipped_row(write, policy_file, cli, k6_data):
    res = write("bench.json", "bench.k6", k6_data())
    pol = policy_file('[[rule]]\ncheck = "stack.http_req_duration.p95 < 5"\nskip_missing = true\n')
    proc = cli("gate", "--policy", pol, res, "--json", "--allow-empty")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["data"]["rows"][0]["status"] == "skip"
    # without --allow-empty a gate that judged nothing is no pass
    assert cli("gate", "--policy", pol, res).returncode == 2


def test_non_result_file_and_missing_policy_exit_2(tmp_path, write, cli, k6_data):
    junk = tmp_path / "junk.json"
    junk.write_text('{"hello": 1}')
    assert "not a zgtool result" in cli("gate", junk).stderr
    res = write("bench.json", "bench.k6", k6_data())
    proc = cli("gate", "--policy", tmp_path / "nope.toml", res)
    assert proc.returncode == 2 and "policy file not found" in proc.stderr


def test_regression_against_baseline_fails_only_beyond_the_allowed_percent(write, policy_file, cli, k6_data):
    pol = policy_file('rules = ["failure_rate < 0.01"]\n[regression]\nfields = ["*.http_req_duration.p95"]\n')
    base = write("base.json", "bench.k6", k6_data(direct_p95=10.0, gateway_p95=20.0))
    within = write("within.json", "bench.k6", k6_data(direct_p95=10.5, gateway_p95=21.0))
    worse = write("worse.json", "bench.k6", k6_data(direct_p95=10.0, gateway_p95=26.0))

    ok = cli("gate", "-p", pol, within, "--baseline", base, "--max-regression", "10%", "--json")
    assert ok.returncode == 0, ok.stderr
    reg = [r for r in json.loads(ok.stdout)["data"]["rows"] if r["group"] == "regression"]
    assert {r["check"].split()[0] for r in reg} == {f"{s}.http_req_duration.p95" for s in
                                                     ("direct", "gateway", "direct_stream")}
    assert all(r["status"] == "pass" for r in reg)

    bad = cli("gate", "-p", pol, worse, "--baseline", base, "--max-regression", "10%", "--json")
    assert bad.returncode == 1
    failed = [r for r in json.loads(bad.stdout)["data"]["rows"] if r["status"] == "fail"]
    assert [r["check"].split()[0] for r in failed] == ["gateway.http_req_duration.p95"]
    assert failed[0]["values"] == [26.0, 22.0] and "+30.0%" in failed[0]["detail"]
    # the same file passes with a looser limit from the command line
    assert cli("gate", "-p", pol, worse, "--baseline", base, "--max-regression", "35%").returncode == 0


def test_regression_ignores_increases_under_the_noise_floor(write, policy_file, cli, k6_data):
    pol = policy_file('rules = ["failure_rate < 0.01"]\n[regression]\nfields = ["*.http_req_blocked.p95"]\n')
    base = write("base.json", "bench.k6", k6_data())
    cur = write("cur.json", "bench.k6", k6_data())
    data = json.loads(cur.read_text())
    data["data"]["scenarios"]["direct"]["http_req_blocked"]["p95"] = 0.2  # 4x, but 0.15 ms
    cur.write_text(json.dumps(data))
    proc = cli("gate", "-p", pol, cur, "--baseline", base)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "within the +10% allowance or the 1 noise floor" in proc.stdout


def test_max_regression_without_baseline_is_a_usage_error(write, cli, k6_data):
    res = write("bench.json", "bench.k6", k6_data())
    proc = cli("gate", res, "--max-regression", "10%")
    assert proc.returncode == 2 and "--max-regression needs --baseline" in proc.stderr


def test_ratio_over_a_zero_measurement_fails_and_writes_valid_json(write, policy_file, cli, k6_data):
    res = write("bench.json", "bench.k6", k6_data())
    proc = cli("gate", "-p", policy_file('rules = ["direct.http_req_duration.p95 / failure_rate < 2"]\n'),
               res, "--json")
    assert proc.returncode == 1
    row = json.loads(proc.stdout)["data"]["rows"][0]  # strict JSON: no Infinity
    assert row["status"] == "fail" and row["values"] == [None, 2.0]
