"""Rich tables for bench results (rendering only; the dataclasses come from summary.py)."""

from __future__ import annotations

import math
from typing import Any

from rich.console import Console
from rich.table import Table

from zgtool.loadtest.bench import RampResult
from zgtool.loadtest.differences import how_paired
from zgtool.loadtest.summary import PHASES, BenchResult


def _ms(v: float | None) -> str:
    return "-" if v is None or math.isnan(v) else f"{v:.2f}"


def bench_verdict(result: BenchResult) -> str:
    """The first line: what the gateway scenario adds to direct's request latency (p50 with its interval,
    p95), or, with one scenario, its latency; the failures when there are any. The p50's interval is paired by
    the scenarios' turns, or over requests only for a run in one turn (differences.py); latency-split pairs
    request by request."""
    s = result.scenarios
    failed = [f"{n}: {s[n].failures} of {s[n].requests} failed" for n in s if s[n].failures]
    tail = ("; " + ", ".join(failed)) if failed else ""
    ok = [n for n in s if s[n].requests > s[n].failures]
    if not ok:
        return "No request succeeded in any scenario" + tail + "."
    rate = result.config.get("rate_rps")
    at = f" at {rate} req/s" if rate is not None else ""
    if "direct" in ok and len(ok) > 1:
        base = s["direct"].http_req_duration
        parts = []
        for n in ok:
            if n == "direct":
                continue
            d = s[n].http_req_duration
            if any(math.isnan(v) for v in (d.p50, d.p95, base.p50, base.p95)):
                continue
            parts.append(f"{n} adds {d.p50 - base.p50:+.2f} ms at p50 ({_ms(base.p50)} -> {_ms(d.p50)}"
                         f"{_interval(result.differences.get(n))}) and {d.p95 - base.p95:+.2f} ms at p95 per "
                         f"request over direct{at}")
        if parts:
            return "; ".join(parts) + f" ({_how(result.differences)})" + tail + "."
    lines = [f"{n}: p50 {_ms(s[n].http_req_duration.p50)} ms, p95 {_ms(s[n].http_req_duration.p95)} ms" for n in ok]
    return "; ".join(lines) + at + tail + "."


def _how(differences: dict[str, dict[str, Any]]) -> str:
    """How the verdict's intervals were measured, and what pairs the paths closer."""
    if not differences:
        return "separate k6 runs, no interval: `zgtool latency-split` gives the paired tax"
    if how_paired(differences).startswith("paired"):
        return (f"95% intervals {how_paired(differences)}, so a drift of the machine falls on both paths; "
                "`zgtool latency-split` pairs them request by request")
    return ("95% intervals over requests; separate k6 runs, so a drift between them is not covered: "
            "`bench --rounds N` pairs them by turns, `zgtool latency-split` request by request")


def _interval(d: dict[str, Any] | None) -> str:
    """'; 95% interval [+1.20, +3.40]', with ', not significant' when it holds 0; '' without one."""
    if not d or d.get("lo_ms") is None or d.get("hi_ms") is None:
        return ""
    lo, hi = float(d["lo_ms"]), float(d["hi_ms"])
    return (f"; {float(d.get('confidence', 0.95)):.0%} interval [{lo:+.2f}, {hi:+.2f}]"
            + (", not significant" if lo <= 0 <= hi else ""))


def render_bench(result: BenchResult, console: Console) -> None:
    console.print(bench_verdict(result), highlight=False, markup=False, soft_wrap=True)
    names = list(result.scenarios)
    cfg = result.config
    rounds = int(cfg.get("rounds") or 1)
    order = ("at once" if not cfg["sequential"] else "one after another" if rounds <= 1
             else f"taking turns in {rounds} rounds")
    table = Table(title=f"k6 {result.k6_version}: {cfg['rate_rps']} req/s for {cfg['duration_s']:g} s per "
                        f"scenario ({order}), ms p50 / p95")
    table.add_column("phase")
    for name in names:
        table.add_column(name, justify="right")
    for phase in PHASES:
        cells = []
        for name in names:
            t = getattr(result.scenarios[name], phase)
            cells.append(f"{_ms(t.p50)} / {_ms(t.p95)}")
        table.add_row(phase.removeprefix("http_req_"), *cells)
    s = result.scenarios
    table.add_section()
    table.add_row("requests", *[str(s[n].requests) for n in names])
    table.add_row("achieved req/s", *[f"{s[n].achieved_rps:.1f}" for n in names])
    table.add_row("failures", *[_fail(s[n].failures) for n in names])
    table.add_row("dropped", *[_fail(s[n].dropped_iterations) for n in names])
    console.print(table)
    if result.load_generator_saturated:
        console.print(f"[bold yellow]the load generator could not keep the rate[/]: "
                      f"{result.dropped_iterations} iterations dropped")
    for note in result.notes:
        if not note.startswith("the load generator"):
            console.print(f"[dim]note: {note}[/dim]")


def _fail(n: int) -> str:
    return f"[bold red]{n}[/]" if n else "0"


def render_ramp(result: RampResult, console: Console) -> None:
    rates = result.config["rates"]
    table = Table(title=f"k6 ramp ({result.config['step_s']:g} s per step): p95 ms per rate, knee = p95 doubles")
    table.add_column("path")
    for r in rates:
        table.add_column(f"{r}/s", justify="right")
    table.add_column("knee req/s", justify="right")
    for path in result.paths:
        cells = [_ms(s.p95_ms) + ("" if not s.failures else f" [red]({s.failures} failed)[/]") for s in path.steps]
        knee = f"{path.knee_rps:g}" if path.knee_rps is not None else f"> {rates[-1]}"
        table.add_row(path.name, *cells, knee)
    console.print(table)
    for path in result.paths:
        console.print(f"[dim]{path.name}: {path.knee_reason}[/dim]")
    for note in result.notes:
        if ": a failed request: " in note:     # what failed, beside the counts in the table
            console.print(f"note: {note}", highlight=False, markup=False)
    for t in result.ttft_at_knee:  # zgtool's streaming client at the knee (k6 cannot see TTFT)
        lim = " [yellow](client-limited)[/]" if t.client_limited else ""
        console.print(f"TTFT {t.path} at {t.rate_rps:g} req/s (Poisson): p50 {_ms(t.ttft_p50_ms)} / p95 "
                      f"{_ms(t.ttft_p95_ms)} ms, {t.ok}/{t.requests} ok{lim}")
