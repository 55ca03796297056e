"""The gate's records: a loaded result, one checked row, the report and the row statuses.

A leaf of zgtool.gate: evaluate.py (rules, regression, health) and paired.py (paired intervals) both
build GateRows, and render.py / ci_outputs.py read GateReports, without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zgtool.gate.policy import GATE, MEASUREMENT

PASS, FAIL, SKIP = "pass", "fail", "skip"
UNRELIABLE = "unreliable"  # the report's verdict when a measurement-health check failed


@dataclass(frozen=True)
class LoadedResult:
    label: str  # usually the file path
    result: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.result.get("kind", ""))


@dataclass(frozen=True)
class GateRow:
    rule: str
    check: str
    result: str
    status: str  # pass | fail | skip
    sides: tuple[str, ...] = ()
    ops: tuple[str, ...] = ()
    values: tuple[float, ...] = ()
    detail: str = ""
    group: str = "rule"  # rule | regression | paired | health
    category: str = GATE  # GATE: a breach fails the gate; MEASUREMENT: the run cannot be judged
    why: str = ""  # the outcome in words ("+3.9 ms, n.s.: interval [-0.4, +8.2] contains 0")
    # a pass whose interval reaches above the allowance: a regression of that size could hide in the noise
    inconclusive: bool = False


@dataclass(frozen=True)
class GateReport:
    policy: str
    results: tuple[str, ...]
    rows: tuple[GateRow, ...]
    baseline: str | None = None
    max_regression: float | None = None
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def breaches(self) -> list[GateRow]:
        return [r for r in self.rows if r.status == FAIL and r.category == GATE]

    @property
    def unreliable_rows(self) -> list[GateRow]:
        return [r for r in self.rows if r.status == FAIL and r.category == MEASUREMENT]

    @property
    def inconclusive_rows(self) -> list[GateRow]:
        return [r for r in self.rows if r.inconclusive]

    @property
    def passed(self) -> bool:
        return not any(r.status == FAIL for r in self.rows)

    @property
    def applied(self) -> list[GateRow]:
        """The checks that judged something (passed or failed), beside the run's own health."""
        return [r for r in self.rows if r.status in (PASS, FAIL) and r.group != "health"]

    @property
    def verdict(self) -> str:
        """UNRELIABLE before FAIL: a breach measured by a load generator that fell behind is not
        evidence about the system under test."""
        if self.unreliable_rows:
            return UNRELIABLE
        return PASS if self.passed else FAIL
