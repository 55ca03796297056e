"""SGLang's `meta_info` (native /generate answers; seconds)."""

from __future__ import annotations

from zgtool.latency.attribution.adapters.base import Evidence, Reject, number, optional
from zgtool.latency.attribution.adapters.units import S_TO_MS, SGLANG
from zgtool.latency.records import FROM_ARRIVAL, EngineTiming

SOURCE = SGLANG
SCALE_TO_MS = S_TO_MS


def _span_ms(mi: dict, start: str, end: str) -> float | None:
    if mi.get(start) is None or mi.get(end) is None:
        return None
    a, b = number(mi[start], start), number(mi[end], end)
    if b < a:
        raise Reject(f"{end} before {start}")
    return (b - a) * S_TO_MS


def read(ev: Evidence) -> EngineTiming | None:
    mi = ev.fields.get("meta_info")
    if not isinstance(mi, dict) or not ("e2e_latency" in mi or "queue_time" in mi):
        return None
    total = optional(mi, "e2e_latency", S_TO_MS)
    if total is None:
        raise Reject("e2e_latency missing")
    queue = optional(mi, "queue_time", S_TO_MS)
    ttft = _span_ms(mi, "request_received_ts", "prefill_finished_ts")
    decode = _span_ms(mi, "prefill_finished_ts", "decode_finished_ts")
    return EngineTiming(source=SOURCE, queue_ms=queue, decode_ms=decode, total_ms=total, ttft_ms=ttft,
                        ttft_start=FROM_ARRIVAL if ttft is not None else None, total_start=FROM_ARRIVAL)
