"""Rich rendering of a GateReport: one row per check with the measured values."""

from __future__ import annotations

import math

from rich.console import Console
from rich.table import Table
from rich.text import Text

from zgtool.gate.evaluate import FAIL, PASS, UNRELIABLE, GateReport, GateRow, unreliable_message

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


def _short_path(path: str) -> str:
    """The file name only; the folder is printed once, above the checks."""
    return path.rsplit("/", 1)[-1]


_ORDER = {PASS: 0, "skip": 1, FAIL: 2}


def render_report(report: GateReport, console: Console) -> None:
    """One block per check: status, rule and measured; a skip or a breach adds its file, expression and detail,
    dimmed. Passes first, then skips, then breaches, so that what failed stands just above the verdict at the
    end of a CI log. Readable at 80 columns, where a five-column table folds every cell."""
    folders = sorted({r.rsplit("/", 1)[0] for r in report.results if "/" in r})
    head = f"zgtool gate — {report.policy}"
    if len(folders) == 1:
        head += f"\nresults in {folders[0]}/"
    table = Table.grid(padding=(0, 1))
    table.title = head
    table.title_justify = "left"
    table.add_column("status", no_wrap=True, width=4)
    table.add_column("check", overflow="fold")
    other_kinds: dict[str, int] = {}
    for row in sorted(report.rows, key=lambda r: _ORDER[r.status]):      # stable: the policy's order within
        if row.status == "skip" and row.result == "-" and row.detail.startswith("no result of kind"):
            kind = row.detail.removeprefix("no result of kind ").strip("'")
            other_kinds[kind] = other_kinds.get(kind, 0) + 1   # one line for them all, below
            continue
        label = f"{row.rule} vs baseline" if row.group == "regression" else row.rule
        text = Text(label, style="bold")
        if row.category == "measurement":
            text.append(" (measurement health)", style="dim")
        got = row.why or measured(row)
        if got:
            text.append(f"\n{got}")
        if row.status == PASS:          # the file it judged, where several were
            if len(report.results) > 1:
                text.append(f"  ({_short_path(row.result)})", style="dim")
            table.add_row(Text(row.status.upper(), style="yellow" if row.inconclusive else _STYLE[row.status]), text)
            continue
        text.append(f"\n{_short_path(row.result)}", style="dim")
        if row.check and row.check != row.rule:
            text.append(f" · {row.check}", style="dim")
        if row.detail:
            text.append(f"\n{row.detail}", style="yellow" if row.status == "skip" else "")
        table.add_row(Text(row.status.upper(), style=_STYLE[row.status]), text)
    console.print(table)
    if other_kinds:
        console.print("not for these results: " + ", ".join(f"{n} rule(s) for {k}" for k, n in other_kinds.items()),
                      style="dim", highlight=False)
    c = report.counts
    verdict = {PASS: "[green]PASS[/green]", FAIL: "[bold red]FAIL[/bold red]",
               UNRELIABLE: "[bold yellow]UNRELIABLE MEASUREMENT[/bold yellow]"}[report.verdict]
    if not report.applied and report.verdict == PASS:
        verdict = "[bold yellow]NOTHING JUDGED[/bold yellow]"
    blind = sum(1 for r in report.inconclusive_rows if r.status == PASS)
    console.print(f"{verdict}: {c.get(PASS, 0)} passed{f' ({blind} inconclusive)' if blind else ''}, "
                  f"{c.get(FAIL, 0)} failed, {c.get('skip', 0)} skipped", highlight=False)
    if blind:
        console.print(Text(f"{blind} pass(es) inconclusive: the interval still reaches above the allowance, so a "
                           "regression that large could pass unseen; more rounds and requests (--rounds, and -n or --duration) "
                           "narrow it, and inconclusive = \"unreliable\" in a policy's [paired] or [regression] "
                           "makes such a run exit 5", style="yellow"))
    if report.verdict == UNRELIABLE:
        console.print("this run cannot judge the system: " + unreliable_message(report), highlight=False)
