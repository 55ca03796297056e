"""What CI systems show: a Markdown summary (GitHub's $GITHUB_STEP_SUMMARY) and JUnit XML
(GitLab, Jenkins, Azure and GitHub test reporters), both rendered from one GateReport."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from zgtool.gate.records import FAIL, PASS, SKIP, UNRELIABLE, GateReport, GateRow
from zgtool.gate.render import measured

_ICON = {PASS: "✅", FAIL: "❌", SKIP: "⏭️"}
_HEADLINE = {PASS: "✅ **PASS**", FAIL: "❌ **FAIL**", UNRELIABLE: "⚠️ **UNRELIABLE MEASUREMENT**"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _name(row: GateRow) -> str:
    suffix = {"regression": " vs baseline", "health": ""}.get(row.group, "")
    tag = " *(measurement)*" if row.category == "measurement" else ""
    return f"{row.rule}{suffix}{tag}"


def markdown_summary(report: GateReport) -> str:
    c = report.counts
    lines = [f"### zgtool gate: {_HEADLINE[report.verdict]}", ""]
    if report.verdict == UNRELIABLE:
        names = "; ".join(f"{r.rule} ({r.detail or measured(r)})" for r in report.unreliable_rows)
        lines += [f"The measurement itself is unreliable, so the gate cannot judge this run: {_cell(names)}.", ""]
    blind = sum(1 for r in report.inconclusive_rows if r.status == PASS)
    lines += [f"{c.get(PASS, 0)} passed{f' ({blind} inconclusive)' if blind else ''}, {c.get(FAIL, 0)} failed, "
              f"{c.get(SKIP, 0)} skipped · policy "
              f"`{report.policy}`", "", "| | check | measured | result file | detail |", "|---|---|---|---|---|"]
    order = {FAIL: 0, PASS: 1, SKIP: 2}
    for row in sorted(report.rows, key=lambda r: order.get(r.status, 3)):
        icon = "⚠️" if row.inconclusive and row.status == PASS else _ICON.get(row.status, "")
        lines.append(f"| {icon} | {_cell(_name(row))} | {_cell(row.why if row.inconclusive else measured(row))} | "
                     f"`{_cell(row.result.rsplit('/', 1)[-1])}` | {_cell(row.detail)} |")
    return "\n".join(lines) + "\n"


def junit_xml(report: GateReport) -> str:
    """One <testcase> per check: failures as <failure>, unreliable-measurement checks as <error>
    (JUnit's "could not run the test properly"), skips as <skipped>."""
    c = report.counts
    suite = ET.Element("testsuite", name="zgtool gate", tests=str(len(report.rows)),
                       failures=str(len(report.breaches)), errors=str(len(report.unreliable_rows)),
                       skipped=str(c.get(SKIP, 0)))
    for row in report.rows:
        case = ET.SubElement(suite, "testcase", classname=f"zgtool.gate.{row.group}", name=_name(row).replace("*", ""),
                             file=row.result)
        message = "; ".join(x for x in (measured(row), row.detail) if x)
        if row.status == FAIL:
            tag = "error" if row.category == "measurement" else "failure"
            ET.SubElement(case, tag, message=message or row.check, type=row.category).text = row.check
        elif row.status == SKIP:
            ET.SubElement(case, "skipped", message=row.detail or "skipped")
    root = ET.Element("testsuites", name="zgtool gate")
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
