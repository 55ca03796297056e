"""Gate over a latency_split result recorded from a real `zgtool latency-split` run (data/)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from zgtool.gate import LoadedResult, evaluate, parse_policy
from zgtool.gate.expr import MissingField
from zgtool.gate.fields import lookup

DATA = Path(__file__).parent / "data" / "latency_split_one_target.json"


@pytest.fixture
def split() -> dict:
    return json.loads(DATA.read_text())


def test_ttft_of_the_only_target_reads_as_plain_ttft_ms(split):
    target = split["data"]["targets"][0]
    assert lookup(split, "ttft_ms.p50") == target["phases"]["ttft_ms"]["summary"]["p50"]
    assert lookup(split, "total_ms.p95") == target["phases"]["total_ms"]["summary"]["p95"]


def test_with_two_targets_a_bare_field_is_ambiguous_and_a_prefixed_one_works(split):
    second = copy.deepcopy(split["data"]["targets"][0])
    second["name"] = "nginx-buffered"
    second["phases"]["ttft_ms"]["summary"]["p50"] = 99.0
    split["data"]["targets"].append(second)
    with pytest.raises(MissingField, match=r"ambiguous: present for .*nginx-buffered; prefix it"):
        lookup(split, "ttft_ms.p50")
    assert lookup(split, "nginx_buffered.ttft_ms.p50") == 99.0


def test_ttft_rule_passes_and_breaches_on_the_recorded_result(split):
    measured = split["data"]["targets"][0]["phases"]["ttft_ms"]["summary"]["p50"]
    res = [LoadedResult("ls.json", split)]
    ok = evaluate(parse_policy(f'rules = ["ttft_ms.p50 < {measured * 2}"]'), res)
    bad = evaluate(parse_policy(f'rules = ["ttft_ms.p50 < {measured / 2}"]'), res)
    assert ok.passed and ok.rows[0].values == (measured, measured * 2)
    assert not bad.passed


def test_regression_over_ms_fields_of_a_latency_result(split):
    worse = copy.deepcopy(split)
    summary = worse["data"]["targets"][0]["phases"]["ttft_ms"]["summary"]
    summary["p95"] = summary["p95"] * 1.5 + 5.0
    policy = parse_policy('rules = ["ttft_ms.p50 < 1000"]\n[regression]\nfields = ["*ttft_ms.p95"]\nmethod = "percentile"\n')
    report = evaluate(policy, [LoadedResult("new.json", worse)], baseline=LoadedResult("base.json", split),
                      max_regression=0.10)
    reg = [r for r in report.rows if r.group == "regression"]
    assert len(reg) == 1 and reg[0].status == "fail" and reg[0].rule.endswith("ttft_ms.p95")
