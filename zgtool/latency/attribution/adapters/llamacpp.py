"""llama.cpp server's `timings` (the body, or the final stream chunk)."""

from __future__ import annotations

from zgtool.latency.attribution.adapters.base import Evidence, Reject, optional
from zgtool.latency.attribution.adapters.units import LLAMACPP
from zgtool.latency.records import EngineTiming

SOURCE = LLAMACPP
SCALE_TO_MS = 1.0


def read(ev: Evidence) -> EngineTiming | None:
    t = ev.fields.get("timings")
    if not isinstance(t, dict) or not ("prompt_ms" in t or "predicted_ms" in t):
        return None
    prompt = optional(t, "prompt_ms", 1.0)
    predicted = optional(t, "predicted_ms", 1.0)
    if prompt is None or predicted is None:
        raise Reject(f"{'prompt_ms' if prompt is None else 'predicted_ms'} missing")
    cache = optional(t, "cache_n", 1.0)
    # the slot's own time: the wait for a free slot is not reported, so this total is a lower bound
    return EngineTiming(source=SOURCE, prefill_ms=prompt, decode_ms=predicted, total_ms=prompt + predicted,
                        total_start="from prompt processing (slot wait not reported)",
                        info={"cache_n": cache} if cache is not None else {})
