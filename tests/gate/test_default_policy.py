"""The shipped default policy gates the results a user actually has: a two-target latency-split read by
position (whatever the targets' names), a one-target run, a sweep; and a result no rule fits is never
a silent pass. The results come from real `zgtool latency-split` runs against a real null engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from zgtest import run_zgtool, stop_process, wait_until

from zgtool.gate import DEFAULT_POLICY, LoadedResult, evaluate, load_policy
from zgtool.gate.evaluate import NothingApplied, check_applied
from zgtool.gate.expr import parse_rule
from zgtool.http.net import free_port
from zgtool.results import make_result


def _healthy(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """One real null engine; a two-target run (the same URL twice), a one-target run and a sweep."""
    tmp = tmp_path_factory.mktemp("default_policy")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (tmp / "serve.log").open("wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "zgtool", "serve", "--model", "null", "--host", "127.0.0.1",
                                 "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_until(lambda: proc.poll() is not None or _healthy(url), 60, "zgtool serve --model null")
        files = {"pair": tmp / "pair.json", "one": tmp / "one.json", "sweep": tmp / "sweep.json"}
        for args, out in (([url, url, "-n", "24"], files["pair"]), ([url, "-n", "12"], files["one"]),
                          ([url, "-c", "1,2", "-n", "8"], files["sweep"])):
            proc_run = run_zgtool("latency-split", *args, "-o", out, timeout_s=120)
            assert out.exists(), proc_run.stdout + proc_run.stderr
        yield files
    finally:
        stop_process(proc)


def _report(path: Path):  # noqa: ANN202
    return evaluate(load_policy(None), [LoadedResult(str(path), json.loads(path.read_text()))])


def test_a_two_target_run_is_judged_by_position_whatever_the_targets_are_called(runs) -> None:  # noqa: ANN001
    report = _report(runs["pair"])
    applied = {r.group for r in report.applied}
    assert "paired" in applied and "rule" in applied, report.rows
    paired = [r for r in report.applied if r.group == "paired"]
    assert all(r.why and ("n.s." in r.why or "significant" in r.why or "faster" in r.why) for r in paired)
    ttft = next(r for r in report.rows if r.check.startswith("baseline.ttft_ms"))
    # read by position; skipped only when a busy box left too few TTFTs (or none) for an interval
    assert ttft.status == "pass" or (ttft.status == "skip" and ("is null" in ttft.detail or "not found" in ttft.detail)), ttft


def test_the_default_gate_cli_on_a_two_target_run_evaluates_rules_and_says_why(runs) -> None:  # noqa: ANN001
    proc = run_zgtool("gate", runs["pair"], columns=80)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("PASS: ") and not last.startswith("PASS: 0 passed"), proc.stdout
    assert "interval [" in proc.stdout and "holds" in proc.stdout


def test_a_one_target_run_and_a_sweep_each_meet_at_least_one_rule(runs) -> None:  # noqa: ANN001
    for name in ("one", "sweep"):
        report = _report(runs[name])
        assert report.applied, (name, report.rows)
        assert report.verdict == "pass", (name, [(r.rule, r.why) for r in report.rows])


def test_a_result_no_rule_fits_is_refused_unless_allowed() -> None:
    result = make_result("probe.headers", {"status": 200})
    loaded = [LoadedResult("probe.json", result)]
    report = evaluate(load_policy(None), loaded)
    assert not report.applied
    with pytest.raises(NothingApplied, match="no rule applied to this result"):
        check_applied(report, loaded, allow_empty=False)
    check_applied(report, loaded, allow_empty=True)


def test_no_default_rule_compares_percentiles_of_two_separate_runs() -> None:
    """Every default rule is paired ([paired]) or reads one run's figures (an interval's end, a rate):
    none puts two paths' p95s from unpaired runs on either side of a comparison."""
    policy = load_policy(DEFAULT_POLICY)
    assert policy.paired is not None
    for rule in policy.rules:
        sides = parse_rule(rule.rule.text).sides()
        fields = [s for s in sides if any(c.isalpha() for c in s)]
        assert len(fields) <= 1, rule.name


def test_the_gate_cli_exits_2_when_no_rule_applied_and_0_with_allow_empty(tmp_path: Path) -> None:
    from zgtool.results import write_result

    f = write_result(make_result("probe.headers", {"status": 200}), tmp_path / "probe.json")
    r = run_zgtool("gate", f)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no rule applied to this result (kind probe.headers" in r.stderr and "--allow-empty" in r.stderr
    assert "NOTHING JUDGED" in r.stdout
    assert run_zgtool("gate", f, "--allow-empty").returncode == 0
