"""vLLM's per-request `metrics` object (`--enable-per-request-metrics`): body, or the final usage chunk."""

from __future__ import annotations

from zgtool.latency.attribution.adapters.base import Evidence, Reject, optional
from zgtool.latency.attribution.adapters.units import VLLM
from zgtool.latency.records import FROM_SCHEDULING, EngineTiming

SOURCE = VLLM
SCALE_TO_MS = 1.0
_KEYS = ("queue_time_ms", "time_to_first_token_ms", "generation_time_ms", "mean_itl_ms")


def read(ev: Evidence) -> EngineTiming | None:
    m = ev.fields.get("metrics")
    if not isinstance(m, dict) or not any(k in m for k in _KEYS):
        return None                     # another API's "metrics", or vLLM without the flag
    if all(m.get(k) is None for k in _KEYS):
        raise Reject("metrics object empty")   # what vLLM attaches when the engine kept no stats
    queue = optional(m, "queue_time_ms", 1.0)
    ttft = optional(m, "time_to_first_token_ms", 1.0)
    gen = optional(m, "generation_time_ms", 1.0)
    for name, v in (("queue_time_ms", queue), ("time_to_first_token_ms", ttft), ("generation_time_ms", gen)):
        if v is None:
            raise Reject(f"{name} missing")
    assert queue is not None and ttft is not None and gen is not None
    itl = optional(m, "mean_itl_ms", 1.0)
    # queued -> scheduled -> first token -> last token: the three intervals tile the engine core's time
    return EngineTiming(source=SOURCE, queue_ms=queue, prefill_ms=ttft, decode_ms=gen, total_ms=queue + ttft + gen,
                        ttft_ms=ttft, ttft_start=FROM_SCHEDULING, total_start="from engine-core queueing",
                        info={"mean_itl_ms": itl} if itl is not None else {})
