"""Ollama's `*_duration` fields (nanoseconds; the body, or the final chunk with done: true)."""

from __future__ import annotations

from zgtool.latency.attribution.adapters.base import Evidence, Reject, optional
from zgtool.latency.attribution.adapters.units import NS_TO_MS, OLLAMA
from zgtool.latency.records import FROM_ARRIVAL, EngineTiming

SOURCE = OLLAMA
SCALE_TO_MS = NS_TO_MS


def read(ev: Evidence) -> EngineTiming | None:
    f = ev.fields
    if "total_duration" not in f and "eval_duration" not in f:
        return None
    total = optional(f, "total_duration", NS_TO_MS)
    if total is None:
        raise Reject("total_duration missing")
    load = optional(f, "load_duration", NS_TO_MS)
    return EngineTiming(source=SOURCE, prefill_ms=optional(f, "prompt_eval_duration", NS_TO_MS),
                        decode_ms=optional(f, "eval_duration", NS_TO_MS), total_ms=total, total_start=FROM_ARRIVAL,
                        other_ms={"load": load} if load is not None else {})
