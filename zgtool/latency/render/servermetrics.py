"""What the servers' own metrics over the run say about the verdict (`--scrape`), as at most a line or two:
whether the engine queued (a difference between paths then may be queueing, not the gateway), and a KV cache
near full. Rendering only: the series come from zgtool.latency.schedule.scrapeloop."""

from __future__ import annotations

from typing import Any

from zgtool.latency.records import SplitResult

KV_NEAR_FULL = 0.9


def _tax(res: SplitResult | None) -> str | None:
    """'+4.1 ms' of the first candidate (outside the engine where measured, else in total), or None."""
    if res is None or len(res.targets) < 2:
        return None
    cand = res.targets[1].name
    diffs = {d.phase: d for d in res.differences if d.candidate == cand}
    for phase in ("outside_engine_ms", "total_ms"):
        d = diffs.get(phase)
        if d is not None and d.diff_ms is not None:
            return f"{d.diff_ms:+.2f} ms" if abs(d.diff_ms) < 10 else f"{d.diff_ms:+.1f} ms"
    return None


def verdict_lines(server_metrics: list[dict[str, Any]], res: SplitResult | None = None) -> list[str]:
    out = []
    tax = _tax(res)
    for src in server_metrics:
        who = src.get("engine") or src["url"]
        waiting = src.get("summary", {}).get("waiting")
        if waiting is not None:
            n = waiting["n"]
            if waiting["max"] <= 0:
                tail = f": the {tax} are not queueing in it" if tax else ""
                out.append(f"{who}'s waiting queue stayed at 0 at all {n} scrapes ({src['interval_s']:g} s apart){tail}")
            else:
                out.append(f"{who}'s waiting queue reached {waiting['max']:g} (mean {waiting['mean']:.1f} over {n} "
                           "scrapes): requests queued in the engine, so part of the latency is queueing")
        kv = src.get("summary", {}).get("kv_usage")
        if kv is not None and kv["max"] >= KV_NEAR_FULL:
            out.append(f"{who}'s KV cache reached {kv['max']:.0%} in use: near full (preemption, queueing)")
    return out
