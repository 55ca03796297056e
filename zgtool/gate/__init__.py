"""CI performance gates over zgtool result files: policy parsing, field lookup, evaluation.

The grammar is in expr.py, the policy format in policy.py, field lookup in fields.py.
"""

from zgtool.gate.evaluate import evaluate
from zgtool.gate.policy import DEFAULT_POLICY, Policy, PolicyError, load_policy, parse_percent, parse_policy
from zgtool.gate.records import GateReport, GateRow, LoadedResult

__all__ = [
    "DEFAULT_POLICY", "GateReport", "GateRow", "LoadedResult", "Policy", "PolicyError",
    "evaluate", "load_policy", "parse_percent", "parse_policy",
]
