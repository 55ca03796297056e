"""Terminal rendering of a load sweep: one table of every (path, load) point, the knee rule, each
path's knee and each gateway's capacity tax. Rendering only: everything comes from the SweepResult."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from zgtool.latency.analysis.saturation import RATE, qty, thin
from zgtool.latency.render.split import legend, short_names
from zgtool.latency.schedule.sweep import PointSummary, SweepResult


def _n(v: float | None) -> str:
    """Rates: three significant figures at most, no exponent."""
    if v is None:
        return "-"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def _p(stats: dict[str, float], key: str) -> str:
    v = stats.get(key)
    return "-" if v is None else f"{v:.1f}"


def mark(res: SweepResult, p: PointSummary) -> str:
    s = res.saturation.get(p.target)
    m = ""
    if s is not None and s.knee is not None and p.load == s.knee:
        m = "knee"
    elif s is not None and s.saturated_at is not None and p.load >= s.saturated_at:
        m = "saturated" if p.load == s.saturated_at else "past"
    return f"{m} client behind".strip() if p.rate_short else m


def table(res: SweepResult, stream: bool, slo: bool, short: dict[str, str]) -> Table:
    rate = res.kind == RATE
    how = "open loop, ms from each request's due time" if rate else "closed loop, ms"
    t = Table(box=box.SIMPLE_HEAD, title=f"latency vs offered load ({how})", title_justify="left", pad_edge=False)
    t.add_column("path")
    t.add_column("offered" if rate else "c", justify="right")
    t.add_column("req/s", justify="right")
    if slo:
        t.add_column("good/s", justify="right")
    ttft, e2e = ("ttft_from_due_ms", "e2e_from_due_ms") if rate else ("ttft_ms", "e2e_ms")
    cols = [("TTFT", ttft), ("ITL", "itl_ms"), ("E2E", e2e)] if stream else [("E2E", e2e)]
    for label, _ in cols:
        t.add_column(f"{label} p50", justify="right")
        t.add_column("p99", justify="right")
    t.add_column("err", justify="right")
    t.add_column("", no_wrap=True)
    for name in res.targets:
        for p in res.of(name):
            row = [short[name], f"{p.load:g}", _n(p.achieved_rps)]
            if slo:
                row.append(_n(p.goodput_rps))
            for _, key in cols:
                stats = getattr(p, key)
                row += [_p(stats, "p50"), _p(stats, "p99")]
            m = mark(res, p)
            row += [str(p.num_error) if p.num_error else "", m]
            style = "bold" if m.startswith("knee") else "yellow" if m.startswith("saturated") else \
                "dim" if m.startswith("past") else None
            t.add_row(*row, style=style)
        t.add_section()
    return t


def verdict(res: SweepResult) -> str:
    """The sweep's answer in one line: each gateway's capacity tax, or the one path's knee; "indicative: ..."
    first where a load point it reads answered fewer than MIN_POINT_REQUESTS requests."""
    if res.capacity_tax:
        return " | ".join(t.text for t in res.capacity_tax)
    said = []
    for name, s in res.saturation.items():
        why = thin(res.fewest_ok.get(name))
        said.append(f"{why + '; ' if why else ''}{name}: {s.describe(res.unit)}")
    return " | ".join(said) or "no load point measured"


def render(res: SweepResult, console: Console, *, stream: bool, slo: bool) -> None:
    short = short_names(res.targets)
    console.print(verdict(res), style="bold", highlight=False, soft_wrap=True)
    console.print(table(res, stream, slo, short))
    key = legend(res.targets, short)
    if key is not None:
        console.print(key)
    console.print("  latencies in ms; " + res.rule.describe(), style="dim", highlight=False)
    if res.calibration:
        c = res.calibration
        console.print(f"  start: one stream on {res.targets[0]} = {c['mean_e2e_ms']:.1f} ms mean E2E "
                      f"-> {c['one_stream_rps']:.3g} req/s; doubled each point", style="dim", highlight=False)
    if res.stopped:
        console.print(f"  stopped: {res.stopped}", style="dim", highlight=False)
    for name in res.targets:
        s = res.saturation.get(name)
        if s is not None:
            why = thin(res.fewest_ok.get(name))
            console.print(f"{name}: {s.describe(res.unit)}{f' ({why})' if why else ''}", highlight=False)
    for tax in res.capacity_tax:
        console.print(tax.text, style="bold" if tax.tax_pct else None, highlight=False)
    for p in res.points:
        s = res.saturation.get(p.target)
        past = s is not None and s.saturated_at is not None and p.load >= s.saturated_at
        if p.rate_short:
            why = ("the path's queue can hold the sends back, or the client is short of CPU: the knee may be "
                   "the client's" if past else "this load was not offered in full")
            console.print(f"  {p.target} at {qty(p.load, res.unit)}: the client fell behind ({p.client_behind}); "
                          f"{why}", style="yellow", highlight=False)
        elif p.client_behind:
            console.print(f"  {p.target} at {qty(p.load, res.unit)}: rate kept, but {p.client_behind}",
                          style="dim", highlight=False)
    for note in res.notes:
        console.print(f"  {note}", style="dim", highlight=False)
