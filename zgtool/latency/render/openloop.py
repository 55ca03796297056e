"""Terminal lines of an open-loop run: did the client keep its schedule, and latency from due time."""

from __future__ import annotations

from rich.console import Console

from zgtool.latency.records import SplitResult, TargetResult
from zgtool.stats import percentile


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _rps(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def target_lines(t: TargetResult) -> list[tuple[str, str]]:
    """(text, style) lines for one target; empty when it ran closed-loop."""
    o = t.open_loop
    if o is None:
        return []
    asked = f" (target {o.target_rate_rps:g})" if o.target_rate_rps is not None else ""
    cpu = f", client CPU {o.client_cpu_share:.0%} of a core" if o.client_cpu_share is not None else ""
    workers = (f", at most {o.in_flight_max} in flight ({o.workers_max} workers)"
               if o.workers_max is not None and o.in_flight_max is not None else "")
    out = [(f"  {t.name}: sent {_rps(o.achieved_rate_rps)} req/s of a {_rps(o.scheduled_rate_rps)} req/s "
            f"schedule{asked}; dispatch lag p50 {_ms(o.dispatch_lag_p50_ms)} / p99 {_ms(o.dispatch_lag_p99_ms)} "
            f"/ max {_ms(o.dispatch_lag_max_ms)} ms{cpu}{workers}", "")]
    ok = [s for s in t.samples if s.ok]
    for label, due_key, send_key in (("total", "total_from_scheduled_ms", "total_ms"),
                                     ("ttft", "ttft_from_scheduled_ms", "ttft_ms")):
        due = [v for s in ok if (v := getattr(s, due_key)) is not None]
        sent = [v for s in ok if (v := getattr(s, send_key)) is not None]
        if due and sent:
            out.append((f"    {label} from due time p50 {percentile(due, 50):.2f} / p99 {percentile(due, 99):.2f} ms; "
                        f"from actual send p50 {percentile(sent, 50):.2f} / p99 {percentile(sent, 99):.2f} ms", "dim"))
    if o.load_generator_behind:
        out.append((f"    LOAD GENERATOR BEHIND: {o.reason}. The figures from actual send flatter the path; "
                    f"trust those from due time", "bold yellow"))
    return out


def print_open_loop(res: SplitResult, console: Console) -> None:
    rows = [line for t in res.targets for line in target_lines(t)]
    if not rows:
        return
    first = next(t.open_loop for t in res.targets if t.open_loop is not None)
    console.print(f"Open loop ({first.arrivals} arrivals; lag limit {first.lag_limit_ms:.3g} ms):", highlight=False)
    for text, style in rows:
        console.print(text, style=style or None, highlight=False)
