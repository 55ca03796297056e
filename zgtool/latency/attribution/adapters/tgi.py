"""Text Generation Inference's timing headers (non-streaming answers only)."""

from __future__ import annotations

from zgtool.latency.attribution.adapters.base import Evidence, Reject, number
from zgtool.latency.attribution.adapters.units import S_TO_MS, TGI
from zgtool.latency.records import FROM_ARRIVAL, EngineTiming

SOURCE = TGI
SCALE_TO_MS = 1.0
# the ms headers are truncated integers; x-compute-time is the same total as a float in seconds
_AGREE_MS = 1.5


def _ms(ev: Evidence, name: str, scale: float = 1.0) -> float | None:
    v = ev.header(name)
    return None if v is None else number(v, name) * scale


def read(ev: Evidence) -> EngineTiming | None:
    if ev.header("x-inference-time") is None and ev.header("x-queue-time") is None:
        return None                    # x-compute-time alone is any Hugging Face endpoint, not TGI's split
    queue = _ms(ev, "x-queue-time")
    inference = _ms(ev, "x-inference-time")
    validation = _ms(ev, "x-validation-time")
    total_int = _ms(ev, "x-total-time")
    total_s = _ms(ev, "x-compute-time", S_TO_MS)
    if total_s is not None and total_int is not None and abs(total_s - total_int) > _AGREE_MS:
        raise Reject("x-compute-time (s) and x-total-time (ms) disagree (unit?)")
    total = total_s if total_s is not None else total_int
    if total is None:
        raise Reject("x-total-time missing")
    other = {k: v for k, v in (("validation", validation), ("inference", inference)) if v is not None}
    return EngineTiming(source=SOURCE, queue_ms=queue, total_ms=total, total_start=FROM_ARRIVAL, other_ms=other)
