"""The CI example in docs/ stays valid: its YAML loads and its embedded policy parses."""

from __future__ import annotations

from pathlib import Path

import pytest

from zgtool.gate import parse_policy

DOC = Path(__file__).resolve().parents[2] / "docs" / "ci-example.yml"


def _embedded_policy(text: str) -> str:
    lines = text.split("# gates.toml", 1)[1].splitlines()[1:]
    return "\n".join(line.removeprefix("#").removeprefix("   ") for line in lines if line.startswith("#"))


def test_ci_example_policy_parses_with_its_rules_and_regression():
    policy = parse_policy(_embedded_policy(DOC.read_text()), source=str(DOC))
    assert [r.rule.text for r in policy.rules][0] == "failure_rate < 0.01"
    assert len(policy.rules) == 4 and policy.regression.max_ratio == pytest.approx(0.15)


def test_ci_example_is_a_workflow_that_benches_then_gates():
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load(DOC.read_text())
    runs = " ".join(step.get("run", "") for step in doc["jobs"]["k6-gate"]["steps"])
    assert "zgtool bench --start" in runs and "zgtool gate --policy gates.toml" in runs
