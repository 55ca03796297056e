"""Rich rendering of a GateReport: one row per check with the measured values."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table

from zgtool.gate.evaluate import FAIL, PASS, GateReport, GateRow

_STYLE = {PASS: "green", FAIL: "bold red", "skip": "yellow"}


def _num(v: float) -> str:
    if math.isinf(v) or math.isnan(v):
        return str(v)
    if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
        return f"{v:.4g}"
    return f"{v:,.4f}".rstrip("0").rstrip(".")


def measured(row: GateRow) -> str:
    """'12.3 <= 20.5' with each side's value, or the skip reason."""
    if not row.values:
        return ""
    parts = [_num(row.values[0])]
    for op, value in zip(row.ops, row.values[1:], strict=False):
        parts += [op, _num(value)]
    return " ".join(parts)


def render_report(report: GateReport, console: Console) -> None:
    table = Table(title=f"zgtool gate — {report.policy}", show_lines=False)
    table.add_column("status")
    table.add_column("rule")
    table.add_column("result", overflow="fold")
    table.add_column("measured", justify="right")
    table.add_column("detail", overflow="fold")
    for row in report.rows:
        if row.group == "regression":
            label = f"{row.rule} [dim]vs baseline[/dim]"
        elif row.rule == row.check:
            label = row.rule
        else:
            label = f"{row.rule}\n[dim]{row.check}[/dim]"
        table.add_row(f"[{_STYLE[row.status]}]{row.status.upper()}[/]", label, row.result,
                      measured(row), row.detail)
    console.print(table)
    c = report.counts
    verdict = "[green]PASS[/green]" if report.passed else "[bold red]FAIL[/bold red]"
    console.print(f"{verdict}: {c.get(PASS, 0)} passed, {c.get(FAIL, 0)} failed, {c.get('skip', 0)} skipped")
