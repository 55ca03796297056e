"""`zgtool compare` and `gate --baseline` on k6 bench results: two real runs on an unchanged server, and the
first run with the gateway's tax grown or both paths slowed; runs of other kinds or other scenarios are refused
in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zgtool.errors import ExitCode


@pytest.fixture(scope="module")
def two_runs(asgi_url: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from zgtest import run_zgtool

    tmp = tmp_path_factory.mktemp("bench-compare")
    outs = []
    for i in (1, 2):
        out = tmp / f"run{i}.json"
        proc = run_zgtool("bench", "--direct", asgi_url, "--gateway", asgi_url, "--scenarios", "direct,gateway",
                          "--rate", "20", "--duration", "1s", "--no-progress", "-o", str(out), timeout_s=120)
        assert proc.returncode == 0, proc.stderr
        outs.append(out)
    return outs[0], outs[1]


def shifted(run: Path, folder: Path, direct_ms: float, gateway_ms: float) -> Path:
    """A copy of `run` whose direct and gateway medians (with their intervals) moved by these amounts, its
    gateway-minus-direct difference by the change of the two."""
    d = json.loads(run.read_text())
    for name, by in (("direct", direct_ms), ("gateway", gateway_ms)):
        s = d["data"]["scenarios"][name]
        for key in ("p50", "p95"):
            s["http_req_duration"][key] += by
        s["p50_lo_ms"] += by
        s["p50_hi_ms"] += by
    g = d["data"]["differences"]["gateway"]
    for k in ("p50_ms", "lo_ms", "hi_ms"):
        g[k] += gateway_ms - direct_ms
    out = folder / f"shift_{direct_ms:g}_{gateway_ms:g}.json"
    out.write_text(json.dumps(d))
    return out


def test_compare_reads_two_bench_runs_direct_first_with_each_median_and_the_gateways_tax(two_runs, cli):
    a, b = two_runs
    for path in (a, b):      # what compare reads: each scenario's median with its interval over requests
        for s in json.loads(path.read_text())["data"]["scenarios"].values():
            assert s["p50_lo_ms"] <= s["http_req_duration"]["p50"] <= s["p50_hi_ms"], s
    proc = cli("compare", a, b, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)["data"]
    assert data["runs"][0]["paths"] == ["direct", "gateway"]
    (tax,) = data["tax"]
    assert tax["candidate_name"] == "gateway" and tax["phase"] == "total_ms"
    assert all(d is not None for d in tax["per_run"])
    text = cli("compare", a, b).stdout
    assert "within each run: separate k6 scenarios, unpaired" in text


def test_a_gateway_tax_grown_past_its_interval_fails_compare_and_drift_of_both_paths_does_not(two_runs, cli,
                                                                                             tmp_path):
    a, _ = two_runs
    grown = cli("compare", a, shifted(a, tmp_path, 0.0, 50.0), "--fail-on-regression")
    assert grown.returncode == ExitCode.VERDICT_FAILED, grown.stdout + grown.stderr
    assert "total_ms tax" in grown.stdout and "regression" in grown.stdout
    drift = cli("compare", a, shifted(a, tmp_path, 50.0, 50.0), "--fail-on-regression")   # the machine slowed both paths
    assert drift.returncode == 0, drift.stdout + drift.stderr
    assert "regression (not counted)" in drift.stdout
    # k6's scenarios are unpaired and run one after another: a tax that moved by less than 1 ms is no regression
    small = shifted(a, tmp_path, 0.0, 0.6)
    every = cli("compare", a, small, "--fail-on-regression", "--json")
    (tax,) = [c for c in json.loads(every.stdout)["data"]["changes"] if c["metric"] == "total_ms tax"]
    # "no change" only where the interval rules out a change of max(1 ms, 10%) either way (the tax is ~0 ms)
    expected = "no change" if -1.0 < tax["lo"] and tax["hi"] < 1.0 else "inconclusive"
    assert every.returncode == 0 and tax["verdict"] == expected, tax
    text = " ".join(cli("compare", a, small).stdout.split())
    assert "other comparison(s): " in text and f" {expected} (" in text and "max(1 ms, 10%)" in text, text


def test_a_bench_change_counts_from_1_ms_or_10_percent_and_a_latency_split_one_from_0_2_ms_or_2_percent():
    from zgtool.compare.runs import BENCH_KIND, KIND
    from zgtool.compare.stats import smallest_effect

    assert smallest_effect(6.0, BENCH_KIND) == 1.0 and smallest_effect(40.0, BENCH_KIND) == pytest.approx(4.0)
    assert smallest_effect(6.0, KIND) == 0.2 and smallest_effect(40.0, KIND) == pytest.approx(0.8)


def test_compare_refuses_a_bench_beside_a_latency_split_and_other_scenarios(two_runs, cli, tmp_path):
    a, _ = two_runs
    split = Path(__file__).parents[1] / "compare" / "data"
    other = next(iter(sorted(split.glob("*.json"))))
    proc = cli("compare", a, other)
    assert proc.returncode == ExitCode.USAGE and "compare reads runs of one kind" in proc.stderr
    d = json.loads(a.read_text())
    del d["data"]["scenarios"]["gateway"]
    d["data"]["scenarios"]["direct_stream"] = d["data"]["scenarios"]["direct"]
    fewer = tmp_path / "other.json"
    fewer.write_text(json.dumps(d))
    proc = cli("compare", a, fewer)
    assert proc.returncode == ExitCode.USAGE and "same scenarios" in proc.stderr, proc.stderr


def test_gate_baseline_judges_a_bench_by_the_gateways_tax_and_reads_an_older_result_by_percentile(two_runs, cli,
                                                                                              tmp_path):
    a, b = two_runs
    aa = cli("gate", b, "--baseline", a)
    assert aa.returncode == 0, aa.stdout + aa.stderr
    assert "gateway - direct: http_req_duration tax vs baseline" in aa.stdout
    assert "separate k6 scenarios, unpaired" in cli("gate", b, "--baseline", a, "--json").stdout
    grown = cli("gate", shifted(a, tmp_path, 0.0, 50.0), "--baseline", a)
    assert grown.returncode == 1 and "FAIL gateway - direct: http_req_duration tax" in grown.stdout, grown.stdout
    drift = cli("gate", shifted(a, tmp_path, 50.0, 50.0), "--baseline", a)   # the machine slowed both paths
    assert drift.returncode == 0, drift.stdout
    # a result written before the medians' intervals were kept: the percentile rule, as before
    old = json.loads(a.read_text())
    for s in old["data"]["scenarios"].values():
        s.pop("p50_lo_ms"), s.pop("p50_hi_ms")
    older = tmp_path / "older.json"
    older.write_text(json.dumps(old))
    proc = cli("gate", b, "--baseline", older)
    assert proc.returncode == 0 and "gateway.http_req_duration.p95 vs baseline" in proc.stdout, proc.stdout
    assert "tax vs baseline" not in proc.stdout


def test_gate_baseline_judges_a_bench_tax_by_compares_rule_and_agrees_with_compare(two_runs, cli, tmp_path):
    """A bench's tax against the stored run's: the change's interval (both runs' combined) excludes 0 and the change
    reaches the allowance (max(1 ms, 10%)), compare's rule, calibrated on bench/k6_gate_calibration.py. The old rule
    (this run's interval above the stored one's by the allowance) let a 3 ms rise with 4 ms wide intervals pass."""
    a, _ = two_runs
    d = json.loads(a.read_text())
    g = d["data"]["differences"]["gateway"]
    g["lo_ms"], g["hi_ms"] = g["p50_ms"] - 2.0, g["p50_ms"] + 2.0      # a 4 ms wide interval on the tax
    wide = tmp_path / "wide.json"
    wide.write_text(json.dumps(d))
    risen = shifted(wide, tmp_path, 0.0, 3.0)
    gate = cli("gate", risen, "--baseline", wide)
    assert gate.returncode == 1 and "FAIL gateway - direct: http_req_duration tax" in gate.stdout, gate.stdout
    assert cli("compare", wide, risen, "--fail-on-regression").returncode == 1
    # under the 1 ms allowance it passes (compare's side: test_a_gateway_tax_grown_past_its_interval_fails...)
    small = cli("gate", shifted(wide, tmp_path, 0.0, 0.6), "--baseline", wide, "--json")
    assert small.returncode == 0, small.stdout
    # but a change as large as the allowance is still inside its interval: the pass says it proves little
    (tax,) = [r for r in json.loads(small.stdout)["data"]["rows"] if r["rule"].endswith("http_req_duration tax")]
    assert tax["status"] == "pass" and tax["inconclusive"], tax
    assert "the change's interval, both runs' combined, reaches" in tax["why"]
