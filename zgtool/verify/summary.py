"""Terminal summary of a verify run: the verdict, the tax table, the field's metrics, skipped
stages, the gate and the report path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from zgtool.latency.render.split import fmt_ci
from zgtool.verify.plan import VerifyData

NS = "not significant"


def _ms(v: float | None, signed: bool = True) -> str:
    if v is None:
        return "–"
    return f"{v:+.2f}" if signed else f"{v:.2f}"


def _tax_cell(p: dict[str, Any] | None, missing: bool = False, sep: str = " ") -> str:
    """'+1.30 [+0.80, +1.90]': the median difference and its 95% interval as bounds (an interval that
    excludes 0 is significant; no ± to misread)."""
    if missing:
        return "n/a"
    if not p or p.get("diff_ms") is None:
        return "–"
    lo, hi = p.get("lo_ms"), p.get("hi_ms")
    # the significance as text too (a pipe, a file, NO_COLOR): * its interval excludes 0, n.s. it does not
    mark = "" if lo is None or hi is None else " *" if lo > 0 or hi < 0 else " n.s."
    return f"{p['diff_ms']:+.2f}{sep}{fmt_ci(lo, hi)}{mark}"


def _total(r: dict[str, Any]) -> dict[str, Any]:
    return {"diff_ms": r.get("tax_ms"), "lo_ms": r.get("tax_lo_ms"), "hi_ms": r.get("tax_hi_ms"),
            "significance": r.get("significance")}


def _first_token(r: dict[str, Any]) -> dict[str, Any] | None:
    """TTFT's difference on a stream (TTFB's when TTFT is absent)."""
    return r.get("ttft") or r.get("ttfb")


def _health(data: VerifyData, out_dir: Path) -> list[str]:
    """Client lag, a load generator behind its schedule, the machine's load: as in the report's headline area."""
    from zgtool.report.health import health_lines
    from zgtool.results import load_result

    files = [out_dir / f for f in dict.fromkeys(data.files) if f.startswith("latency_split")]
    return health_lines([load_result(f) for f in files if f.is_file()])


def render_summary(data: VerifyData, report: Path, console: Console) -> None:
    v = data.verdict
    if v:
        # an indicative (--quick) headline says so itself
        # the answer first: it starts stdout's first line
        console.print(f"[bold]Verdict:[/bold] {v['headline']}", highlight=False)
        for line in _health(data, report.parent):
            console.print(f"[yellow]{escape(line)}[/yellow]", highlight=False)
        _tax_table(v, console)
        _metrics_table(v, console)
    else:
        console.print("[bold]Verdict:[/bold] no latency-split result to compare (see the stages above)")
    _skips(data, console)
    if data.gate:
        g = data.gate
        counts = g.get("counts") or {}
        state = ("[green]pass[/green]" if g["passed"] else
                 "[yellow]? the measurement is unreliable[/yellow]" if g.get("verdict") == "unreliable" else
                 "[red]✗ breached[/red]")
        blind = f" ({g['inconclusive']} inconclusive: a regression up to the interval's high end could hide)" \
            if g.get("inconclusive") else ""
        console.print(f"Gate ({Path(g['policy']).name}): {state} — {counts.get('pass', 0)} pass{blind}, "
                      f"{counts.get('fail', 0)} fail, {counts.get('skip', 0)} skip"
                      + (f": {'; '.join(g['failed'][:3])}" if g.get("failed") else ""))
    console.print(f"Results: {report.parent}  ({len(set(data.files))} files, {data.wall_s:.0f} s)")
    if data.report:
        console.print(f"Report:  [bold]{data.report}[/bold]")


def _tax_rows_table(v: dict[str, Any], streams: bool, sep: str) -> Table:
    """The tax per configuration; `sep` joins a difference and its interval (a newline when narrow)."""
    table = Table(title="Gateway tax, ms: gateway − direct medians [95% CI] (significant when it excludes 0)",
                  title_justify="left")
    cols = ["config", "direct", *(["first token"] if streams else []), "outside engine", "total", "gw CPU/req"]
    for col in cols:
        table.add_column(col, justify="left" if col == "config" else "right", no_wrap=col != "config")
    for r in v["rows"]:
        cpu = r.get("gateway_cpu_ms")
        first = [_tax_cell(_first_token(r), sep=sep)] if streams else []
        table.add_row(r["label"], _ms(r["baseline_total_ms"], False), *first,
                      _tax_cell(r.get("outside_engine"), bool(r.get("attribution_missing")), sep=sep),
                      _tax_cell(_total(r), sep=sep), "–" if cpu is None else f"{cpu:.2f}")
    return table


def _tax_records(v: dict[str, Any], streams: bool) -> Group:
    """The tax table as records: each configuration's label whole, then one figure per line."""
    parts = [Text("Gateway tax, ms: gateway − direct medians [95% CI] (* significant, n.s. not)", style="bold")]
    for r in v["rows"]:
        cpu = r.get("gateway_cpu_ms")
        figures = [("direct", _ms(r["baseline_total_ms"], False))]
        figures += [("first token", _tax_cell(_first_token(r)))] if streams else []
        figures += [("outside engine", _tax_cell(r.get("outside_engine"), bool(r.get("attribution_missing")))),
                    ("total", _tax_cell(_total(r))), ("gw CPU/req", "–" if cpu is None else f"{cpu:.2f}")]
        parts.append(Text(r["label"], style="bold"))
        parts += [Text(f"  {k:<14}  {val}") for k, val in figures]
    return Group(*parts)


def _tax_table(v: dict[str, Any], console: Console) -> None:
    from zgtool.latency.render.fit import fits

    streams = any(r.get("ttft") for r in v["rows"])
    table: Table | Group = _tax_rows_table(v, streams, " ")
    if not fits(table, console.width):      # numbers are never cut: the interval goes under its figure
        table = _tax_rows_table(v, streams, "\n")
    if not fits(table, console.width):      # still too narrow: one configuration per block, key: value
        table = _tax_records(v, streams)
    lines = []
    for sentence in v.get("sentences") or []:
        lines.append(sentence)
    console.print(table)
    console.print(("first token: TTFT, stream only. " if streams else "") +
                  "outside engine: total minus the engine's own total (Server-Timing or any engine adapter); "
                  "n/a: attribution missing. "
                  "gw CPU/req: CPU ms the gateway's processes used per request on this host.", style="dim")
    for line in lines:
        console.print(f"  {line}", highlight=False)


def _metrics_table(v: dict[str, Any], console: Console) -> None:
    rows = v.get("metrics") or []
    if not rows:
        return
    slo = next((m.get("slo") for m in rows if m.get("slo")), None)
    table = Table(title="Throughput (over each path's measured time)", title_justify="left")
    cols = ["config", "path", "req/s", "out tok/s", "in/out tokens"] + (["goodput req/s"] if slo else [])
    for col in cols:
        table.add_column(col, justify="left" if col in ("config", "path") else "right")
    for m in rows:
        tokens = f"{m.get('input_tokens') if m.get('input_tokens') is not None else '–'}/" \
                 f"{m.get('output_tokens') if m.get('output_tokens') is not None else '–'}"
        cells = [m["label"], str(m["path"]), _ms(m.get("request_rps"), False), _ms(m.get("output_tok_s"), False),
                 tokens]
        if slo:
            good = m.get("good_requests")
            cells.append(f"{_ms(m.get('goodput_rps'), False)} ({good}/{m.get('requests_ok')})")
        table.add_row(*cells)
    console.print(table)
    if slo:
        console.print("goodput: requests meeting every SLO (" + ", ".join(f"{k} <= {v:g}" for k, v in slo.items())
                      + ") per second", style="dim")


def _skips(data: VerifyData, console: Console) -> None:
    notable = [s for s in data.stages if s.status in ("skipped", "failed")]
    for s in notable:
        colour = "red" if s.status == "failed" else "yellow"
        console.print(f"[{colour}]{s.status}[/{colour}] {s.title}: {s.reason}")


def summary_json(data: VerifyData) -> dict[str, Any]:
    from zgtool.results import make_result

    return make_result("verify", data)
