"""Policy parsing and field lookup: every mistake names the line and the field."""

from __future__ import annotations

import pytest

from zgtool.gate import DEFAULT_POLICY, PolicyError, load_policy, parse_percent, parse_policy
from zgtool.gate.expr import MissingField
from zgtool.gate.fields import lookup


def test_shipped_default_policy_parses_with_rules_and_regression():
    policy = load_policy(None)
    assert policy.source == str(DEFAULT_POLICY)
    assert {r.kind for r in policy.rules} >= {"bench.k6", "latency_split"}
    assert policy.regression.max_ratio == pytest.approx(0.10)


def test_shorthand_and_table_rules_both_load_with_their_lines():
    policy = parse_policy('rules = ["failure_rate < 0.01"]\n\n[[rule]]\nname = "x"\ncheck = "a.b < 1"\n')
    assert [(r.name, r.line) for r in policy.rules] == [("failure_rate < 0.01", 1), ("x", 5)]


def test_bad_expression_names_the_line():
    with pytest.raises(PolicyError, match=r"gates.toml line 3: check: .*not a comparison"):
        parse_policy('[[rule]]\nname = "n"\ncheck = "direct.p95 + 1"\n', source="gates.toml")


def test_unknown_rule_field_names_its_line_and_the_allowed_ones():
    with pytest.raises(PolicyError, match=r"line 3: \[\[rule\]\] #1: unknown field 'treshold'.*allowed: category, check"):
        parse_policy('[[rule]]\ncheck = "a < 1"\ntreshold = 3\n', source="p.toml")


def test_invalid_toml_is_a_policy_error_with_position():
    with pytest.raises(PolicyError, match="invalid TOML.*line 2"):
        parse_policy("rules = [\"a < 1\"]\nx = = 2\n", source="p.toml")


def test_empty_policy_is_refused():
    with pytest.raises(PolicyError, match="no rules"):
        parse_policy("# nothing\n")


@pytest.mark.parametrize("text,ratio", [("10%", 0.10), ("2.5%", 0.025), (10, 0.10), (0.2, 0.2), ("15", 0.15)])
def test_percent_accepts_percent_strings_and_fractions(text, ratio):
    assert parse_percent(text) == pytest.approx(ratio)


def test_percent_rejects_words():
    with pytest.raises(PolicyError, match="percentage"):
        parse_percent("ten percent")


def _result(data):
    return {"schema": "zgtool.result/1", "kind": "x", "environment": {"cpus": 2}, "data": data}


def test_lookup_reaches_scenarios_directly_and_data_and_the_whole_result():
    res = _result({"failure_rate": 0.5, "scenarios": {"direct": {"http_req_duration": {"p95": 3.0}}}})
    assert lookup(res, "direct.http_req_duration.p95") == 3.0
    assert lookup(res, "failure_rate") == 0.5
    assert lookup(res, "data.failure_rate") == 0.5
    assert lookup(res, "environment.cpus") == 2


def test_lookup_matches_hyphenated_keys_and_named_list_items():
    res = _result({"targets": [{"name": "nginx-buffered", "ttft_ms": {"p50": 7}}]})
    assert lookup(res, "nginx_buffered.ttft_ms.p50") == 7


def test_lookup_of_a_group_lists_the_numbers_inside():
    res = _result({"ttft_ms": {"p50": 1.0, "p95": 2.0}})
    with pytest.raises(MissingField, match="group.*p50, p95"):
        lookup(res, "ttft_ms")


def test_lookup_of_a_typo_suggests_the_real_field():
    res = _result({"scenarios": {"direct": {"http_req_duration": {"p95": 3.0}}}})
    with pytest.raises(MissingField, match="did you mean direct.http_req_duration.p95"):
        lookup(res, "direct.http_req_duraton.p95")
