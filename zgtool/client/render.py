"""Rendering of an AskResult: a Rich view for the terminal and the JSON data for a result file."""

from __future__ import annotations

from typing import Any

from zgtool.client.client import AskResult
from zgtool.client.hints import LoadHint


def result_data(result: AskResult) -> dict[str, Any]:
    from zgtool.results import to_jsonable

    data = to_jsonable(result)
    data["num_attempts"] = len(result.attempts)
    data["total_wait_s"] = result.total_wait_s
    data["load_hint_util_pct"] = result.load_hint.util_pct if result.load_hint else None
    return data


def hint_text(hint: LoadHint | None) -> str:
    if hint is None:
        return "none reported"
    parts = [f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}"
             for name in ("sm_util", "kv_util", "running", "waiting", "vram_free_gb")
             if (value := getattr(hint, name)) is not None]
    return ", ".join(parts)


def render(result: AskResult, console: Any) -> None:
    """Attempts, waits, switches, the chosen model and the load hint."""
    from rich.table import Table

    table = Table(title="attempts", title_justify="left")
    for col in ("#", "model", "outcome", "status", "ms", "retried", "wait s", "reason"):
        table.add_column(col, overflow="fold")
    for a in result.attempts:
        table.add_row(str(a.number), a.model, a.outcome, str(a.status or "-"), f"{a.duration_ms:.1f}",
                      "yes" if a.retried else "no", f"{a.wait_s:.3f}" if a.retried else "-", a.reason)
    console.print(table)
    for sw in result.switches:
        console.print(f"[yellow]switch[/yellow] {sw.direction}: {sw.from_model} -> {sw.to_model} ({sw.reason})")
    served = f" (server: {result.served_model})" if result.served_model and result.served_model != result.model else ""
    console.print(f"model: [bold]{result.model}[/bold]{served}   total: {result.total_ms:.1f} ms, "
                  f"waited {result.total_wait_s:.3f} s over {len(result.attempts)} attempt(s)")
    console.print(f"load hint: {hint_text(result.load_hint)}")
    for name, b in result.rate_limits.buckets.items():
        console.print(f"rate limit {name}: {b.remaining}/{b.limit} remaining, reset {b.reset}")
    if result.request_id:
        console.print(f"request id: {result.request_id}")
