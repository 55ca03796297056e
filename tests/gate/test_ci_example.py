"""The CI example in docs/ stays valid: its YAML loads and its embedded policy is the shipped one."""

from __future__ import annotations

from pathlib import Path

import pytest

from zgtool.gate import load_policy, parse_policy

DOC = Path(__file__).resolve().parents[2] / "docs" / "ci-example.yml"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gates-ci.toml"


def _embedded_policy(text: str) -> str:
    lines = text.split("# gates.toml", 1)[1].splitlines()[1:]
    return "\n".join(line.removeprefix("#").removeprefix("   ") for line in lines if line.startswith("#"))


def test_ci_example_policy_is_the_shipped_paired_policy():
    policy = parse_policy(_embedded_policy(DOC.read_text()), source=str(DOC))
    shipped = load_policy(EXAMPLE)
    assert policy.paired is not None and policy.paired == shipped.paired
    assert policy.paired.material_ratio == pytest.approx(0.05) and policy.paired.confidence == 0.95


def test_ci_example_measures_both_builds_interleaved_then_gates_with_ci_outputs():
    yaml = pytest.importorskip("yaml")
    doc = yaml.safe_load(DOC.read_text())
    runs = " ".join(step.get("run", "") for step in doc["jobs"]["paired-gate"]["steps"])
    assert "zgtool latency-split http://127.0.0.1:8001 http://127.0.0.1:8002" in runs
    assert "zgtool gate --policy gates.toml reports/pair.json" in runs
    assert '--summary-md "$GITHUB_STEP_SUMMARY"' in runs and "--junit" in runs
