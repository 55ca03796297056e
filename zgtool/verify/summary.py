"""Terminal summary of a verify run: the verdict table, skipped stages, gate and the report path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from zgtool.verify.plan import VerifyData


def _ms(v: float | None, signed: bool = True) -> str:
    if v is None:
        return "–"
    return f"{v:+.2f}" if signed else f"{v:.2f}"


def _outside(p: dict[str, Any] | None) -> str:
    """The tax on total - engine total (immune to engine compute drift), '*' when significant."""
    if not p or p.get("diff_ms") is None:
        return "–"
    star = "*" if p.get("significance") not in (None, "not significant") else ""
    return f"{p['diff_ms']:+.2f}{star}"


def render_summary(data: VerifyData, report: Path, console: Console) -> None:
    v = data.verdict
    if v:
        console.print(f"\n[bold]Verdict:[/bold] {v['headline']}")
        table = Table(title="Gateway tax: gateway − direct medians, 95% bootstrap CI", title_justify="left")
        for col in ("config", "direct", "gateway", "tax ms", "95% CI", "tax %", "significance", "outside engine"):
            table.add_column(col, justify="left" if col in ("config", "significance") else "right")
        lines = []
        for r in v["rows"]:
            ci = (f"{r['tax_lo_ms']:+.2f}..{r['tax_hi_ms']:+.2f}"
                  if r.get("tax_lo_ms") is not None and r.get("tax_hi_ms") is not None else "–")
            sig = r["significance"]
            style = "yellow" if sig == "higher" else "green" if sig == "lower" else "dim"
            table.add_row(r["label"], _ms(r["baseline_total_ms"], False), _ms(r["candidate_total_ms"], False),
                          _ms(r["tax_ms"]), ci, "–" if r["tax_pct"] is None else f"{r['tax_pct']:+.1f}%",
                          f"[{style}]{sig}[/{style}]", _outside(r.get("outside_engine")))
            top = [p for p in r["phases"] if p["significance"] != "not significant"][:3]
            if top:
                lines.append(f"  {r['label']}: " + ", ".join(f"{p['phase']} {p['diff_ms']:+.2f} ms" for p in top))
        console.print(table)
        console.print("outside engine: tax on total minus the engine's own Server-Timing total "
                      "(* = its 95% CI excludes 0)", style="dim")
        if lines:
            console.print("Significant phase differences (largest first):")
            for line in lines:
                console.print(line, highlight=False)
    else:
        console.print("\n[bold]Verdict:[/bold] no latency-split result to compare (see the stages above)")
    _skips(data, console)
    if data.gate:
        g = data.gate
        counts = g.get("counts") or {}
        state = "[green]pass[/green]" if g["passed"] else "[red]fail[/red]"
        console.print(f"Gate ({Path(g['policy']).name}): {state} — {counts.get('pass', 0)} pass, "
                      f"{counts.get('fail', 0)} fail, {counts.get('skip', 0)} skip"
                      + (f": {'; '.join(g['failed'][:3])}" if g.get("failed") else ""))
    console.print(f"Results: {report.parent}  ({len(set(data.files))} files, {data.wall_s:.0f} s)")
    if data.report:
        console.print(f"Report:  [bold]{data.report}[/bold]")


def _skips(data: VerifyData, console: Console) -> None:
    notable = [s for s in data.stages if s.status in ("skipped", "failed")]
    for s in notable:
        console.print(f"[yellow]{s.status}[/yellow] {s.title}: {s.reason}")


def summary_json(data: VerifyData) -> dict[str, Any]:
    from zgtool.results import make_result

    return make_result("verify", data)
